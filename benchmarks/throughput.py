"""Training throughput and peak memory: nxd-train (eager and with compiled blocks) against transformers'
Trainer and a torchtitan-style loop, on the same model, data and batch.

    uv run --group bench python benchmarks/throughput.py [--models 20m,125m] [--precisions fp32,bf16]

Models: 20m and 125m are configs/bench_*.yaml; 1b (hidden 2048, 16 layers, vocab 32000) and 8b-slice
(4 layers of Llama-3-8B, vocab 128256) are bench_125m.yaml widened, at sequence 2048, for a GPU.
For each model and precision, the columns train the same Llama shape on the same random tokens with
the same micro and global batch, AdamW and clipping 1.0, each in a fresh process (so each peak
resident memory, or CUDA max allocated, is its own):
- nxd: nxd-train's loop on the Megatron-style model (bf16 is `mixed_precision`, nxd's default type;
  bf16SR is that precision type, against which the Trainer and titan-style columns run their bf16);
- nxd compiled: the same with `model.fusions.torch_compile`;
- nxd chunked loss: the same with `model.fusions.loss_chunk_tokens: 1024` (whole logits never exist);
- Trainer: transformers' Trainer on the identical LlamaForCausalLM (bf16 is its `bf16=True`, autocast);
- titan-style: the torchtitan recipe written from its documentation on the same LlamaForCausalLM:
  FSDP2 `fully_shard` per block and at the root (bf16 parameters, fp32 reduction for bf16), each
  block compiled with torch.compile before sharding, fused AdamW, a plain loop.
Tokens/s is the median of steps 2 onwards (the first pays warm-up and compilation). MFU is model
FLOPs over the device's peak (a datasheet for known GPUs, else a matmul ceiling measured here).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from nxd_config import NxdConfig, load_config
from nxd_data import SampleFormat, TokenStream
from nxd_models import device_ceiling, model_family, peak_memory
from nxd_train.checks.preflight import plan_run
from nxd_train.run.corpus import default_cache_dir
from nxd_train.run.data_splits import DataSplits
from nxd_train.run.loop import train
from nxd_train.run.plan import RunPlan
from smoke import TINY_MODEL, parse_args
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

ROOT = Path(__file__).resolve().parents[1]
WIDER = [
    "data.seq_length=2048",
    "model.encoder_seq_length=2048",
    "data.micro_batch_size=2",
    "data.global_batch_size=4",
    "model.num_attention_heads=32",
    "model.num_kv_heads=8",
]
MODELS = {
    "20m": ("bench_20m", 8192, []),
    "125m": ("bench_125m", 32000, []),
    "1b": (
        "bench_125m",
        32000,
        [*WIDER, "model.hidden_size=2048", "model.num_layers=16", "model.ffn_hidden_size=8192"],
    ),
    "8b-slice": (
        "bench_125m",
        128256,
        [
            *WIDER,
            "model.hidden_size=4096",
            "model.num_layers=4",
            "model.ffn_hidden_size=14336",
            "+model.rope_theta=500000",
        ],
    ),
    "smoke": ("bench_20m", 512, TINY_MODEL),
}
"""Config file, random-token vocabulary and overrides per model: bench_20m has 19M parameters,
bench_125m 134M, 1b 1.1B and 8b-slice 1.9B; smoke is --smoke's."""
PRECISION = {
    "fp32": ("fp32", torch.float32),
    "bf16": ("mixed_precision", torch.bfloat16),
    "bf16SR": ("bf16SR", torch.bfloat16),
}
"""nxd's precision.type and the compute dtype of each column."""
COLUMNS = ("nxd", "nxd compiled", "nxd chunked loss", "Trainer", "titan-style")


def random_splits(seq_length: int, samples: int, vocab: int) -> DataSplits:
    tokens = np.random.default_rng(0).integers(0, vocab, samples * seq_length + 1).astype(np.int32)
    format = SampleFormat(seq_length=seq_length, eod_id=0)
    windows = TokenStream(tokens, format)
    return DataSplits(windows, windows, windows, format.padding(), vocab, "random tokens", shuffled=False)


def with_random_tokens(plan: RunPlan, vocab: int, steps: int) -> RunPlan:
    """`plan` trained on random tokens of a `vocab`-sized vocabulary."""
    family = model_family(dataclasses.replace(plan.family.spec, vocab_size=vocab), plan.family.attention)
    data = random_splits(plan.seq_length, steps * plan.batches.global_batch_size, vocab)
    return dataclasses.replace(plan, family=family, data=data)


