"""Train every config file of a GPT-NeoX checkout's configs/ folder shrunk, or show that nxd refuses it by name.

    uv run python -m tests.integration.neox_config_sweep /path/to/gpt-neox/configs [--only NAME ...]

Each file trains as NeoX users run it: with its companion files (a model-only file with llama/train_config.yml,
a second-file-style file after bf16_125M.yml) and a local_setup-style file written here, naming data
preprocessed here with the file's own tokenizer kind (a BPE and a SentencePiece model trained on local text:
nothing is downloaded), in two gloo processes, 2 layers of width 64 (4 for two pipeline stages), 3
iterations. A file refused only for fp16 is tried once more with bf16 in its place, to show the rest of it
trains. Prints one line per file; not part of the test suite (it needs NeoX's configs).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from nxd_config.neox.files import canonical, read_file

COMPANIONS = {
    "llama/": "llama/train_config.yml",
    "llama2/": "llama/train_config.yml",
    "mistral/": "llama/train_config.yml",
}
"""Model-only files and the training file NeoX's README pairs them with."""
SECOND_FILES = (
    "local_setup.yml",
    "local_setup_comet.yml",
    "local_setup_wandb.yml",
    "slurm_local.yml",
    "slurm_local.json",
    "eleutherai_cluster.yml",
    "docker/pythia-paths.yml",
    "cpu_mock_config.yml",
    "prof.yml",
    "text_generation.yml",
    "sparse.yml",
)
"""Files that complete a model file (paths, logging, profiling, generation): run after bf16_125M.yml."""
BASE = "bf16_125M.yml"
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "pack",
    "my",
    "box",
    "with",
    "five",
    "dozen",
    "liquor",
    "jugs",
    "how",
    "vexingly",
    "quick",
    "daft",
    "zebras",
    "jump",
    "sphinx",
    "of",
    "black",
    "quartz",
    "judge",
    "my",
    "vow",
]


def tokenizers(directory: Path) -> dict[str, dict[str, str]]:
    """Local tokenizer files of each NeoX tokenizer kind: vocab/merges, a tokenizer.json, a SentencePiece model
    named as Mistral's download is."""
    import sentencepiece
    from tokenizers import ByteLevelBPETokenizer

    text = [" ".join(random.Random(i).choices(WORDS, k=12)) for i in range(400)]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(text, vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False)
    vocab, merges = bpe.save_model(str(directory))
    bpe.save(str(directory / "tokenizer.json"))
    (directory / "spm").mkdir()
    (directory / "text.txt").write_text("\n".join(text))
    sentencepiece.SentencePieceTrainer.train(
        input=str(directory / "text.txt"),
        model_prefix=str(directory / "spm" / "mistral-7B-v0.1"),
        vocab_size=400,
        model_type="bpe",
        byte_fallback=True,
        minloglevel=2,
    )
    return {
        "GPT2BPETokenizer": {"vocab_file": vocab, "merge_file": merges},
        "HFTokenizer": {"vocab_file": str(directory / "tokenizer.json")},
        "SPMTokenizer": {"vocab_file": str(directory / "spm" / "mistral-7B-v0.1.model")},
    }


def preprocess(directory: Path, kind: str, files: dict[str, str]) -> str:
    corpus = directory / "docs.jsonl"
    if not corpus.exists():
        corpus.write_text(
            "".join(json.dumps({"text": " ".join(random.Random(i).choices(WORDS, k=40))}) + "\n" for i in range(300))
        )
    prefix = directory / f"data_{kind}"
    if kind == "GPT2BPETokenizer":
        flags = ["--tokenizer-type", kind, "--vocab-file", files["vocab_file"], "--merge-file", files["merge_file"]]
    else:
        flags = ["--tokenizer", files["vocab_file"]]
    if not Path(f"{prefix}_text_document.bin").exists():
        subprocess.run(
            [
                _nxd_train(),
                "data",
                "preprocess",
                "--input",
                str(corpus),
                "--output-prefix",
                str(prefix),
                *flags,
                "--append-eod",
                "--no-progress",
            ],
            check=True,
            capture_output=True,
        )
    return f"{prefix}_text_document"


def _nxd_train() -> str:
    return str(Path(sys.executable).with_name("nxd-train"))


