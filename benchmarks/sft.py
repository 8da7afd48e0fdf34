"""Supervised fine-tuning with packing: nxd-train against TRL's SFTTrainer on the same model and records.

    uv run --group bench python benchmarks/sft.py [--steps 10] [--seq 512,1024] [--lora RANK]

With `--lora RANK` both train LoRA adapters (rank RANK, alpha 2 x RANK, no dropout) on every linear
layer of the decoder (q, k, v, o, gate, up, down) with the base frozen: nxd from
`model_alignment_strategy.peft`, TRL through peft's LoraConfig. Each framework then runs in a process
of its own, so that its peak resident memory is its own.

Both fine-tune the same small Llama (a transformers LlamaForCausalLM built from one config.json, same
initial weights) on the same prompt/completion records (Python standard-library functions: a request
naming the function and its docstring, answered by its source), tokenised by the same byte-level BPE,
with the same rows per step (micro-batch 4, accumulation 2), AdamW at a constant learning rate,
gradient clipping 1.0, fp32, SDPA attention, on this machine's device. Records are packed by
best-fit decreasing in both: nxd into rows of `seq` tokens, each record attending only to itself
through document ids; TRL with `packing_strategy="bfd"`, which turns on its padding-free collator
(a micro-batch's packed rows flattened into one sequence, records kept apart through restarting
position ids). The loss is on the completions in both.

Printed per sequence length and framework: real (non-padding) tokens per second over the median step
after warm-up, the share of each row's capacity left to padding, MFU against a matmul ceiling measured
in this run, and the ratio.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import inspect
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import datasets
import torch
from nxd_config import load_config
from nxd_data import load_tokenizer
from nxd_models import device_ceiling
from nxd_train.checks.preflight import plan_run
from nxd_train.run.corpus import builtin_tokenizer, default_cache_dir, stdlib_corpus
from nxd_train.run.loop import train
from smoke import parse_args  # benchmarks/ is the script's folder
from throughput import StepTimer
from transformers import LlamaConfig, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

MODULES = (
    "os",
    "posixpath",
    "shutil",
    "json",
    "textwrap",
    "string",
    "collections",
    "functools",
    "itertools",
    "heapq",
    "bisect",
    "random",
    "statistics",
    "fnmatch",
    "glob",
    "tempfile",
    "pathlib",
    "re",
    "difflib",
    "base64",
    "csv",
    "datetime",
    "calendar",
    "copy",
    "pprint",
    "shlex",
    "argparse",
    "logging",
    "inspect",
    "typing",
    "dataclasses",
    "enum",
    "ast",
    "tokenize",
    "zipfile",
    "tarfile",
    "gzip",
    "email.utils",
)
MODEL = dict(
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
MICRO_BATCH, ACCUMULATION, LR = 4, 2, 1e-4


def records() -> list[dict[str, str]]:
    """Standard-library functions as prompt/completion pairs, in a fixed order."""
    found = []
    for name in MODULES:
        module = importlib.import_module(name)
        for attribute in sorted(vars(module)):
            function = getattr(module, attribute)
            if not inspect.isfunction(function) or function.__module__ != module.__name__ or not function.__doc__:
                continue
            try:
                source = inspect.getsource(function)
            except (OSError, TypeError):
                continue
            summary = inspect.getdoc(function).split("\n\n")[0]
            found.append({"prompt": f"Write {name}.{attribute}: {summary}\n", "completion": source})
    return found


TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_inputs(directory: Path, pairs: list[dict[str, str]], tokenizer: Path, seq: int, lora: int = 0) -> Path:
    """The records as nxd's input/output jsonl, the model and an nxd config that starts from it."""
    with open(directory / "records.jsonl", "w") as handle:
        handle.writelines(json.dumps({"input": p["prompt"], "output": p["completion"]}) + "\n" for p in pairs)
    return bench_config(
        directory, directory / "records.jsonl", tokenizer, seq, f"  sft: {{packing: True}}\n{peft_block(lora)}"
    )


