"""DPO and ORPO: nxd-train against TRL's DPOTrainer and ORPOTrainer on the same model, preference pairs,
batch and precision.

    uv run --group bench python benchmarks/preference.py [--method dpo|orpo] [--steps 10] [--seq 512]

DPO runs with precomputed reference log-probs on both sides (nxd's default; TRL's
precompute_ref_log_probs=True), and the time of that reference pass is printed beside the steps.

Both train the small Llama of benchmarks/sft.py (one set of initial weights saved once) on the same
pairs built from Python's standard library: the prompt asks for a function by name and docstring, the
chosen response is its source, the rejected one the source of the next function in the list. The same
pairs in the same order (nxd's seeded sampler; TRL reads them in that order, sequentially), micro-batch
4 pairs x accumulation 2, AdamW at a constant 1e-4, clipping 1.0, fp32 (TRL's default bf16 autocast
turned off), SDPA, beta 0.1, no activation recomputation (TRL's default turned off, as nxd recomputes
nothing here),
prompts cut to 128 tokens and prompt + response to `seq` (keep_start; TRL's DPO cuts prompt + response
to `seq` only, so its token counts may differ: both are printed). Each framework runs in a process of
its own. Printed: real (non-padding) tokens of both sequences per second over the steps after
warm-up (each step's own pairs counted), peak resident memory, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

import datasets
import torch
from nxd_config import load_config
from nxd_data import PretrainingSampler
from nxd_train.corpus import builtin_tokenizer, default_cache_dir, stdlib_corpus
from nxd_train.loop import train
from nxd_train.preflight import plan_run
from sft import (  # the script's folder
    ACCUMULATION,
    LR,
    MICRO_BATCH,
    bench_config,
    records,
    step_times,
    worker_figures,
)
from throughput import StepTimer
from transformers import PreTrainedTokenizerFast

BETA, PROMPT = 0.1, 128


def pairs() -> list[dict[str, str]]:
    found = records()
    return [{"prompt": r["prompt"], "chosen": r["completion"], "rejected": found[(i + 1) % len(found)]["completion"]}
            for i, r in enumerate(found)]  # fmt: skip


def write_inputs(directory: Path, tokenizer: Path, seq: int, method: str) -> Path:
    with open(directory / "pairs.jsonl", "w") as handle:
        handle.writelines(json.dumps(pair) + "\n" for pair in pairs())
    beta = "kl_beta" if method == "dpo" else "beta"
    return bench_config(directory, directory / "pairs.jsonl", tokenizer, seq,
                        f"  {method}: {{{beta}: {BETA}, max_prompt_length: {PROMPT}, truncation_mode: keep_start}}")


WARM_UP = 2
"""Steps left out of the figures."""


def step_order(count: int, seed: int, steps: int) -> list[list[int]]:
    """The pairs of each step in nxd's order (its seeded sampler); TRL is given the pairs in this order
    and reads them sequentially, so both train on the same micro-batches."""
    sampler = iter(PretrainingSampler(count, MICRO_BATCH * ACCUMULATION, MICRO_BATCH, shuffle=True, seed=seed,
                                      steps=steps))  # fmt: skip
    return [[i for _ in range(ACCUMULATION) for i in next(sampler)] for _ in range(steps)]


def figures(tokens_per_step: list[int], times: list[float], reference: float | None) -> dict[str, float]:
    """Real (non-padding) tokens per second over the steps after warm-up, from each step's own pairs."""
    tokens, seconds = sum(tokens_per_step[WARM_UP:]), sum(times[WARM_UP:])
    return {"tokens_per_s": tokens / seconds, "step_time": seconds / len(times[WARM_UP:]),
            "per_pair": tokens / (len(times[WARM_UP:]) * MICRO_BATCH * ACCUMULATION), "reference_s": reference}


def nxd_run(config: Path, steps: int, log_dir: Path) -> dict[str, float]:
    cfg = load_config(config, [f"trainer.max_steps={steps}", f"+exp_manager.explicit_log_dir={log_dir}"])
    plan = plan_run(cfg, default_cache_dir())
    found = plan.data.train.pairs
    tokens = [sum(2 * len(found[i].prompt) + len(found[i].chosen) + len(found[i].rejected) for i in step)
              for step in step_order(len(found), cfg.seed, steps)]  # fmt: skip
    train(plan)
    log = next(log_dir.glob("nxd_log_globalrank-0*.txt")).read_text()
    reference = re.search(r"reference log-probs of .* computed in ([0-9.]+) s", log)
    return figures(tokens, step_times(log_dir), float(reference.group(1)) if reference else None)