def nxd_tokens_per_second(
    config_path: Path, overrides: list[str], vocab: int, precision: str, steps: int, log_dir: Path, column: str
) -> tuple[float, list[float]]:
    """Median tokens/s of steps 2 onwards, and every step's loss."""
    chunk = 1024 if column == "nxd chunked loss" else 0
    cfg = load_config(
        config_path,
        [
            *overrides,
            f"precision.type={precision}",
            f"trainer.max_steps={steps}",
            f"+model.fusions.torch_compile={column == 'nxd compiled'}",
            f"+model.fusions.loss_chunk_tokens={chunk}",
            f"+exp_manager.explicit_log_dir={log_dir}",
        ],
    )
    train(with_random_tokens(plan_run(cfg, default_cache_dir()), vocab, steps))
    with open(log_dir / "metrics.csv") as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("tokens_per_s")]
    # the first step pays for warm-up (and compilation)
    return statistics.median(float(row["tokens_per_s"]) for row in rows[1:]), [float(row["loss"]) for row in rows]


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step of a transformers Trainer."""

    def __init__(self) -> None:
        self.durations: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.durations.append(time.perf_counter() - self.started)


def hf_model(cfg: NxdConfig, plan: RunPlan) -> LlamaForCausalLM:
    """The LlamaForCausalLM identical in shape to the nxd model (its Hugging Face export mapping)."""
    torch.manual_seed(cfg.seed)
    return LlamaForCausalLM._from_config(LlamaConfig(**plan.family.hf_mapping().config), attn_implementation="sdpa")


def unshifted_windows(plan: RunPlan) -> list[torch.Tensor]:
    """The samples as Hugging Face models take them: the window, labels equal to it (shifted inside)."""
    return [plan.data.train[index]["input_ids"] for index in range(len(plan.data.train))]


def trainer_tokens_per_second(cfg: NxdConfig, plan: RunPlan, precision: str, steps: int, out: Path) -> float:
    model, windows = hf_model(cfg, plan), unshifted_windows(plan)

    class Samples(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(windows)

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            return {"input_ids": windows[index], "labels": windows[index]}

    accumulation = cfg.global_batch_size // cfg.data.micro_batch_size
    timer = StepTimer()
    arguments = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=cfg.data.micro_batch_size,
        gradient_accumulation_steps=accumulation,
        learning_rate=cfg.model.optim.lr,
        weight_decay=0.01,
        adam_beta2=0.95,
        max_grad_norm=1.0,
        bf16=precision != "fp32",
        use_cpu=not torch.cuda.is_available(),
        report_to=[],
        save_strategy="no",
        logging_steps=1000,
        dataloader_num_workers=0,
        disable_tqdm=True,
        lr_scheduler_type="constant",
    )
    Trainer(model=model, args=arguments, train_dataset=Samples(), callbacks=[timer]).train()
    tokens = cfg.global_batch_size * cfg.seq_length
    return tokens / statistics.median(timer.durations[1:])


def titan_tokens_per_second(cfg: NxdConfig, plan: RunPlan, precision: str, steps: int, device: torch.device) -> float:
    """torchtitan's recipe on one device: per-block compile, FSDP2 (bf16 parameters and fp32 reduction
    in bf16), fused AdamW, clip 1.0, a plain loop with gradient accumulation."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    mesh = init_device_mesh(device.type, (1,))
    model = hf_model(cfg, plan).to(device)
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if precision != "fp32"
        else MixedPrecisionPolicy()
    )
    for block in model.model.layers:
        block.compile()
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    optim = cfg.model.optim
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=optim.lr, betas=tuple(optim.betas), weight_decay=0.01, fused=True
    )
    windows = unshifted_windows(plan)
    micro, accumulation = cfg.data.micro_batch_size, cfg.global_batch_size // cfg.data.micro_batch_size
    durations = []
    for step in range(steps):
        started = time.perf_counter()
        for m in range(accumulation):
            first = (step * accumulation + m) * micro
            ids = torch.stack(windows[first : first + micro]).to(device)
            (model(input_ids=ids, labels=ids).loss / accumulation).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        durations.append(time.perf_counter() - started)
    dist.destroy_process_group()
    return cfg.global_batch_size * cfg.seq_length / statistics.median(durations[1:])