def bench_config(directory: Path, data: Path, tokenizer: Path, seq: int, alignment: str) -> Path:
    """The bench model (initial weights, saved once for both frameworks) and an nxd config that starts
    from it on `data` with the `model_alignment_strategy` lines `alignment`."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(1234)
    model_config = LlamaConfig(vocab_size=load_tokenizer(tokenizer).vocab_size, max_position_embeddings=seq, **MODEL)
    LlamaForCausalLM(model_config).save_pretrained(directory / "model")
    config = directory / "bench.yaml"
    config.write_text(f"""
name: bench
model_source: hf
trainer: {{max_steps: 1, log_every_n_steps: 1, val_check_interval: 1000000, limit_val_batches: 0,
          num_sanity_val_steps: 0, gradient_clip_val: 1.0}}
exp_manager: {{create_checkpoint_callback: False, create_tensorboard_logger: False, log_gradient_norm: True,
              resume_from_checkpoint: {directory / "model"}}}
data: {{micro_batch_size: {MICRO_BATCH}, global_batch_size: {MICRO_BATCH * ACCUMULATION}, seq_length: {seq},
       train_dir: {data}, tokenizer: {{type: {tokenizer}}}}}
model:
  model_config: {directory / "model"}
  encoder_seq_length: {seq}
  weight_init_only: True
  fusions: {{flash_attention: True}}
  optim: {{name: adamw, lr: {LR}, weight_decay: 0.0}}
model_alignment_strategy:
{alignment}
precision: {{type: fp32}}
""")
    return config


def step_times(log_dir: Path) -> list[float]:
    """Every step's time as nxd logged it (log_every_n_steps 1)."""
    with open(log_dir / "metrics.csv") as handle:
        return [float(row["step_time"]) for row in csv.DictReader(handle) if row.get("step_time")]


def median_step_time(log_dir: Path) -> float:
    """The median step time nxd logged, after two steps of warm-up."""
    return statistics.median(step_times(log_dir)[2:])


def peft_block(rank: int) -> str:
    if not rank:
        return ""
    return (
        f"  peft: {{lora_rank: {rank}, lora_alpha: {2 * rank}, lora_dropout: 0.0, "
        f"target_modules: [{', '.join(TARGETS)}]}}"
    )


def nxd_run(config: Path, steps: int, log_dir: Path) -> dict[str, float]:
    cfg = load_config(config, [f"trainer.max_steps={steps}", f"+exp_manager.explicit_log_dir={log_dir}"])
    plan = plan_run(cfg, default_cache_dir())
    fill = plan.data.train.fill
    train(plan)
    step_time = median_step_time(log_dir)
    real = MICRO_BATCH * ACCUMULATION * plan.seq_length * fill
    return {
        "tokens_per_s": real / step_time,
        "padding": 1 - fill,
        "flops_per_token": plan.family.flops_per_token(plan.seq_length),
        "step_time": step_time,
        "rows": len(plan.data.train),
    }


def trl_run(
    pairs: list[dict[str, str]], tokenizer: Path, model_dir: Path, seq: int, steps: int, out: Path, lora: int = 0
) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    processing = PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer), eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32)
    arguments = SFTConfig(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=ACCUMULATION,
        learning_rate=LR,
        weight_decay=0.0,
        max_grad_norm=1.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
        use_cpu=not torch.cuda.is_available(),
        report_to=[],
        save_strategy="no",
        logging_steps=1000,
        disable_tqdm=True,
        dataloader_num_workers=0,
        max_length=seq,
        packing=True,
        packing_strategy="bfd",
        padding_free=True,
        completion_only_loss=True,
        seed=1234,
        bf16=False,
        gradient_checkpointing=False,  # TRL's defaults (bf16 autocast, recomputation) are not nxd's here
    )
    timer = StepTimer()
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=lora, lora_alpha=2 * lora, lora_dropout=0.0, target_modules=list(TARGETS), task_type="CAUSAL_LM"
        )
    trainer = SFTTrainer(
        model=model,
        args=arguments,
        train_dataset=datasets.Dataset.from_list(pairs),
        processing_class=processing,
        callbacks=[timer],
        peft_config=peft_config,
    )
    lengths = [len(ids) for ids in trainer.train_dataset["input_ids"]]
    trainer.train()
    step_time = statistics.median(timer.durations[2:])
    real = MICRO_BATCH * ACCUMULATION * statistics.fmean(lengths)
    return {
        "tokens_per_s": real / step_time,
        "padding": 1 - statistics.fmean(lengths) / seq,
        "step_time": step_time,
        "rows": len(lengths),
    }


