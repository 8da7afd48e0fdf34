"""Helpers that run nxd-train on the embedded tiny config, in this process or as the real command.

The `train_here` fixture (tests/conftest.py) wraps `train_in_process`."""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from nxd_config import load_config
from nxd_train.checks.preflight import plan_run
from nxd_train.cli import default_config_path
from nxd_train.run.corpus import default_cache_dir
from nxd_train.run.loop import train
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

FAST = ["trainer.log_every_n_steps=1", "exp_manager.create_tensorboard_logger=False", "trainer.limit_val_batches=0"]


CLUSTER_STEPS = 16
CLUSTER_JOB = [
    *FAST,
    f"trainer.max_steps={CLUSTER_STEPS}",
    "data.micro_batch_size=2",
    "data.global_batch_size=8",
    "exp_manager.create_checkpoint_callback=True",
    "+exp_manager.checkpoint_callback_params.every_n_train_steps=4",
    "+exp_manager.checkpoint_callback_params.save_top_k=-1",
]
"""The tiny job the cluster tests interrupt and resume: 16 steps, a global batch of 8 in micro-batches of 2, a
checkpoint every 4 steps, all kept."""
SLOWED = ["trainer.val_check_interval=1", "trainer.limit_val_batches=6"]
"""Validation after every step: it slows a run to be interrupted, so the interruption lands mid-run (it changes
nothing in training: no dropout, no shuffling)."""


def step_losses(log_dir: Path) -> dict[int, float]:
    """The loss of every step (the last record of a step wins: a resumed run logs it again)."""
    return {int(row["step"]): row["loss"] for row in read_metrics(log_dir) if "loss" in row}


def read_metrics(log_dir: Path) -> list[dict[str, float]]:
    with open(log_dir / "metrics.csv") as handle:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(handle)]


def losses(rows: list[dict[str, float]]) -> list[float]:
    return [row["loss"] for row in rows if "loss" in row]


def saved_state(checkpoint: Path, *keys: str) -> dict[str, Any]:
    """Parts of a checkpoint (top-level keys such as model, optimizer), read whole in this process."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _load_state_dict_from_keys(set(keys), checkpoint_id=str(checkpoint))


def assert_identical(a: Any, b: Any, where: str = "") -> None:
    """Nested dicts of tensors and values, equal bit for bit."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_identical(a[key], b[key], f"{where}.{key}")
    elif torch.is_tensor(a):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def train_in_process(log_dir: Path, *overrides: str) -> list[dict[str, float]]:
    """Train the tiny config in this process (one process) with overrides; returns the metrics rows."""
    cfg = load_config(default_config_path(), [*FAST, f"+exp_manager.explicit_log_dir={log_dir}", *overrides])
    return read_metrics(train(plan_run(cfg, default_cache_dir())))


def run_command(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """The installed nxd-train command, as a user runs it."""
    command = [str(Path(sys.executable).with_name("nxd-train")), *args]
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=environment)


def hf_run_config(tmp_path, vocab_size: int, max_positions: int = 128):
    """A tiny Llama config.json and an hf run config that points at it."""
    (tmp_path / "config.json").write_text(
        f'{{"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, '
        f'"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": {vocab_size}, '
        f'"max_position_embeddings": {max_positions}}}'
    )
    source = tmp_path / "hf.yaml"
    source.write_text(
        "name: tiny_hf\nmodel_source: hf\ntrainer: {max_steps: 3, num_sanity_val_steps: 0}\n"
        "exp_manager: {create_checkpoint_callback: False}\ndistributed_strategy: {zero1: False}\n"
        "data: {micro_batch_size: 2, global_batch_size: 4}\nprecision: {type: fp32}\n"
        f"model:\n  model_config: {tmp_path / 'config.json'}\n  encoder_seq_length: 64\n"
        "  optim: {name: adamw, lr: 1e-3}\n"
    )
    return source


SFT_WORDS = [
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
]


def sft_records(count: int, seed: int = 0) -> list[dict[str, str]]:
    """`count` input/output records of 2-12 and 1-16 words, drawn with a fixed seed."""
    generator = random.Random(seed)
    return [
        {
            "input": " ".join(generator.choices(SFT_WORDS, k=generator.randint(2, 12))),
            "output": " ".join(generator.choices(SFT_WORDS, k=generator.randint(1, 16))),
        }
        for _ in range(count)
    ]


