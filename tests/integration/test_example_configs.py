"""NxDT's Megatron-style family shapes as configs/ ships them, shrunk to 2 gloo processes and 2 layers with
their own features kept (TP 2 with sequence parallel, ZeRO-1, mixed precision, selective recompute, their
tokenizer form, Mistral's sliding window), each on indexed data the test preprocesses with that very
tokenizer: every one trains 3 steps."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from nxd_train.cli import main

from tests.conftest import TEXT
from tests.training_runs import losses, read_metrics, run_command

ROOT = Path(__file__).resolve().parents[2]
SHRINK = ["trainer.devices=2", "trainer.num_nodes=1", "trainer.max_steps=3", "model.num_layers=2", "model.hidden_size=64",
          "model.ffn_hidden_size=128", "model.num_attention_heads=4", "model.encoder_seq_length=64",
          "data.global_batch_size=4", "data.splits_string=90,5,5", "data.num_workers=0",
          "distributed_strategy.tensor_model_parallel_size=2", "model.optim.capturable=False",
          "model.optim.sched.warmup_steps=1", "exp_manager.resume_if_exists=False",
          "exp_manager.create_checkpoint_callback=False", "exp_manager.create_tensorboard_logger=False"]  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    generator = random.Random(1)
    path = tmp_path_factory.mktemp("example_corpus") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": " ".join(generator.choices(TEXT, k=generator.randint(3, 9)))}) + "\n"
                            for _ in range(160)))  # fmt: skip
    return path


def _tokenizer(form: str, gpt2_files, sentencepiece_dir) -> tuple[list[str], list[str]]:
    """The config keys and the `data preprocess` flags of one tokenizer form."""
    if form == "gpt2":
        vocab, merges = gpt2_files
        return ([f"data.tokenizer.vocab_file={vocab}", f"data.tokenizer.merge_file={merges}"],
                ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges])  # fmt: skip
    return [f"data.tokenizer.type={sentencepiece_dir}"], ["--tokenizer", str(sentencepiece_dir)]


@pytest.mark.parametrize(("config", "form", "shape"), [
    ("megatron_gpt", "gpt2", []),
    ("megatron_llama_7B", "sentencepiece", ["model.num_kv_heads=2"]),
    ("megatron_mistral", "sentencepiece", ["model.num_kv_heads=2", "model.sliding_window_size=32"]),
])  # fmt: skip
def test_a_shipped_family_config_trains_shrunk(config, form, shape, corpus, gpt2_files, sentencepiece_dir, tmp_path):
    keys, flags = _tokenizer(form, gpt2_files, sentencepiece_dir)
    assert main(["data", "preprocess", "--input", str(corpus), "--output-prefix", str(tmp_path / "data"), *flags,
                 "--append-eod", "--no-progress"]) == 0  # fmt: skip
    result = run_command("-c", str(ROOT / "configs" / f"{config}.yaml"), *SHRINK, *shape, *keys,
                         f"data.data_prefix=[1.0,{tmp_path / 'data_text_document'}]",
                         f"exp_manager.explicit_log_dir={tmp_path / 'run'}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(losses(read_metrics(tmp_path / "run"))) == 3
