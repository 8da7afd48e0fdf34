"""`nxd-train generate`: greedy tokens equal transformers' `generate` on the exported model (same weights) for
Llama-, Pythia- and Mixtral-shaped models, at one and two tensor-parallel processes; the key/value cache and
recompute give the same tokens; a seed repeats its samples; NeoX's JSON lines; bad input in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from nxd_train.cli import default_config_path, main
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.train.test_neox_runs import corpus  # noqa: F401  (a fixture)
from tests.training_runs import FAST, run_command

VARIED = ["model.init_method_std=0.5", "model.optim.lr=0.0"]
"""Wide random weights and no update: greedy continuations that vary from token to token."""
SHAPES = {
    "llama": [],
    "pythia": [
        "+model.transformer_block_type=gpt_neox",
        "model.rotary_percentage=0.25",
        "model.normalization=layernorm",
        "model.activation=gelu",
        "model.has_bias=True",
        "model.num_kv_heads=4",
        "model.ffn_hidden_size=256",
    ],
    "mixtral": [
        "+model.moe.num_experts=4",
        "+model.moe.top_k=2",
        "+model.moe.dropless=True",
        "+model.moe.capacity_factor=0.0",
        "+model.moe.normalize_top_k_affinities=True",
    ],
}
PROMPTS = "def main(\nimport os\nclass Foo(object):\n    return"


def _train(log_dir: Path, *overrides: str) -> None:
    assert (
        main(
            [
                str(default_config_path()),
                *FAST,
                *VARIED,
                "trainer.max_steps=1",
                "data.global_batch_size=4",
                "exp_manager.create_checkpoint_callback=True",
                f"+exp_manager.explicit_log_dir={log_dir}",
                *overrides,
            ]
        )
        == 0
    )


def _hf_greedy(export: Path, prompts: list[str], tokens: int) -> list[str]:
    model = AutoModelForCausalLM.from_pretrained(export).eval()
    tokenizer = AutoTokenizer.from_pretrained(export)
    texts = []
    for prompt in prompts:
        ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
        out = model.generate(ids, max_new_tokens=tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
        texts.append(tokenizer.decode(out[0, ids.shape[1] :]))
    return texts


def _generated(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _generate_here(log_dir: Path, tmp_path: Path, out: str, *overrides: str) -> list[dict]:
    (tmp_path / "prompts.txt").write_text(PROMPTS)
    code = main(
        [
            "generate",
            str(default_config_path()),
            *VARIED,
            f"+exp_manager.explicit_log_dir={log_dir}",
            "+generate.text_gen_type=input-file",
            f"+generate.sample_input_file={tmp_path / 'prompts.txt'}",
            f"+generate.sample_output_file={tmp_path / out}",
            "+generate.maximum_tokens=24",
            *overrides,
        ]
    )
    assert code == 0
    return _generated(tmp_path / out)


@pytest.mark.parametrize(
    "shape", ["llama", pytest.param("pythia", marks=pytest.mark.slow), pytest.param("mixtral", marks=pytest.mark.slow)]
)
def test_greedy_tokens_equal_transformers_generate_on_the_export(tmp_path, shape):
    log_dir = tmp_path / "run"
    _train(log_dir, *SHAPES[shape])
    records = _generate_here(log_dir, tmp_path, "cached.jsonl", *SHAPES[shape], "+generate.batch_size=3")
    assert main(["ckpt", "export-hf", str(log_dir), str(tmp_path / "hf")]) == 0
    prompts = [r["context"] for r in records]
    assert prompts == [p.strip() for p in PROMPTS.split("\n")]
    expected = _hf_greedy(tmp_path / "hf", prompts, 24)
    assert [r["text"] for r in records] == expected
    assert len(set("".join(expected))) > 5  # the continuations vary: the comparison can fail
    assert all(r["length"] == 24 and r["finished"] is False and r["message"] is None for r in records)
    recomputed = _generate_here(log_dir, tmp_path, "recomputed.jsonl", *SHAPES[shape], "+generate.recompute=True")
    assert [r["text"] for r in recomputed] == expected


def test_a_seed_repeats_its_samples_and_logits_come_back(tmp_path):
    log_dir = tmp_path / "run"
    _train(log_dir)
    sampled = [
        "+generate.temperature=0.9",
        "+generate.top_k=40",
        "+generate.top_p=0.95",
        "+generate.num_samples=3",
        "+generate.maximum_tokens=16",
        "+generate.return_logits=True",
    ]
    runs = []
    for name in ("a.jsonl", "b.jsonl"):
        assert (
            main(
                [
                    "generate",
                    str(default_config_path()),
                    *VARIED,
                    f"+exp_manager.explicit_log_dir={log_dir}",
                    *sampled,
                    f"+generate.sample_output_file={tmp_path / name}",
                ]
            )
            == 0
        )
        runs.append(_generated(tmp_path / name))
    assert runs[0] == [{**r, "duration_seconds": a["duration_seconds"]} for r, a in zip(runs[1], runs[0], strict=True)]
    assert len({r["text"] for r in runs[0]}) > 1  # samples, not one greedy answer
    record = runs[0][0]
    assert record["context"] == "" and len(record["logits"]) == record["length"] + record["finished"]
    kept = [sum(1 for v in row if v is not None) for row in record["logits"]]  # a filtered token's -inf: null
    assert max(kept) <= 40  # top_k filtered
    assert (
        main(
            [
                "generate",
                str(default_config_path()),
                f"+exp_manager.explicit_log_dir={log_dir}",
                f"+generate.sample_output_file={tmp_path / 'a.jsonl'}",
            ]
        )
        == 1
    )  # never written over


@pytest.mark.parametrize(
    "shape", ["pythia", pytest.param("llama", marks=pytest.mark.slow), pytest.param("mixtral", marks=pytest.mark.slow)]
)
def test_two_tensor_parallel_processes_generate_what_transformers_does(tmp_path, shape):
    """Sampled at tensor parallel 2 (two processes, heads and vocabulary split; the checkpoint, saved at tensor
    parallel 1, resharded as it loads): the greedy tokens of transformers' generate on the export."""
    log_dir, layout = tmp_path / "run", ["distributed_strategy.tensor_model_parallel_size=2", "trainer.devices=2"]
    _train(log_dir, *SHAPES[shape])
    (tmp_path / "prompts.txt").write_text(PROMPTS)
    result = run_command(
        "generate",
        str(default_config_path()),
        *VARIED,
        *SHAPES[shape],
        *layout,
        f"+exp_manager.explicit_log_dir={log_dir}",
        "+generate.text_gen_type=input-file",
        f"+generate.sample_input_file={tmp_path / 'prompts.txt'}",
        "+generate.maximum_tokens=24",
        "+generate.batch_size=2",
        f"+generate.sample_output_file={tmp_path / 'two.jsonl'}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "notice: inference runs" not in result.stderr  # TP2 is kept
    records = _generated(tmp_path / "two.jsonl")
    assert main(["ckpt", "export-hf", str(log_dir), str(tmp_path / "hf")]) == 0
    expected = _hf_greedy(tmp_path / "hf", [r["context"] for r in records], 24)
    assert [r["text"] for r in records] == expected and len(set("".join(expected))) > 5


def test_bad_input_gets_one_line(tmp_path, capsys):
    config = str(default_config_path())
    assert (
        main(
            [
                "generate",
                config,
                f"+exp_manager.explicit_log_dir={tmp_path / 'none'}",
                "+generate.sample_output_file=null",
            ]
        )
        == 1
    )
    assert "no checkpoint to load" in capsys.readouterr().err
    assert (
        main(
            [
                "generate",
                config,
                "+generate.text_gen_type=input-file",
                f"+generate.sample_input_file={tmp_path / 'missing.txt'}",
            ]
        )
        == 1
    )
    assert "generate.sample_input_file: expected a UTF-8 text file of prompts, found no file" in capsys.readouterr().err
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00abc")
    assert (
        main(
            [
                "generate",
                config,
                "+generate.text_gen_type=input-file",
                f"+generate.sample_input_file={tmp_path / 'binary.txt'}",
            ]
        )
        == 1
    )
    assert "found a file that is not UTF-8 text" in capsys.readouterr().err
    assert main(["generate", config, f"+generate.sample_output_file={tmp_path / 'no' / 'such' / 'o.jsonl'}"]) == 1
    assert "expected a file in an existing folder, found no folder" in capsys.readouterr().err
    log_dir = tmp_path / "run"
    _train(log_dir)
    capsys.readouterr()
    (tmp_path / "long.txt").write_text("x " * 200 + "\nimport os\n")
    assert (
        main(
            [
                "generate",
                config,
                f"+exp_manager.explicit_log_dir={log_dir}",
                "+generate.text_gen_type=input-file",
                f"+generate.sample_input_file={tmp_path / 'long.txt'}",
                "+generate.num_samples=3",
                f"+generate.sample_output_file={tmp_path / 'o.jsonl'}",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "notice: generate.num_samples: text_gen_type input-file does not read it" in err
    assert "1 prompt(s) longer than the context" in err and "Traceback" not in err
    long, short = _generated(tmp_path / "o.jsonl")
    assert long["text"] is None and "leave no room in the model's context of 64 positions" in long["message"]
    assert short["context"] == "import os" and short["length"] > 0


TEXT_GENERATION = """# Parameters used for text generation (GPT-NeoX's configs/text_generation.yml)
# Make sure `load` is specified somewhere else
{
  "text_gen_type": "unconditional",
  "maximum_tokens": 12,
  "prompt_end": "\\n",
  "temperature": 1.0,
  "top_p": 0.0,
  "top_k": 0,
  "recompute": false,
  "num_samples": 3,
  "sample_input_file": "sample_input.txt",
  "sample_output_file": "sample_output.txt",
}
"""


def _read_until(master: int, wanted: str, seen: str, timeout: float = 120) -> str:
    """What the terminal showed until `wanted` appeared (an AssertionError with all of it otherwise)."""
    import os
    import select
    import time

    deadline = time.monotonic() + timeout
    while wanted not in seen:
        ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"no {wanted!r} on the terminal; it showed:\n{seen}"
        try:
            seen += os.read(master, 4096).decode(errors="replace")
        except OSError:  # the process closed the terminal
            break
    assert wanted in seen, seen
    return seen


@pytest.mark.slow
def test_a_neox_pair_generates_in_all_three_modes(
    tmp_path,
    corpus,  # noqa: F811
    tokenizer_file,
    gpt2_files,  # noqa: F811
    sentencepiece_dir,
):
    """pythia.yml + local_setup.yml + text_generation.yml, as NeoX users run generate.py: unconditional samples,
    an input file's prompts, and prompts typed on a terminal (a pseudo-terminal here)."""
    from tests.train.test_neox_runs import NEOX
    from tests.train.test_neox_runs import _train as train_neox

    setup, _ = train_neox("pythia", tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir)
    textgen = tmp_path / "text_generation.yml"
    textgen.write_text(TEXT_GENERATION)
    files = [str(NEOX / "pythia.yml"), str(setup), str(textgen)]
    result = run_command("generate", *files, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    samples = _generated(tmp_path / "sample_output.txt")
    assert len(samples) == 3 and all(r["context"] == "" and 0 < r["length"] + r["finished"] <= 12 for r in samples)
    assert "gathered out of the training layout's data 2" in result.stderr  # pythia.yml trains on 2 processes
    (tmp_path / "sample_input.txt").write_text("def main(\nimport os\n\nclass Foo\n")
    result = run_command(
        "generate", *files, "text_gen_type=input-file", "sample_output_file=from_file.jsonl", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["context"] for r in _generated(tmp_path / "from_file.jsonl")] == ["def main(", "import os", "class Foo"]
    _interactive_session(tmp_path, "generate", *files, "text_gen_type=interactive", "temperature=0.0")


def _interactive_session(cwd: Path, *args: str) -> str:
    """nxd-train on a pseudo-terminal: one prompt typed, its answer read, then Ctrl-D; what the terminal showed."""
    import os
    import subprocess
    import sys

    master, terminal = os.openpty()
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("nxd-train")), *args],
        cwd=cwd,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    try:
        seen = _read_until(master, "Context prompt >>> ", "")
        os.write(master, b"def main(\n")
        seen = _read_until(master, "Generated Text: ", seen)
        seen = _read_until(master, "Context prompt >>> ", seen)
        os.write(master, b"\x04")  # end of input (Ctrl-D)
        assert process.wait(timeout=60) == 0, seen
    finally:
        process.kill()
        os.close(master)
    assert "Traceback" not in seen
    return seen


def test_interactive_prompts_on_a_terminal(tmp_path):
    log_dir = tmp_path / "run"
    _train(log_dir)
    seen = _interactive_session(
        tmp_path,
        "generate",
        str(default_config_path()),
        *VARIED,
        f"+exp_manager.explicit_log_dir={log_dir}",
        "+generate.text_gen_type=interactive",
        "+generate.maximum_tokens=8",
    )
    answer = seen.split("Generated Text: ")[1].split("Context prompt")[0].strip()
    assert answer and not (tmp_path / "samples.txt").exists()  # interactive answers go to the terminal only


PEAK = """import resource, subprocess, sys, time
started = time.monotonic()
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(done.returncode, time.monotonic() - started, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""
"""Runs a command; prints its exit code, seconds and peak resident bytes (the only child of this process)."""


def test_a_30_mb_prompt_is_judged_by_its_first_bytes_alone(tmp_path):
    """A prompt longer in bytes than 2 x context x the longest token's bytes is tokenised only that far: its message
    comes without the rest read, and the run takes the time and memory of one without it."""
    import subprocess
    import sys

    log_dir = tmp_path / "run"
    _train(log_dir)
    figures = {}
    line = "x = 1; " * 4_300_000
    for name, text in (("plain", "def main(\nimport os\n"), ("huge", f"def main(\n{line}\n")):
        (tmp_path / f"{name}.txt").write_text(text)
        command = [
            sys.executable,
            "-m",
            "nxd_train",
            "generate",
            str(default_config_path()),
            f"+exp_manager.explicit_log_dir={log_dir}",
            "+generate.text_gen_type=input-file",
            f"+generate.sample_input_file={tmp_path / name}.txt",
            "+generate.maximum_tokens=4",
            f"+generate.sample_output_file={tmp_path / name}.jsonl",
        ]
        out = subprocess.run([sys.executable, "-c", PEAK, *command], capture_output=True, text=True, timeout=600)
        code, seconds, peak = out.stdout.split()
        assert code == "0", out.stderr
        figures[name] = float(seconds), int(peak)
    records = _generated(tmp_path / "huge.jsonl")
    assert [record["text"] is None for record in records] == [False, True]
    assert records[1]["message"].startswith(f"WARNING: the prompt's {len(line.strip()):,} bytes (its first ")
    assert records[1]["message"].endswith(
        "tokens) leave no room in the model's context of 64 positions; expected at most 63 tokens"
    )
    assert figures["huge"][0] < figures["plain"][0] + 10, figures
    assert figures["huge"][1] < figures["plain"][1] + 400 * 2**20, figures  # the prompt's text, held a few times
