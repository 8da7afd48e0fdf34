"""A QEfficient fine-tuning config through nxd-train and through what QEfficient runs (TRL's SFTTrainer with
peft's LoRA), on the same model, records, batch and precision.

    uv run --group bench python benchmarks/qeff_sft.py [--steps 12] [--dtype bf16] [--shape smollm-135m]

The config is QEfficient's alpaca example (LoRA r 16, alpha 16, no dropout on q, k, v, o, gate, up and down;
per-device batch 2, accumulation 2; AdamW; cosine schedule) on a dataset folder laid out like a hub repository
of prompt/completion records (Python standard-library functions: a request naming the function and its
docstring, answered by its source), max_seq_length 512. nxd-train reads the file as written (`model_name` and
`dataset_name` pointed at local folders). The peer is QEfficient's pipeline written out: the model loaded in
the training dtype, SFTTrainer with SFTConfig(bf16 / fp16, group_by_length, max_length = max_seq_length,
completion_only_loss, AdamW through optimizer_cls_and_kwargs; group_by_length is transformers 5's
train_sampling_strategy) and LoraConfig. The model is SmolLM-135M's shape
(QEfficient's default model; hidden 576, 30 layers, 9 heads / 3 key-value heads, MLP 1536) with the
built-in tokenizer's vocabulary, initialised once and loaded by both.

Printed per framework: real (non-padding) tokens per second (the records' mean length x records per step over
the median step after warm-up), peak resident memory of its own process (and CUDA's peak allocation on a GPU),
and the ratio.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import datasets
import torch
import yaml
from nxd_data import load_tokenizer
from nxd_train.cli import main as nxd_main
from nxd_train.run.corpus import builtin_tokenizer, default_cache_dir, stdlib_corpus
from sft import records, step_times  # benchmarks/ is the script's folder
from smoke import parse_args
from throughput import StepTimer
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

SHAPES = {
    "smollm-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
    ),
    "small": dict(
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    ),
}
TARGETS = ["k_proj", "gate_proj", "q_proj", "up_proj", "v_proj", "down_proj", "o_proj"]
MICRO, ACCUMULATION, SEQ, RANK = 2, 2, 512, 16


def qeff_config(model: Path, data: Path, out: Path, steps: int, dtype: str) -> dict:
    """QEfficient's alpaca example config, on local folders."""
    return {
        "model": {
            "model_type": "hf",
            "auto_class_name": "AutoModelForCausalLM",
            "model_name": str(model),
            "use_peft": True,
            "peft_config": {
                "lora_r": RANK,
                "lora_alpha": RANK,
                "lora_dropout": 0,
                "target_modules": TARGETS,
                "task_type": "CAUSAL_LM",
                "peft_type": "LORA",
            },
        },
        "dataset": {
            "dataset_type": "sft_dataset",
            "dataset_name": str(data),
            "prompt_template": "{request}",
            "completion_template": "{source}",
            "data_seed": 42,
            "max_seq_length": SEQ,
            "dataloader_num_workers": 0,
        },
        "training": {
            "type": "sft",
            "output_dir": str(out),
            "gradient_accumulation_steps": ACCUMULATION,
            "per_device_train_batch_size": MICRO,
            "num_train_epochs": 1,
            "max_steps": steps,
            "torch_compile": False,
            "torch_dtype": dtype,
            "do_eval": False,
            "save_strategy": "no",
            "logging_steps": 1,
            "report_to": "none",
        },
        "optimizers": {"optimizer_name": "adamw", "lr": 2e-4},
        "scheduler": {"scheduler_name": "cosine"},
    }


def inputs(directory: Path, shape: str) -> tuple[Path, Path, Path]:
    """The model folder (weights and tokenizer), the dataset folder and the tokenizer file."""
    tokenizer = builtin_tokenizer(stdlib_corpus(), default_cache_dir())
    data = directory / "stdlib-functions"
    data.mkdir()
    rows = [{"request": pair["prompt"], "source": pair["completion"]} for pair in records()]
    (data / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    model = directory / "model"
    torch.manual_seed(1234)
    config = LlamaConfig(vocab_size=load_tokenizer(tokenizer).vocab_size, max_position_embeddings=SEQ, **SHAPES[shape])
    LlamaForCausalLM(config).save_pretrained(model)
    processing = PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer), eos_token="<|endoftext|>", bos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    processing.save_pretrained(model)
    return model, data, tokenizer


def nxd_run(model: Path, data: Path, out: Path, steps: int, dtype: str) -> dict[str, float]:
    config = out.parent / "qeff.yaml"
    config.write_text(yaml.safe_dump(qeff_config(model, data, out, steps, dtype), sort_keys=False))
    if nxd_main([str(config)]) != 0:
        raise SystemExit("nxd-train failed")
    return {"step_time": statistics.median(step_times(out)[2:])}


