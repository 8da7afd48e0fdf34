"""Online RL: nxd-train's GRPO against TRL's GRPOTrainer (transformers generation, no vLLM) on this machine's device.

    uv run --group bench python benchmarks/grpo.py [--steps 8] [--new-tokens 32] [--width 256] [--layers 4]

Both train the same Llama (nxd's Megatron-style model and the LlamaForCausalLM of its Hugging Face mapping, from the
same initial weights, which nxd reads from the transformers folder) on the same prompts
(configs/data/addition_prompts.jsonl, single-digit sums), with the same tokenizer
(configs/data/addition_tokenizer.json; BOS first on both sides), 8 prompts a step and 8 completions each (64
completions, one micro-batch), `new_tokens` new tokens at most, temperature 1, the dapo loss, beta 0, one update a
rollout, AdamW at a constant rate of 1e-7, fp32. The reward is 1 for the right sum (an exact-match function in both).
The rate is that small so that the steps sample what the initial weights sample on both sides: Adam moves every
weight by about the rate whatever the gradient, and at 1e-4 the first rewarded completion shortens the next
steps' completions within a few steps on one side and not on the other, which times luck rather than work.

Printed per framework: completions per second and the step time (medians after the first step), how a step splits
between sampling the completions and the rest (scoring and training), the completions' mean length and the sampled
tokens per second; then the ratios nxd / TRL (the sampling streams differ, so the completions' lengths may too: the
tokens per second compare the sampling itself).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import tempfile
import time
from pathlib import Path

import datasets
import torch
from nxd_config import load_config
from nxd_train.checks.preflight import plan_run
from nxd_train.run.corpus import default_cache_dir
from nxd_train.run.loop import train
from smoke import parse_args  # benchmarks/ is the script's folder
from throughput import StepTimer, hf_model
from tokenizers import Tokenizer, processors
from transformers import PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "grpo_tiny.yaml"
DATA = ROOT / "configs" / "data"
PROMPTS, GROUP = 8, 8
RATE = 1e-7


def exact_answer(completions: list[str], answer: list[str], **_: object) -> list[float]:
    return [float(completion.strip() == expected) for completion, expected in zip(completions, answer, strict=True)]


def overrides(args: argparse.Namespace, log_dir: Path) -> list[str]:
    return [
        f"trainer.max_steps={args.steps}",
        "trainer.log_every_n_steps=1",
        f"data.train_dir={DATA / 'addition_prompts.jsonl'}",
        f"data.tokenizer.type={DATA / 'addition_tokenizer.json'}",
        f"data.micro_batch_size={PROMPTS}",
        f"data.global_batch_size={PROMPTS}",
        f"model.encoder_seq_length={8 + args.new_tokens}",
        f"model.hidden_size={args.width}",
        f"model.ffn_hidden_size={args.width * 11 // 4}",
        f"model.num_layers={args.layers}",
        "model.optim.sched.warmup_steps=0",
        f"model.optim.lr={RATE}",
        f"model.optim.sched.min_lr={RATE}",  # the example's cosine ends above it: a constant rate here
        f"model_alignment_strategy.grpo.num_generations={GROUP}",
        f"model_alignment_strategy.grpo.max_new_tokens={args.new_tokens}",
        "model_alignment_strategy.grpo.rewards=[{function: 'grpo:exact_answer'}]",
        "+model_alignment_strategy.grpo.log_completions=0",
        f"+exp_manager.explicit_log_dir={log_dir}",
    ]


def nxd_run(args: argparse.Namespace, folder: Path) -> dict[str, float]:
    start = ["+model.weight_init_only=True", f"+exp_manager.resume_from_checkpoint={folder / 'initial'}"]
    plan = plan_run(load_config(CONFIG, [*overrides(args, folder / "nxd"), *start]), default_cache_dir())
    with open(train(plan) / "metrics.csv") as handle:
        logged = [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(handle)]
    rows = [row for row in logged if "loss" in row]
    rows = rows[1:] or rows
    step = statistics.median(row["step_time"] for row in rows)
    sampling = statistics.median(row["rollouts/generation_seconds"] for row in rows)
    return {"step": step, "sampling": sampling, "length": statistics.mean(r["completions/mean_length"] for r in rows)}


def trl_run(args: argparse.Namespace, folder: Path) -> dict[str, float]:
    cfg = load_config(CONFIG, overrides(args, folder / "plan"))
    plan = plan_run(cfg, default_cache_dir())
    model = hf_model(cfg, plan)
    model.save_pretrained(folder / "initial")  # nxd starts from these weights too
    words = Tokenizer.from_file(str(DATA / "addition_tokenizer.json"))
    words.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(  # prompts begin with BOS, as nxd's do
        tokenizer_object=words,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        bos_token="<s>",
        unk_token="<unk>",
        padding_side="left",
    )
    model.config.eos_token_id = model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = model.generation_config.pad_token_id = tokenizer.pad_token_id
    records = [plan.data.train.prompts[i].record for i in range(len(plan.data.train))]
    dataset = datasets.Dataset.from_list(records * 4)
    config = GRPOConfig(
        output_dir=str(folder / "trl"),
        per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP,
        max_completion_length=args.new_tokens,
        temperature=1.0,
        loss_type="dapo",
        beta=0.0,
        learning_rate=RATE,
        lr_scheduler_type="constant",
        max_steps=args.steps,
        logging_steps=1,
        bf16=False,
        use_cpu=not torch.cuda.is_available(),
        report_to="none",
        gradient_checkpointing=False,
        save_strategy="no",
        seed=1234,
    )
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=exact_answer,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    sampled: list[float] = []
    generate = trainer._generate

    def timed(*inputs, **options):
        started = time.perf_counter()
        try:
            return generate(*inputs, **options)
        finally:
            sampled.append(time.perf_counter() - started)

    trainer._generate = timed
    trainer.train()
    lengths = [
        entry["completions/mean_length"] for entry in trainer.state.log_history if "completions/mean_length" in entry
    ]
    return {
        "step": statistics.median(timer.durations[1:] or timer.durations),
        "sampling": statistics.median(sampled[1:] or sampled),
        "length": statistics.mean(lengths) if lengths else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parse_args(parser, steps=2, new_tokens=4, width=64, layers=2)
    torch.set_num_threads(torch.get_num_threads())
    with tempfile.TemporaryDirectory() as folder:
        trl = trl_run(args, Path(folder))  # writes the initial weights both start from
        found = {"nxd GRPO": nxd_run(args, Path(folder)), "TRL GRPOTrainer": trl}
    completions = PROMPTS * GROUP
    print(
        f"\nGRPO, {PROMPTS} prompts x {GROUP} completions of up to {args.new_tokens} tokens, Llama {args.layers} x "
        f"{args.width}, fp32, {torch.get_num_threads()} threads, {args.steps} steps (medians after the first)\n"
    )
    print(
        "| framework | completions/s | step s | sampling s | scoring + training s | mean completion tokens | "
        "sampled tokens/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, figures in found.items():
        print(
            f"| {name} | {completions / figures['step']:.1f} | {figures['step']:.3f} | {figures['sampling']:.3f} | "
            f"{figures['step'] - figures['sampling']:.3f} | {figures['length']:.1f} | "
            f"{completions * figures['length'] / figures['sampling']:,.0f} |"
        )
    ours, theirs = found["nxd GRPO"], found["TRL GRPOTrainer"]
    per_token = (ours["length"] / ours["sampling"]) / (theirs["length"] / theirs["sampling"])
    print(
        f"\nnxd / TRL completions per second: {theirs['step'] / ours['step']:.2f}x; sampled tokens per second: "
        f"{per_token:.2f}x"
    )


if __name__ == "__main__":
    main()
