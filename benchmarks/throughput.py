"""Training throughput: nxd-train against transformers' Trainer on the same model, data and batch.

    uv run --group bench python benchmarks/throughput.py [--models 20m,125m] [--precisions fp32,bf16]

For each configs/bench_*.yaml and precision, one run trains the Megatron-style Llama through nxd's loop
and the identical LlamaForCausalLM (same weights layout, same random tokens, same micro/global batch)
through `transformers.Trainer`, then prints tokens/s of each, their ratio, and MFU against a matmul
ceiling measured on this device in this run. Runs on CUDA when a GPU is present, else on the CPU.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from nxd_config import NxdConfig, load_config
from nxd_data import SampleFormat, TokenStream
from nxd_models import device_ceiling, model_family
from nxd_train.corpus import default_cache_dir
from nxd_train.data import DataSplits
from nxd_train.loop import train
from nxd_train.plan import RunPlan
from nxd_train.preflight import plan_run
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

ROOT = Path(__file__).resolve().parents[1]
VOCABULARY = {"20m": 8192, "125m": 32000}
"""Random-token vocabulary per model: with these, bench_20m has 19M parameters and bench_125m 134M."""
PRECISION = {"fp32": ("fp32", torch.float32), "bf16": ("autocast", torch.bfloat16)}


def random_splits(seq_length: int, samples: int, vocab: int) -> DataSplits:
    tokens = np.random.default_rng(0).integers(0, vocab, samples * seq_length + 1).astype(np.int32)
    format = SampleFormat(seq_length=seq_length, eod_id=0)
    windows = TokenStream(tokens, format)
    return DataSplits(windows, windows, windows, format.padding(), vocab, "random tokens", shuffled=False)


def nxd_tokens_per_second(config_path: Path, vocab: int, precision: str, steps: int, log_dir: Path) -> float:
    cfg = load_config(config_path, [f"precision.type={precision}", f"trainer.max_steps={steps}",
                                    f"+exp_manager.explicit_log_dir={log_dir}"])  # fmt: skip
    train(with_random_tokens(plan_run(cfg, default_cache_dir()), vocab, steps))
    with open(log_dir / "metrics.csv") as handle:
        rates = [float(row["tokens_per_s"]) for row in csv.DictReader(handle) if row.get("tokens_per_s")]
    return statistics.median(rates[1:])  # the first step pays for warm-up


def with_random_tokens(plan: RunPlan, vocab: int, steps: int) -> RunPlan:
    """`plan` trained on random tokens of a `vocab`-sized vocabulary."""
    family = model_family(dataclasses.replace(plan.family.spec, vocab_size=vocab), plan.family.attention)
    data = random_splits(plan.seq_length, steps * plan.batches.global_batch_size, vocab)
    return dataclasses.replace(plan, family=family, data=data)


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


def trainer_tokens_per_second(cfg: NxdConfig, plan: RunPlan, precision: str, steps: int, out: Path) -> float:
    hf_config = LlamaConfig(**plan.family.hf_mapping().config)
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM._from_config(hf_config, attn_implementation="sdpa")
    windows = plan.data.train

    class Samples(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(windows)

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            sample = windows[index]  # labels already shifted: give Trainer the unshifted window
            return {"input_ids": sample["input_ids"], "labels": sample["input_ids"]}

    accumulation = cfg.global_batch_size // cfg.data.micro_batch_size
    timer = StepTimer()
    arguments = TrainingArguments(
        output_dir=str(out), max_steps=steps, per_device_train_batch_size=cfg.data.micro_batch_size,
        gradient_accumulation_steps=accumulation, learning_rate=cfg.model.optim.lr, weight_decay=0.01,
        adam_beta2=0.95, max_grad_norm=1.0, bf16=precision == "bf16", use_cpu=not torch.cuda.is_available(),
        report_to=[], save_strategy="no", logging_steps=1000, dataloader_num_workers=0, disable_tqdm=True,
        lr_scheduler_type="constant",
    )  # fmt: skip
    Trainer(model=model, args=arguments, train_dataset=Samples(), callbacks=[timer]).train()
    tokens = cfg.global_batch_size * cfg.seq_length
    return tokens / statistics.median(timer.durations[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="20m,125m")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    ceilings = {key: device_ceiling(device, dtype).flops for key, (_, dtype) in PRECISION.items()}
    print(f"device: {name}; torch {torch.__version__}")
    print("matmul ceiling: " + ", ".join(f"{k} {v / 1e9:,.0f} GFLOP/s" for k, v in ceilings.items()))
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for model in args.models.split(","):
            config_path = ROOT / "configs" / f"bench_{model}.yaml"
            cfg = load_config(config_path)
            vocab = VOCABULARY[model]
            plan = with_random_tokens(plan_run(cfg, default_cache_dir()), vocab, args.steps)
            flops_per_token = plan.family.flops_per_token(cfg.seq_length)
            parameters = plan.family.parameter_count()
            for precision in args.precisions.split(","):
                ours = nxd_tokens_per_second(config_path, vocab, PRECISION[precision][0], args.steps,
                                             Path(scratch) / f"nxd-{model}-{precision}")  # fmt: skip
                theirs = trainer_tokens_per_second(cfg, plan, precision, args.steps,
                                                   Path(scratch) / f"hf-{model}-{precision}")  # fmt: skip
                mfu = [rate * flops_per_token / ceilings[precision] for rate in (ours, theirs)]
                rows.append((f"{model} ({parameters / 1e6:.0f}M)", precision, ours, theirs, ours / theirs, *mfu))
    print()
    print(f"{'model':<14} {'precision':<9} {'nxd tok/s':>10} {'Trainer tok/s':>14} {'ratio':>6} {'nxd MFU':>8} "
          f"{'Trainer MFU':>11}")  # fmt: skip
    for model, precision, ours, theirs, ratio, mfu_ours, mfu_theirs in rows:
        print(f"{model:<14} {precision:<9} {ours:>10,.0f} {theirs:>14,.0f} {ratio:>5.2f}x {mfu_ours:>8.1%} "
              f"{mfu_theirs:>11.1%}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