def record_lengths(model: Path, data: Path) -> list[int]:
    """Tokens per record as both frameworks tokenise it (BOS-less tokenizer: prompt + completion + EOS),
    cut to max_seq_length."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    return [min(SEQ, len(tokenizer(r["request"] + r["source"], add_special_tokens=False).input_ids) + 1) for r in rows]


def trl_run(model_dir: Path, data: Path, out: Path, steps: int, dtype: str) -> dict[str, float]:
    """QEfficient's pipeline (QEfficient/cloud/finetune_experimental.py with the sft trainer) written out."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch_dtype, attn_implementation="sdpa", use_cache=False
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = datasets.load_dataset(str(data), split="train").shuffle(seed=42)
    rows = rows.map(lambda r: {"prompt": r["request"], "completion": r["source"]}, remove_columns=["request", "source"])
    arguments = SFTConfig(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=ACCUMULATION,
        lr_scheduler_type="cosine",
        warmup_steps=100,
        bf16=dtype == "bf16",
        fp16=dtype == "fp16",
        use_cpu=not torch.cuda.is_available(),
        report_to=[],
        save_strategy="no",
        eval_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
        max_length=SEQ,
        packing=False,
        completion_only_loss=True,
        train_sampling_strategy="group_by_length",
        seed=42,
        gradient_checkpointing=False,
        torch_compile=False,
    )
    peft_config = LoraConfig(
        r=RANK, lora_alpha=RANK, lora_dropout=0.0, target_modules=TARGETS, bias="none", task_type="CAUSAL_LM"
    )
    timer = StepTimer()
    trainer = SFTTrainer(
        model=model,
        args=arguments,
        train_dataset=rows,
        processing_class=tokenizer,
        callbacks=[timer],
        peft_config=peft_config,
        optimizer_cls_and_kwargs=(torch.optim.AdamW, {"lr": 2e-4, "weight_decay": 0.01}),
    )
    trainer.train()
    return {"step_time": statistics.median(timer.durations[2:])}


def worker(framework: str, steps: int, dtype: str, shape: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        model, data, _ = inputs(directory, shape)
        run = nxd_run if framework == "nxd" else trl_run
        figures = run(model, data, directory / "out", steps, dtype)
        lengths = record_lengths(model, data)
    figures["tokens_per_s"] = MICRO * ACCUMULATION * statistics.fmean(lengths) / figures["step_time"]
    figures["records"] = len(lengths)
    figures["mean_length"] = statistics.fmean(lengths)
    figures["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    figures["peak_cuda"] = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
    print("RESULT " + json.dumps(figures))


def measured(framework: str, steps: int, dtype: str, shape: str) -> dict[str, float]:
    command = [
        sys.executable,
        __file__,
        "--worker",
        framework,
        "--steps",
        str(steps),
        "--dtype",
        dtype,
        "--shape",
        shape,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{framework} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def cpu_flags() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return "unknown"
    wanted = ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx2")
    return ", ".join(flag for flag in wanted if f" {flag}" in flags) or "none of avx2 / avx512 / amx"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--shape", default="smollm-135m", choices=sorted(SHAPES))
    parser.add_argument("--worker", choices=("nxd", "trl"), help=argparse.SUPPRESS)
    args = parse_args(parser, steps=3, dtype="fp32", shape="small")
    if args.worker:
        worker(args.worker, args.steps, args.dtype, args.shape)
        return 0
    import peft
    import transformers
    import trl

    device = (
        torch.cuda.get_device_name()
        if torch.cuda.is_available()
        else f"CPU ({cpu_flags()}), {torch.get_num_threads()} threads"
    )
    ours, theirs = (measured(name, args.steps, args.dtype, args.shape) for name in ("nxd", "trl"))
    print(
        f"device: {device}; torch {torch.__version__}, transformers {transformers.__version__}, trl "
        f"{trl.__version__}, peft {peft.__version__}"
    )
    print(
        f"{args.shape}, {args.dtype}, LoRA r={RANK}; {ours['records']} records of {ours['mean_length']:.0f} tokens "
        f"on average; {MICRO} x {ACCUMULATION} records per step; median step of steps 3-{args.steps}"
    )
    print(f"{'framework':<34} {'step s':>7} {'real tok/s':>11} {'peak RSS':>10} {'CUDA peak':>10} {'ratio':>6}")
    for label, figures in (("nxd-train (QEfficient file)", ours), ("TRL SFTTrainer + peft (QEfficient)", theirs)):
        ratio = f"{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x" if figures is ours else ""
        memory = f"{figures['peak_rss'] / 2**20:>6,.0f} MiB {figures['peak_cuda'] / 2**20:>6,.0f} MiB"
        print(f"{label:<34} {figures['step_time']:>7.3f} {figures['tokens_per_s']:>11,.0f} {memory} {ratio:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