def sft_job(directory: Path, tokenizer_dir: Path, *, packing: bool = True, records: int = 256) -> list[str]:
    """Overrides that turn the tiny config into an SFT run on records written to `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, count, seed in (("train.jsonl", records, 0), ("validation.jsonl", 32, 1)):
        (directory / name).write_text("".join(json.dumps(r) + "\n" for r in sft_records(count, seed)))
    return [
        f"+model_alignment_strategy.sft.packing={packing}",
        f"+data.train_dir={directory / 'train.jsonl'}",
        f"+data.val_dir={directory / 'validation.jsonl'}",
        f"+data.tokenizer.type={tokenizer_dir}",
    ]


def preference_records(count: int, seed: int = 0) -> list[dict[str, str]]:
    """`count` prompt/chosen/rejected records: the chosen response sorts the prompt's words, the rejected
    one is random words (a preference a tiny model can learn)."""
    generator = random.Random(seed)
    records = []
    for _ in range(count):
        prompt = generator.choices(SFT_WORDS, k=generator.randint(2, 8))
        records.append(
            {
                "prompt": " ".join(prompt),
                "chosen": " ".join(sorted(prompt)),
                "rejected": " ".join(generator.choices(SFT_WORDS, k=generator.randint(1, 8))),
            }
        )
    return records


def _preference_data(directory: Path, records: int) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    for name, count, seed in (("train.jsonl", records, 0), ("validation.jsonl", 16, 1)):
        (directory / name).write_text("".join(json.dumps(r) + "\n" for r in preference_records(count, seed)))
    return [f"+data.train_dir={directory / 'train.jsonl'}", f"+data.val_dir={directory / 'validation.jsonl'}"]


def orpo_job(directory: Path, tokenizer_dir: Path, *, beta: float = 0.2, records: int = 128) -> list[str]:
    """Overrides that turn the tiny config into an ORPO run on records written to `directory`."""
    return [
        f"+model_alignment_strategy.orpo.beta={beta}",
        "+model_alignment_strategy.orpo.max_prompt_length=32",
        *_preference_data(directory, records),
        f"+data.tokenizer.type={tokenizer_dir}",
    ]


def dpo_job(
    directory: Path, tokenizer_dir: Path, *, beta: float = 0.5, precompute: bool = True, records: int = 128
) -> list[str]:
    """Overrides that turn the tiny config into a DPO run on records written to `directory`."""
    return [
        f"+model_alignment_strategy.dpo.kl_beta={beta}",
        "+model_alignment_strategy.dpo.max_prompt_length=32",
        f"+model_alignment_strategy.dpo.precompute_ref_log_probs={precompute}",
        *_preference_data(directory, records),
        f"+data.tokenizer.type={tokenizer_dir}",
    ]


def kto_records(count: int, seed: int = 0) -> list[dict]:
    """`count` prompt/completion/label records, alternately desirable (the prompt's words sorted) and
    undesirable (random words), from the same preference a tiny model can learn."""
    records = []
    for index, pair in enumerate(preference_records(count, seed)):
        desirable = index % 2 == 0
        records.append(
            {"prompt": pair["prompt"], "completion": pair["chosen" if desirable else "rejected"], "label": desirable}
        )
    return records


def kto_job(
    directory: Path, tokenizer_dir: Path, *, beta: float = 0.5, precompute: bool = True, records: int = 128
) -> list[str]:
    """Overrides that turn the tiny config into a KTO run on records written to `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, count, seed in (("train.jsonl", records, 0), ("validation.jsonl", 16, 1)):
        (directory / name).write_text("".join(json.dumps(r) + "\n" for r in kto_records(count, seed)))
    return [
        f"+model_alignment_strategy.kto.beta={beta}",
        "+model_alignment_strategy.kto.max_prompt_length=32",
        f"+model_alignment_strategy.kto.precompute_ref_log_probs={precompute}",
        f"+data.train_dir={directory / 'train.jsonl'}",
        f"+data.val_dir={directory / 'validation.jsonl'}",
        f"+data.tokenizer.type={tokenizer_dir}",
    ]


def reward_job(directory: Path, tokenizer_dir: Path, *, z_loss: float = 0.0, records: int = 128) -> list[str]:
    """Overrides that turn the tiny config into a reward-model run on pair records written to `directory`."""
    return [
        f"+model_alignment_strategy.reward_model.z_loss={z_loss}",
        "+model_alignment_strategy.reward_model.max_prompt_length=32",
        *_preference_data(directory, records),
        f"+data.tokenizer.type={tokenizer_dir}",
    ]


def tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the TensorBoard event files under `directory`, by tag: (step, value), read from the
    TFRecord framing (length, its CRC, the Event, its CRC) with tensorboardX's Event message."""
    from tensorboardX.proto.event_pb2 import Event

    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(directory.rglob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset + 12 <= len(data):
            length = int.from_bytes(data[offset : offset + 8], "little")
            event = Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


WANDB_HEADER = b":W&B\xe1\xbe\x00"
"""A .wandb file's first 7 bytes: ":W&B", magic 0xBEE1 (little-endian), version 0."""


def wandb_history(directory: Path, *, wait_s: float = 60.0) -> list[dict[str, Any]]:
    """The history rows (_step and the logged values) of the offline W&B run under `directory`. Its .wandb file
    is a LevelDB-style log: after the header, 32 KiB blocks of chunks (CRC-32 4 bytes, length 2, type 1: full,
    first, middle, last), whose data joined make one wandb Record message each. wandb's service writes the file
    on its own, so a chunk may be only partly written when read: reading stops before it, and the file is read again
    (up to `wait_s`) until it holds the run's exit record."""
    from wandb.proto import wandb_internal_pb2

    (path,) = directory.glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + wait_s
    while True:
        data = path.read_bytes()
        assert data[:7] == WANDB_HEADER, data[:7]
        records, offset, pending = [], 7, b""
        while offset + 7 <= len(data):
            left_in_block = 32768 - offset % 32768
            if left_in_block < 7:  # too little left for a chunk header: the block is padded
                offset += left_in_block
                continue
            length, kind = int.from_bytes(data[offset + 4 : offset + 6], "little"), data[offset + 6]
            if offset + 7 + length > len(data):  # the service is still writing this chunk
                break
            pending += data[offset + 7 : offset + 7 + length]
            offset += 7 + length
            if kind in (1, 4):  # full, or the last chunk of a record
                records.append(wandb_internal_pb2.Record.FromString(pending))
                pending = b""
        kinds = [record.WhichOneof("record_type") for record in records]
        if "exit" in kinds:
            break
        assert time.monotonic() < deadline, f"{path} has no exit record after {wait_s} s: {kinds}"
        time.sleep(0.5)
    return [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        for record in records
        if record.WhichOneof("record_type") == "history"
    ]
