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

from tests.training_runs import FAST, run_command

VARIED = ["model.init_method_std=0.5", "model.optim.lr=0.0"]
"""Wide random weights and no update: greedy continuations that vary from token to token."""
SHAPES = {
    "llama": [],
    "pythia": ["+model.transformer_block_type=gpt_neox", "model.rotary_percentage=0.25",
               "model.normalization=layernorm", "model.activation=gelu", "model.has_bias=True",
               "model.num_kv_heads=4", "model.ffn_hidden_size=256"],
    "mixtral": ["+model.moe.num_experts=4", "+model.moe.top_k=2", "+model.moe.dropless=True",
                "+model.moe.capacity_factor=0.0", "+model.moe.normalize_top_k_affinities=True"],
}  # fmt: skip
PROMPTS = "def main(\nimport os\nclass Foo(object):\n    return"


def _train(log_dir: Path, *overrides: str) -> None:
    assert main([str(default_config_path()), *FAST, *VARIED, "trainer.max_steps=1", "data.global_batch_size=4",
                 "exp_manager.create_checkpoint_callback=True", f"+exp_manager.explicit_log_dir={log_dir}",
                 *overrides]) == 0  # fmt: skip


def _hf_greedy(export: Path, prompts: list[str], tokens: int) -> list[str]:
    model = AutoModelForCausalLM.from_pretrained(export).eval()
    tokenizer = AutoTokenizer.from_pretrained(export)
    texts = []
    for prompt in prompts:
        ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
        out = model.generate(ids, max_new_tokens=tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
        texts.append(tokenizer.decode(out[0, ids.shape[1]:]))
    return texts


def _generated(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _generate_here(log_dir: Path, tmp_path: Path, out: str, *overrides: str) -> list[dict]:
    (tmp_path / "prompts.txt").write_text(PROMPTS)
    code = main(["generate", str(default_config_path()), *VARIED, f"+exp_manager.explicit_log_dir={log_dir}",
                 "+generate.text_gen_type=input-file", f"+generate.sample_input_file={tmp_path / 'prompts.txt'}",
                 f"+generate.sample_output_file={tmp_path / out}", "+generate.maximum_tokens=24", *overrides])
    assert code == 0
    return _generated(tmp_path / out)


@pytest.mark.parametrize("shape", ["llama", pytest.param("pythia", marks=pytest.mark.slow),
                                   pytest.param("mixtral", marks=pytest.mark.slow)])  # fmt: skip
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
    sampled = ["+generate.temperature=0.9", "+generate.top_k=40", "+generate.top_p=0.95", "+generate.num_samples=3",
               "+generate.maximum_tokens=16", "+generate.return_logits=True"]  # fmt: skip
    runs = []
    for name in ("a.jsonl", "b.jsonl"):
        assert main(["generate", str(default_config_path()), *VARIED, f"+exp_manager.explicit_log_dir={log_dir}",
                     *sampled, f"+generate.sample_output_file={tmp_path / name}"]) == 0  # fmt: skip
        runs.append(_generated(tmp_path / name))
    assert runs[0] == [{**r, "duration_seconds": a["duration_seconds"]} for r, a in zip(runs[1], runs[0], strict=True)]
    assert len({r["text"] for r in runs[0]}) > 1  # samples, not one greedy answer
    record = runs[0][0]
    assert record["context"] == "" and len(record["logits"]) == record["length"] + record["finished"]
    finite = [sum(1 for v in row if v != float("-inf")) for row in record["logits"]]
    assert max(finite) <= 40  # top_k filtered
    assert main(["generate", str(default_config_path()), f"+exp_manager.explicit_log_dir={log_dir}",
                 f"+generate.sample_output_file={tmp_path / 'a.jsonl'}"]) == 1  # never written over


def test_two_tensor_parallel_processes_generate_what_one_does(tmp_path):
    log_dir = tmp_path / "run"
    trained = run_command(str(default_config_path()), *FAST, *VARIED, *SHAPES["pythia"], "trainer.max_steps=1",
                          "data.global_batch_size=4", "exp_manager.create_checkpoint_callback=True",
                          f"+exp_manager.explicit_log_dir={log_dir}", "trainer.devices=2",
                          "distributed_strategy.tensor_model_parallel_size=2", cwd=tmp_path)  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    one = _generate_here(log_dir, tmp_path, "one.jsonl", *SHAPES["pythia"])
    (tmp_path / "prompts.txt").write_text(PROMPTS)
    result = run_command("generate", str(default_config_path()), *VARIED, *SHAPES["pythia"],
                         "distributed_strategy.tensor_model_parallel_size=2", "trainer.devices=2",
                         f"+exp_manager.explicit_log_dir={log_dir}", "+generate.text_gen_type=input-file",
                         f"+generate.sample_input_file={tmp_path / 'prompts.txt'}", "+generate.maximum_tokens=24",
                         f"+generate.sample_output_file={tmp_path / 'two.jsonl'}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert [r["text"] for r in _generated(tmp_path / "two.jsonl")] == [r["text"] for r in one]
    assert "Traceback" not in result.stderr


def test_bad_input_gets_one_line(tmp_path, capsys):
    config = str(default_config_path())
    assert main(["generate", config, f"+exp_manager.explicit_log_dir={tmp_path / 'none'}",
                 "+generate.sample_output_file=null"]) == 1  # fmt: skip
    assert "no checkpoint to load" in capsys.readouterr().err
    assert main(["generate", config, "+generate.text_gen_type=input-file",
                 f"+generate.sample_input_file={tmp_path / 'missing.txt'}"]) == 1  # fmt: skip
    assert "generate.sample_input_file: expected a text file of prompts" in capsys.readouterr().err
    log_dir = tmp_path / "run"
    _train(log_dir)
    (tmp_path / "long.txt").write_text("x " * 200)
    assert main(["generate", config, f"+exp_manager.explicit_log_dir={log_dir}", "+generate.text_gen_type=input-file",
                 f"+generate.sample_input_file={tmp_path / 'long.txt'}",
                 f"+generate.sample_output_file={tmp_path / 'o.jsonl'}"]) == 1  # fmt: skip
    err = capsys.readouterr().err
    assert "leaves no room in the model's context of 64 positions" in err and "Traceback" not in err
    assert not (tmp_path / "o.jsonl").exists()