def trl_run(tokenizer: Path, model_dir: Path, seq: int, steps: int, out: Path, method: str,
            seed: int) -> dict[str, float]:  # fmt: skip
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    processing = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer), eos_token="<|endoftext|>",
                                         pad_token="<|endoftext|>", bos_token="<|endoftext|>")  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32)
    common = dict(
        output_dir=str(out), max_steps=steps, per_device_train_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=ACCUMULATION, learning_rate=LR, weight_decay=0.0, max_grad_norm=1.0,
        lr_scheduler_type="constant", warmup_steps=0, use_cpu=not torch.cuda.is_available(), report_to=[],
        save_strategy="no", logging_steps=1000, disable_tqdm=True, dataloader_num_workers=0, max_length=seq,
        beta=BETA, seed=1234, train_sampling_strategy="sequential",
        bf16=False, gradient_checkpointing=False,  # TRL's defaults (bf16 autocast, recomputation) are not nxd's here
    )  # fmt: skip
    timer, reference = StepTimer(), []
    if method == "dpo":
        arguments, trainer_class = DPOConfig(**common, precompute_ref_log_probs=True), DPOTrainer
        precompute = DPOTrainer._precompute_ref_logps

        def timed(self, *args, **kwargs):  # the reference pass, timed
            started = time.perf_counter()
            try:
                return precompute(self, *args, **kwargs)
            finally:
                reference.append(time.perf_counter() - started)

        DPOTrainer._precompute_ref_logps = timed
    else:
        arguments, trainer_class = ORPOConfig(**common, max_completion_length=seq - PROMPT), ORPOTrainer
    everything, order = pairs(), step_order(len(pairs()), seed, steps)
    ordered = datasets.Dataset.from_list([everything[i] for step in order for i in step])
    trainer = trainer_class(model=model, args=arguments, train_dataset=ordered, processing_class=processing,
                            callbacks=[timer])  # fmt: skip
    data = trainer.train_dataset
    if method == "dpo":
        sizes = [2 * len(p) + len(c) + len(r) for p, c, r in zip(data["prompt_ids"], data["chosen_ids"],
                                                                   data["rejected_ids"], strict=True)]  # fmt: skip
    else:
        sizes = [len(c) + len(r) for c, r in zip(data["chosen_input_ids"], data["rejected_input_ids"], strict=True)]
    per_step = MICRO_BATCH * ACCUMULATION
    tokens = [sum(sizes[k * per_step : (k + 1) * per_step]) for k in range(steps)]
    trainer.train()
    return figures(tokens, timer.durations, sum(reference) if reference else None)


def worker(framework: str, seq: int, steps: int, method: str) -> None:
    tokenizer = builtin_tokenizer(stdlib_corpus(), default_cache_dir())
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        config = write_inputs(directory, tokenizer, seq, method)
        if framework == "nxd":
            found = nxd_run(config, steps, directory / "nxd")
        else:
            found = trl_run(tokenizer, directory / "model", seq, steps, directory / "trl", method,
                            load_config(config).seed)  # fmt: skip
    found["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(found))


def measured(framework: str, seq: int, steps: int, method: str) -> dict[str, float]:
    return worker_figures(__file__, framework, seq, steps, "--method", method)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--method", choices=("dpo", "orpo"), default="dpo")
    parser.add_argument("--worker", choices=("nxd", "trl"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.seq, args.steps, args.method)
        return 0
    import trl

    ours = measured("nxd", args.seq, args.steps, args.method)
    theirs = measured("trl", args.seq, args.steps, args.method)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"
    print(f"\ndevice: {device}; torch {torch.__version__}, transformers {sys.modules['transformers'].__version__}, "
          f"trl {trl.__version__}")  # fmt: skip
    print(f"{args.method.upper()}, {len(pairs())} pairs, seq {args.seq}, {MICRO_BATCH} x {ACCUMULATION} pairs per "
          f"step, the same pairs in the same order; steps {WARM_UP + 1}-{args.steps}")  # fmt: skip
    peer = "TRL DPOTrainer" if args.method == "dpo" else "TRL ORPOTrainer"
    print(f"{'framework':<16} {'tokens/pair':>11} {'reference s':>11} {'step s':>7} {'real tok/s':>11} {'peak RSS':>9} "
          f"{'ratio':>6}")  # fmt: skip
    for label, figures in (("nxd-train", ours), (peer, theirs)):
        ratio = f"{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x" if figures is ours else ""
        reference = "-" if figures["reference_s"] is None else f"{figures['reference_s']:.2f}"
        print(f"{label:<16} {figures['per_pair']:>11,.0f} {reference:>11} {figures['step_time']:>7.3f} "
              f"{figures['tokens_per_s']:>11,.0f} {figures['peak_rss'] / 2**20:>5,.0f} MiB {ratio:>6}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