def shrink(merged: dict) -> list[str]:
    """Overrides that make a merged NeoX run small: 2 processes, 2 layers of width 64 (4 for pipeline stages)."""
    tp = min(merged.get("model_parallel_size") or 1, 2)
    pp = min(max(merged.get("pipe_parallel_size") or 0, 1), 2 if tp == 1 else 1)
    out = [
        f"{'' if key in merged else '+'}{key}={value}"
        for key, value in (
            ("num_layers", 4 if pp > 1 else 2),
            ("hidden_size", 64),
            ("num_attention_heads", 4),
            ("seq_length", 64),
            ("max_position_embeddings", 64),
            ("train_iters", 3),
            ("num_gpus", 2),
            ("num_workers", 0),
            ("model_parallel_size", tp),
            ("pipe_parallel_size", pp),
            ("eval_interval", 2),
            ("eval_iters", 1),
            ("log_interval", 1),
            ("train_micro_batch_size_per_gpu", 2),
            ("gradient_accumulation_steps", 2),
            ("split", "'90,5,5'"),
        )
    ]
    for key, value in (
        ("num_kv_heads", 2),
        ("lr_decay_iters", 3),
        ("sliding_window_width", 31),
        ("intermediate_size", 192),
    ):  # 192: a gated MLP of 128 outputs over 64 inputs, as NeoX rounds
        if merged.get(key) is not None:
            out.append(f"{key}={value}")
    if "train_batch_size" in merged:
        out.append("~train_batch_size")
    if isinstance(merged.get("attention_config"), list):  # the same pattern over the shrunk layer count
        pattern = merged["attention_config"][0][0] if isinstance(merged["attention_config"][0], list) else ["global"]
        out.append(f"attention_config=[[{json.dumps(pattern)},'all']]".replace(" ", ""))
    return out


def run(root: Path, name: str, work: Path, tokens: dict) -> str:
    names = [COMPANIONS[prefix] for prefix in COMPANIONS if name.startswith(prefix) and COMPANIONS[prefix] != name]
    files = [BASE, name] if name in SECOND_FILES else [name, *names]
    merged = {}
    for file in files:
        merged.update({canonical(key): value for key, value in read_file(root / file).items()})
    kind = merged.get("tokenizer_type", "GPT2BPETokenizer")
    run_dir = work / name.replace("/", "_")
    local_files = dict(tokens.get(kind, {}))
    if kind in tokens:
        prefix = preprocess(work, kind, tokens[kind])
        splits = [split for split in ("train", "valid", "test") if f"{split}_data_paths" in merged]
        for split in splits:  # one local data set in place of each of the file's
            local_files[f"{split}_data_paths"] = [prefix]
            if f"{split}_data_weights" in merged:
                local_files[f"{split}_data_weights"] = [1.0]
        if not splits:
            local_files["data_path"] = prefix
    local_files.update(save=str(run_dir), load=str(run_dir))
    if "checkpoint_factor" not in merged and "extra_save_iters" not in merged:
        local_files["checkpoint_factor"] = 1000
    setup = {key: value for key, value in local_files.items() if key not in merged}
    local = work / f"setup_{name.replace('/', '_')}.yml"
    local.write_text(json.dumps(setup))
    # the file's own paths (its cluster's data, tokenizer and checkpoint folders) point at the local ones
    overrides = shrink(merged) + [f"{key}={json.dumps(value)}" for key, value in local_files.items() if key in merged]
    paths = [str(root / file) for file in files] + [str(local)]
    status, problems = _train(paths, overrides, work)
    if problems and all(problem.startswith("fp16:") for problem in problems):
        again, _ = _train(paths, [*overrides, "fp16.enabled=False", "+bf16={enabled: true}"], work)
        status += f"; with bf16 in place of fp16: {again}"
    return status


def _train(files: list[str], overrides: list[str], work: Path) -> tuple[str, list[str]]:
    """The outcome in words, and the problems a refusal names (key: message)."""
    result = subprocess.run([_nxd_train(), *files, *overrides], cwd=work, capture_output=True, text=True, timeout=900)
    if result.returncode == 0:
        return "trains (3 steps, 2 processes)", []
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("notice:")]
    if any("Traceback" in line for line in lines):
        return "CRASH: " + " | ".join(lines[-3:]), []
    problems = [
        line.strip().rsplit(".yml: ", 1)[-1].rsplit(".json: ", 1)[-1]
        for line in lines
        if ": " in line and "cannot train this config" not in line and "problems in the config" not in line
    ]
    return "refused: " + " | ".join(problems[:4]), problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", type=Path, help="GPT-NeoX's configs/ folder")
    parser.add_argument("--only", nargs="*", default=None, help="these files (relative to configs/)")
    args = parser.parse_args()
    names = sorted(
        str(path.relative_to(args.configs))
        for path in args.configs.rglob("*")
        if path.suffix in (".yml", ".json") and path.is_file()
    )
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(temporary)
        tokens = tokenizers(work)
        for name in args.only or names:
            print(f"{name}: {run(args.configs, name, work, tokens)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