def worker(framework: str, seq: int, steps: int, lora: int) -> None:
    """One framework's run, in this process; prints its figures (with peak resident memory) as JSON."""
    pairs, tokenizer = records(), builtin_tokenizer(stdlib_corpus(), default_cache_dir())
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        config = write_inputs(directory, pairs, tokenizer, seq, lora)
        if framework == "nxd":
            figures = nxd_run(config, steps, directory / "nxd")
        else:
            figures = trl_run(pairs, tokenizer, directory / "model", seq, steps, directory / "trl", lora)
    figures["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(figures))


def worker_figures(script: str, framework: str, seq: int, steps: int, *options: str) -> dict[str, float]:
    """The figures a benchmark script's worker prints, run in a process of its own (its own peak memory)."""
    command = [sys.executable, script, "--worker", framework, "--seq", str(seq), "--steps", str(steps), *options]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{framework} at seq {seq} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measured(framework: str, seq: int, steps: int, lora: int) -> dict[str, float]:
    return worker_figures(__file__, framework, seq, steps, "--lora", str(lora))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seq", default="512,1024", help="comma-separated sequence lengths")
    parser.add_argument("--lora", type=int, default=0, help="train LoRA adapters of this rank (0: the whole model)")
    parser.add_argument("--worker", choices=("nxd", "trl"), help=argparse.SUPPRESS)
    args = parse_args(parser, steps=3, seq="128")
    if args.worker:
        worker(args.worker, int(args.seq), args.steps, args.lora)
        return 0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    ceiling = device_ceiling(device, torch.float32).flops
    import peft
    import trl

    table = [
        (seq, measured("nxd", seq, args.steps, args.lora), measured("trl", seq, args.steps, args.lora))
        for seq in (int(value) for value in args.seq.split(","))
    ]
    what = f"LoRA r={args.lora} on {', '.join(TARGETS)}" if args.lora else "full fine-tuning"
    print(
        f"\ndevice: {name}; torch {torch.__version__}, transformers {sys.modules['transformers'].__version__}, "
        f"trl {trl.__version__}, peft {peft.__version__}; fp32 matmul ceiling {ceiling / 1e9:,.0f} GFLOP/s"
    )
    print(
        f"{what}; {len(records())} records; {MICRO_BATCH} x {ACCUMULATION} rows per step; median step of "
        f"steps 3-{args.steps}" + ("" if args.lora else "; MFU by 6 x parameters + attention FLOPs per token")
    )
    print(
        f"{'seq':>5} {'framework':<22} {'rows':>5} {'step s':>7} {'real tok/s':>11} {'padding':>8} {'MFU':>6} "
        f"{'peak RSS':>9} {'ratio':>6}"
    )
    for seq, ours, theirs in table:
        for label, figures in (("nxd-train", ours), ("TRL SFTTrainer (bfd)", theirs)):
            mfu = f"{figures['tokens_per_s'] * ours['flops_per_token'] / ceiling:.1%}" if not args.lora else "-"
            ratio = f"{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x" if figures is ours else ""
            print(
                f"{seq:>5} {label:<22} {figures['rows']:>5} {figures['step_time']:>7.3f} "
                f"{figures['tokens_per_s']:>11,.0f} {figures['padding']:>8.1%} {mfu:>6} "
                f"{figures['peak_rss'] / 2**20:>7,.0f} MiB {ratio:>6}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