def measure(column: str, model: str, precision: str, steps: int) -> dict[str, float]:
    """One column's tokens/s and peak memory, in this (fresh) process."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name, vocab, overrides = MODELS[model]
    config_path = ROOT / "configs" / f"{name}.yaml"
    cfg = load_config(config_path, overrides)
    plan = with_random_tokens(plan_run(cfg, default_cache_dir()), vocab, steps)
    losses: list[float] = []
    with tempfile.TemporaryDirectory() as scratch:
        if column.startswith("nxd"):
            rate, losses = nxd_tokens_per_second(
                config_path, overrides, vocab, PRECISION[precision][0], steps, Path(scratch) / "nxd", column
            )
        elif column == "Trainer":
            rate = trainer_tokens_per_second(cfg, plan, precision, steps, Path(scratch))
        else:
            rate = titan_tokens_per_second(cfg, plan, precision, steps, device)
    return {
        "tokens_per_s": rate,
        "peak_gib": peak_memory(device) / 2**30,
        "losses": losses,
        "flops_per_token": plan.family.flops_per_token(cfg.seq_length),
        "parameters": plan.family.parameter_count(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="20m,125m")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--columns", default=",".join(COLUMNS))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--child", nargs=3, metavar=("COLUMN", "MODEL", "PRECISION"), help=argparse.SUPPRESS)
    args = parse_args(parser, models="smoke", precisions="fp32", columns="nxd,Trainer", steps=2)
    if args.child:
        print("RESULT " + json.dumps(measure(*args.child, args.steps)))
        return 0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    precisions = args.precisions.split(",")
    ceilings = {key: device_ceiling(device, PRECISION[key][1]) for key in precisions}
    print(f"device: {name}; torch {torch.__version__}")
    for key, ceiling in ceilings.items():
        print(f"MFU denominator, {key}: {ceiling.source}")
    columns = args.columns.split(",")
    print(
        f"\n{'model':<12} {'precision':<9} "
        + " ".join(f"{c + ' tok/s':>18} {'GiB':>5} {'MFU':>6}" for c in columns)
        + "  nxd/Trainer  compiled/titan  memory chunked/nxd"
    )
    failed = False
    for model in args.models.split(","):
        for precision in precisions:
            found = {}
            for column in columns:
                run = subprocess.run(
                    [sys.executable, __file__, "--steps", str(args.steps), "--child", column, model, precision],
                    capture_output=True,
                    text=True,
                )
                lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
                if run.returncode or not lines:
                    print(f"{column} {model} {precision} failed:\n{run.stderr[-3000:]}", file=sys.stderr)
                    failed = True
                    continue
                found[column] = json.loads(lines[0].removeprefix("RESULT "))
            cells = []
            for column in columns:
                r = found.get(column)
                mfu = r and ceilings[precision].utilisation(r["tokens_per_s"] * r["flops_per_token"])
                shown = f"{mfu:>6.1%}" if mfu is not None else f"{'-':>6}"  # unknown: above the measured ceiling
                cells.append(f"{r['tokens_per_s']:>18,.0f} {r['peak_gib']:>5.2f} {shown}" if r else f"{'-':>31}")
            ratio = {
                pair: (
                    found[pair[0]]["tokens_per_s"] / found[pair[1]]["tokens_per_s"]
                    if pair[0] in found and pair[1] in found
                    else float("nan")
                )
                for pair in (("nxd", "Trainer"), ("nxd compiled", "titan-style"))
            }
            parameters = next(iter(found.values()))["parameters"] / 1e6 if found else 0
            memory = (
                found["nxd chunked loss"]["peak_gib"] / found["nxd"]["peak_gib"]
                if "nxd" in found and "nxd chunked loss" in found
                else float("nan")
            )
            ratios = (
                f"  {ratio[('nxd', 'Trainer')]:>10.2f}x {ratio[('nxd compiled', 'titan-style')]:>14.2f}x"
                f" {memory:>19.2f}x"
            )
            print(f"{model} ({parameters:.0f}M) {precision:<9} " + " ".join(cells) + ratios, flush=True)
            if "nxd" in found and "nxd chunked loss" in found:
                chunked, whole = found["nxd chunked loss"]["losses"], found["nxd"]["losses"]
                print(
                    f"    losses, chunked against whole logits: {chunked} / {whole}, largest difference "
                    f"{max(abs(a - b) for a, b in zip(chunked, whole, strict=True)):.2e}",
                    flush=True,
                )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
