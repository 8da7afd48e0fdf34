"""GPT-NeoX's 125M model as its own config file describes it, trained by nxd-train from that NeoX file and by
transformers' Trainer on the exported GPTNeoXForCausalLM: same shape, tokens, batch and precision.

    uv run --group bench python benchmarks/neox_125m.py [--precisions fp32,bf16] [--steps 5]

benchmarks/neox_125m.yml is GPT-NeoX's configs/125M.yml (12 layers, hidden 768, 12 heads, sequence 2048,
rotary, layernorm, untied output layer, activation recompute, Adam 6e-4 with betas 0.9/0.95, clipping 1.0,
weight decay 0.1), read by nxd as a NeoX file. Its fp16 block is replaced here by each measured precision:
fp16 has no fast CPU kernels and transformers' Trainer refuses fp16 on a CPU, so the CPU rows are fp32
(both) and bf16 (nxd's mixed_precision: bf16 weights and fp32 masters; Trainer's bf16=True: autocast). The
micro-batch is 1 and the global batch 2 (NeoX's 4 x 2048 tokens per micro-batch takes minutes per step on
two cores). Trainer runs with gradient checkpointing, as the NeoX file recomputes activations. Each column
runs in a fresh process; tokens/s is the median of steps 2 onwards.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from nxd_config import load_config
from nxd_models import peak_memory
from nxd_train.checks.preflight import plan_run
from nxd_train.run.corpus import default_cache_dir
from nxd_train.run.loop import train
from smoke import parse_args
from throughput import StepTimer, unshifted_windows, with_random_tokens
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, Trainer, TrainingArguments

HERE = Path(__file__).resolve().parent
VOCAB = 50257
"""GPT-2's vocabulary, which NeoX's 125M trains with (padded to 50304 by make_vocab_size_divisible_by 128)."""
BATCH = [
    "train_micro_batch_size_per_gpu=1",
    "gradient_accumulation_steps=2",
    "num_gpus=1",
    "num_workers=0",
    "log_interval=1",
]


SMOKE = ["num_layers=2", "hidden_size=64", "num_attention_heads=4", "seq_length=64", "max_position_embeddings=64"]
"""GPT-NeoX keys that shrink the model for --smoke."""


def neox_plan(precision: str, steps: int, log_dir: Path, smoke: bool = False):
    overrides = [
        *BATCH,
        f"train_iters={steps}",
        f"lr_decay_iters={steps}",
        "fp16.enabled=false",
        f"save={log_dir}",
        "checkpoint_factor=100000",
        *(SMOKE if smoke else []),
    ]
    if precision == "bf16":
        overrides.append("precision=bfloat16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = load_config([HERE / "neox_125m.yml"], overrides)
        vocab = 512 if smoke else VOCAB
        return cfg, with_random_tokens(plan_run(cfg, default_cache_dir(), data_required=False), vocab, steps)


def nxd_rate(precision: str, steps: int, scratch: Path, smoke: bool) -> tuple[float, list[float]]:
    _, plan = neox_plan(precision, steps, scratch / "nxd", smoke)
    log_dir = train(plan)
    rows = [row for row in _metrics(log_dir) if "tokens_per_s" in row]
    return statistics.median(row["tokens_per_s"] for row in rows[1:]), [row["loss"] for row in rows]


def _metrics(log_dir: Path) -> list[dict[str, float]]:
    with open(log_dir / "metrics.csv") as handle:
        return [{k: float(v) for k, v in row.items() if v} for row in csv.DictReader(handle)]


def trainer_rate(precision: str, steps: int, scratch: Path, smoke: bool) -> float:
    cfg, plan = neox_plan(precision, steps, scratch / "plan", smoke)
    torch.manual_seed(cfg.seed)
    config = GPTNeoXConfig(**plan.family.hf_mapping().config)
    model = GPTNeoXForCausalLM._from_config(config, attn_implementation="sdpa")
    windows = unshifted_windows(plan)

    class Samples(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(windows)

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            return {"input_ids": windows[index], "labels": windows[index]}

    timer = StepTimer()
    optim = cfg.model.optim
    arguments = TrainingArguments(
        output_dir=str(scratch / "trainer"),
        max_steps=steps,
        per_device_train_batch_size=cfg.data.micro_batch_size,
        gradient_accumulation_steps=cfg.global_batch_size // cfg.data.micro_batch_size,
        learning_rate=optim.lr,
        weight_decay=optim.weight_decay,
        adam_beta1=optim.betas[0],
        adam_beta2=optim.betas[1],
        adam_epsilon=optim.eps,
        max_grad_norm=1.0,
        bf16=precision == "bf16",
        use_cpu=not torch.cuda.is_available(),
        report_to=[],
        save_strategy="no",
        logging_steps=1000,
        dataloader_num_workers=0,
        disable_tqdm=True,
        lr_scheduler_type="constant",
        gradient_checkpointing=True,
    )
    Trainer(model=model, args=arguments, train_dataset=Samples(), callbacks=[timer]).train()
    return cfg.global_batch_size * cfg.seq_length / statistics.median(timer.durations[1:])


def measure(column: str, precision: str, steps: int, smoke: bool) -> dict[str, float]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as scratch:
        if column == "nxd":
            rate, losses = nxd_rate(precision, steps, Path(scratch), smoke)
        else:
            rate, losses = trainer_rate(precision, steps, Path(scratch), smoke), []
    return {"tokens_per_s": rate, "peak_gib": peak_memory(device) / 2**30, "losses": losses}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--child", nargs=2, metavar=("COLUMN", "PRECISION"), help=argparse.SUPPRESS)
    args = parse_args(parser, precisions="fp32", steps=2)
    if args.child:
        print("RESULT " + json.dumps(measure(*args.child, args.steps, args.smoke)))
        return 0
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"
    _, plan = neox_plan("fp32", args.steps, Path(tempfile.mkdtemp()) / "probe", args.smoke)
    print(
        f"device: {name}; torch {torch.__version__}; NeoX 125M: {plan.family.parameter_count() / 1e6:.0f}M "
        f"parameters, sequence {plan.seq_length}, global batch {plan.batches.global_batch_size}"
    )
    print(f"{'precision':<10} {'nxd tok/s':>10} {'GiB':>6} {'Trainer tok/s':>14} {'GiB':>6} {'nxd/Trainer':>12}")
    failed = False
    for precision in args.precisions.split(","):
        found = {}
        for column in ("nxd", "Trainer"):
            run = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--steps",
                    str(args.steps),
                    "--child",
                    column,
                    precision,
                    *(["--smoke"] if args.smoke else []),
                ],
                capture_output=True,
                text=True,
            )
            lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
            if run.returncode or not lines:
                print(f"{column} {precision} failed:\n{run.stderr[-3000:]}", file=sys.stderr)
                failed = True
                continue
            found[column] = json.loads(lines[0].removeprefix("RESULT "))
        if len(found) == 2:
            n, t = found["nxd"], found["Trainer"]
            print(
                f"{precision:<10} {n['tokens_per_s']:>10,.0f} {n['peak_gib']:>6.2f} {t['tokens_per_s']:>14,.0f} "
                f"{t['peak_gib']:>6.2f} {n['tokens_per_s'] / t['tokens_per_s']:>11.2f}x",
                flush=True,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
