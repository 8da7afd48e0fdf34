"""What QEfficient fine-tuning tests train on, written by the tests (no download): a tiny Llama folder as
a hub model repository holds one, dataset folders laid out like the hub repositories the reference's
examples name (alpaca-cleaned: one train split; samsum: train and test; gsm8k: a `main` configuration
declared in its README, as on the hub; a grammar set with one split; DiSC with categories; wikitext), and
QEfficient's example config files (configs/qeff/, kept as QEfficient wrote them)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import yaml
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parent
EXAMPLES = ROOT.parent / "configs" / "qeff"
REFERENCE_EXAMPLES = ROOT / "config" / "data" / "qeff" / "reference_examples.yaml"
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
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
]
GSM8K_README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train.jsonl
  - split: test
    path: main/test.jsonl
---
"""


def phrase(i: int, n: int = 5) -> str:
    return " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(n))


def tiny_model(directory: Path, tokenizer_dir: Path) -> Path:
    """A 2-layer Llama directory with the test tokenizer (BOS <s> = 1, EOS <|endoftext|> = 0), as `ckpt export-hf`
    writes one."""
    config = LlamaConfig(
        vocab_size=320,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, directory / name)
    return directory


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def hub_datasets(root: Path) -> dict[str, Path]:
    """The dataset folders, by the reference's dataset names."""
    out = {}
    alpaca = [
        {
            "instruction": f"say {phrase(i, 3)}",
            "input": "" if i % 3 == 0 else phrase(i + 1, 4),
            "output": phrase(i + 2, 6),
        }
        for i in range(24)
    ]
    _jsonl(root / "alpaca-cleaned" / "train.jsonl", alpaca)
    out["yahma/alpaca-cleaned"] = root / "alpaca-cleaned"
    samsum = [
        {"id": str(i), "dialogue": f"A: {phrase(i)}\nB: {phrase(i + 1)}", "summary": phrase(i + 2, 4)}
        for i in range(30)
    ]
    _jsonl(root / "samsum" / "train.jsonl", samsum[:24])
    _jsonl(root / "samsum" / "test.jsonl", samsum[24:])
    out["knkarthick/samsum"] = root / "samsum"
    gsm = [
        {"question": f"how many {phrase(i, 3)}", "answer": f"{phrase(i + 1, 3)} <<{i}+1={i + 1}>>\n#### {i + 1}"}
        for i in range(30)
    ]
    _jsonl(root / "gsm8k" / "main" / "train.jsonl", gsm[:24])
    _jsonl(root / "gsm8k" / "main" / "test.jsonl", gsm[24:])
    (root / "gsm8k" / "README.md").write_text(GSM8K_README)
    out["openai/gsm8k"] = root / "gsm8k"
    grammar = [{"input": f"{phrase(i, 4)} {i}", "target": f"{phrase(i, 5)} {i}"} for i in range(30)]
    _jsonl(root / "grammar" / "train.jsonl", grammar)
    out["grammar"] = root / "grammar"
    disc = [
        {"original": phrase(i), "generation": phrase(i + 3), "category": ["sarcasm_more", "formal"][i % 2]}
        for i in range(40)
    ]
    _jsonl(root / "DiSC" / "train.jsonl", disc)
    out["hallisky/DiSC"] = root / "DiSC"
    text = [{"text": phrase(i, 8)} for i in range(40)] + [{"text": ""}]
    readme = GSM8K_README.replace("main", "wikitext-103-raw-v1")
    _jsonl(root / "wikitext" / "wikitext-103-raw-v1" / "train.jsonl", text[:32])
    _jsonl(root / "wikitext" / "wikitext-103-raw-v1" / "test.jsonl", text[32:])
    (root / "wikitext" / "README.md").write_text(readme)
    out["Salesforce/wikitext"] = root / "wikitext"
    return out


def local_config(
    source: Path, out: Path, model: Path, datasets: dict[str, Path], output_dir: Path, **sections: dict
) -> Path:
    """`source` (a QEfficient config) with its hub names pointed at the local folders, its output in
    `output_dir`, and `sections` merged over it; written to `out`."""
    config = yaml.safe_load(source.read_text())
    config["model"]["model_name"] = str(model)
    if "tokenizer_name" in config.get("dataset", {}):
        config["dataset"]["tokenizer_name"] = str(model)
    name = config["dataset"].get("dataset_name")
    if name in datasets:
        config["dataset"]["dataset_name"] = str(datasets[name])
    config.setdefault("training", {})["output_dir"] = str(output_dir)
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    return out
