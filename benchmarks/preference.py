"""DPO, ORPO, KTO and reward models: nxd-train against TRL's DPOTrainer, ORPOTrainer, KTOTrainer and
RewardTrainer on the same model, preference data, batch and precision.

    uv run --group bench python benchmarks/preference.py [--method dpo|orpo|kto|reward_model] [--steps 10]
                                                         [--seq 512]

DPO and KTO run with precomputed reference log-probs on both sides (nxd's default; TRL's
precompute_ref_log_probs=True); that pass's rate (items per second: pairs, or KTO's examples, each
with its KL sequence) is printed beside the steps. nxd computes it for the whole data set, TRL for the
items of the steps it trains (it is given only those), so the rates compare, not the totals.
KTO's examples are each pair's chosen response (desirable) and rejected one (undesirable); TRL's KL
sequences are the batch's completions rotated, nxd's the previous record's of another prompt. The
reward model starts from the same causal LM (its score head drawn by each framework) and trains on
the pairs that fit `seq` whole (TRL's RewardTrainer drops the others).

Both train the small Llama of benchmarks/sft.py (one set of initial weights saved once) on the same
pairs built from Python's standard library: the prompt asks for a function by name and docstring, the
chosen response is its source, the rejected one the source of the next function in the list. The same
pairs in the same order (nxd's seeded sampler; TRL reads them in that order, sequentially), micro-batch
4 pairs x accumulation 2, AdamW at a constant 1e-4, clipping 1.0, fp32 (TRL's default bf16 autocast
turned off), SDPA, beta 0.1, no activation recomputation (TRL's default turned off, as nxd recomputes
nothing here),
prompts cut to 128 tokens and prompt + response to `seq` (keep_start; TRL's DPO and KTO cut prompt +
response to `seq` only, so its token counts may differ: both are printed, each counting the tokens it
trains on after its own cut). Each framework runs in a process of its own. Printed: real
(non-padding) tokens of the trained sequences per second over the steps after warm-up (each step's own
items counted; KTO's KL sequences, which no gradient flows through, not counted), peak resident
memory, and the ratio.
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
from nxd_train.checks.preflight import plan_run
from nxd_train.run.corpus import builtin_tokenizer, default_cache_dir, stdlib_corpus
from nxd_train.run.loop import train
from sft import (  # the script's folder
    ACCUMULATION,
    LR,
    MICRO_BATCH,
    bench_config,
    records,
    step_times,
    worker_figures,
)
from smoke import parse_args
from throughput import StepTimer
from transformers import PreTrainedTokenizerFast

BETA, PROMPT = 0.1, 128
PEERS = {
    "dpo": "TRL DPOTrainer",
    "orpo": "TRL ORPOTrainer",
    "kto": "TRL KTOTrainer",
    "reward_model": "TRL RewardTrainer",
}


def pairs() -> list[dict[str, str]]:
    found = records()
    return [
        {"prompt": r["prompt"], "chosen": r["completion"], "rejected": found[(i + 1) % len(found)]["completion"]}
        for i, r in enumerate(found)
    ]


def examples() -> list[dict]:
    """KTO's unpaired examples: each pair's chosen response desirable, its rejected one not."""
    return [
        {"prompt": pair["prompt"], "completion": pair[name], "label": name == "chosen"}
        for pair in pairs()
        for name in ("chosen", "rejected")
    ]


def fitting_pairs(tokenizer: Path, seq: int) -> list[dict[str, str]]:
    """The pairs whose prompt + each response (+ EOS) fit `seq` tokens whole (a reward model's data)."""
    from nxd_data import load_tokenizer

    text = load_tokenizer(tokenizer)
    fits = []
    for pair in pairs():
        prompt, chosen, rejected = text.encode([pair["prompt"], pair["chosen"], pair["rejected"]])
        if len(prompt) + max(len(chosen), len(rejected)) + 2 <= seq:
            fits.append(pair)
    return fits


def items(method: str, tokenizer: Path, seq: int) -> list[dict]:
    return {"kto": examples, "reward_model": lambda: fitting_pairs(tokenizer, seq)}.get(method, pairs)()


def write_inputs(directory: Path, tokenizer: Path, seq: int, method: str) -> Path:
    with open(directory / "data.jsonl", "w") as handle:
        handle.writelines(json.dumps(item) + "\n" for item in items(method, tokenizer, seq))
    block = {
        "dpo": f"{{kl_beta: {BETA}, ",
        "orpo": f"{{beta: {BETA}, ",
        "kto": f"{{beta: {BETA}, ",
        "reward_model": "{",
    }[method]
    return bench_config(
        directory,
        directory / "data.jsonl",
        tokenizer,
        seq,
        f"  {method}: {block}max_prompt_length: {PROMPT}, truncation_mode: keep_start}}",
    )


WARM_UP = 2
"""Steps left out of the figures."""


def step_order(count: int, seed: int, steps: int) -> list[list[int]]:
    """The pairs of each step in nxd's order (its seeded sampler); TRL is given the pairs in this order
    and reads them sequentially, so both train on the same micro-batches."""
    sampler = iter(
        PretrainingSampler(count, MICRO_BATCH * ACCUMULATION, MICRO_BATCH, shuffle=True, seed=seed, steps=steps)
    )
    return [[i for _ in range(ACCUMULATION) for i in next(sampler)] for _ in range(steps)]


def figures(
    tokens_per_step: list[int], times: list[float], reference: float | None, referenced: int | None = None
) -> dict[str, float]:
    """Real (non-padding) tokens per second over the steps after warm-up, from each step's own items,
    and the reference pass's items per second."""
    tokens, seconds = sum(tokens_per_step[WARM_UP:]), sum(times[WARM_UP:])
    return {
        "tokens_per_s": tokens / seconds,
        "step_time": seconds / len(times[WARM_UP:]),
        "per_item": tokens / (len(times[WARM_UP:]) * MICRO_BATCH * ACCUMULATION),
        "reference_s": reference,
        "reference_rate": None if not reference else referenced / reference,
    }


def nxd_run(config: Path, steps: int, log_dir: Path) -> dict[str, float]:
    cfg = load_config(config, [f"trainer.max_steps={steps}", f"+exp_manager.explicit_log_dir={log_dir}"])
    plan = plan_run(cfg, default_cache_dir())
    dataset = plan.data.train
    if hasattr(dataset, "labels"):  # KTO: the example rows (the KL rows carry no gradient)
        found = dataset.rows.pairs
        size = [len(found[i].prompt) + len(found[i].chosen) for i in range(len(found))]
    else:
        found = dataset.pairs
        size = [2 * len(pair.prompt) + len(pair.chosen) + len(pair.rejected) for pair in found]
    tokens = [sum(size[i] for i in step) for step in step_order(len(found), cfg.seed, steps)]
    train(plan)
    log = next(log_dir.glob("nxd_log_globalrank-0*.txt")).read_text()
    reference = re.search(r"reference log-probs of .* computed in ([0-9.]+) s", log)
    return figures(tokens, step_times(log_dir), float(reference.group(1)) if reference else None, len(found))


def _timed(trainer_class: type, spent: list[float]) -> None:
    """Time `trainer_class`'s reference pass into `spent`."""
    precompute = trainer_class._precompute_ref_logps

    def timed(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return precompute(self, *args, **kwargs)
        finally:
            spent.append(time.perf_counter() - started)

    trainer_class._precompute_ref_logps = timed


def trl_run(
    tokenizer: Path, model_dir: Path, seq: int, steps: int, out: Path, method: str, seed: int
) -> dict[str, float]:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer, RewardConfig, RewardTrainer
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    processing = PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer), eos_token="<|endoftext|>", pad_token="<|endoftext|>", bos_token="<|endoftext|>"
    )
    if method == "reward_model":
        model = AutoModelForSequenceClassification.from_pretrained(
            model_dir, num_labels=1, attn_implementation="sdpa", dtype=torch.float32
        )
        model.config.pad_token_id = processing.pad_token_id
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32)
    common = dict(
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
        seed=1234,
        train_sampling_strategy="sequential",
        bf16=False,
        gradient_checkpointing=False,  # TRL's defaults (bf16 autocast, recomputation) are not nxd's here
    )
    timer, reference = StepTimer(), []
    if method == "dpo":
        arguments = DPOConfig(**common, beta=BETA, max_length=seq, precompute_ref_log_probs=True)
        trainer_class = DPOTrainer
        _timed(DPOTrainer, reference)
    elif method == "kto":
        arguments = KTOConfig(**common, beta=BETA, max_length=seq, precompute_ref_log_probs=True)
        trainer_class = KTOTrainer
        _timed(KTOTrainer, reference)
    elif method == "reward_model":
        arguments, trainer_class = RewardConfig(**common, max_length=None), RewardTrainer
    else:
        arguments = ORPOConfig(**common, beta=BETA, max_length=seq, max_completion_length=seq - PROMPT)
        trainer_class = ORPOTrainer
    everything = items(method, tokenizer, seq)
    order = step_order(len(everything), seed, steps)
    ordered = datasets.Dataset.from_list([everything[i] for step in order for i in step])
    trainer = trainer_class(
        model=model, args=arguments, train_dataset=ordered, processing_class=processing, callbacks=[timer]
    )
    data = trainer.train_dataset
    if method == "dpo":  # what its collator keeps: prompt + response cut to max_length
        sizes = [
            min(len(p) + len(c), seq) + min(len(p) + len(r), seq)
            for p, c, r in zip(data["prompt_ids"], data["chosen_ids"], data["rejected_ids"], strict=True)
        ]
    elif method == "kto":
        sizes = [min(len(p) + len(c), seq) for p, c in zip(data["prompt_ids"], data["completion_ids"], strict=True)]
    elif method == "reward_model":
        sizes = [len(c) + len(r) for c, r in zip(data["chosen_ids"], data["rejected_ids"], strict=True)]
    else:
        sizes = [len(c) + len(r) for c, r in zip(data["chosen_input_ids"], data["rejected_input_ids"], strict=True)]
    per_step = MICRO_BATCH * ACCUMULATION
    tokens = [sum(sizes[k * per_step : (k + 1) * per_step]) for k in range(steps)]
    trainer.train()
    return figures(tokens, timer.durations, sum(reference) if reference else None, len(ordered))


def worker(framework: str, seq: int, steps: int, method: str) -> None:
    tokenizer = builtin_tokenizer(stdlib_corpus(), default_cache_dir())
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        config = write_inputs(directory, tokenizer, seq, method)
        if framework == "nxd":
            found = nxd_run(config, steps, directory / "nxd")
        else:
            found = trl_run(
                tokenizer, directory / "model", seq, steps, directory / "trl", method, load_config(config).seed
            )
    found["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(found))


def measured(framework: str, seq: int, steps: int, method: str) -> dict[str, float]:
    return worker_figures(__file__, framework, seq, steps, "--method", method)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--method", choices=tuple(PEERS), default="dpo")
    parser.add_argument("--worker", choices=("nxd", "trl"), help=argparse.SUPPRESS)
    args = parse_args(parser, steps=3, seq=192)  # ORPO's completions need seq above 128
    if args.worker:
        worker(args.worker, args.seq, args.steps, args.method)
        return 0
    import trl

    ours = measured("nxd", args.seq, args.steps, args.method)
    theirs = measured("trl", args.seq, args.steps, args.method)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"
    print(
        f"\ndevice: {device}; torch {torch.__version__}, transformers {sys.modules['transformers'].__version__}, "
        f"trl {trl.__version__}"
    )
    kind = "examples" if args.method == "kto" else "pairs"
    tokenizer = builtin_tokenizer(stdlib_corpus(), default_cache_dir())
    print(
        f"{args.method}, {len(items(args.method, tokenizer, args.seq))} {kind}, seq {args.seq}, {MICRO_BATCH} x "
        f"{ACCUMULATION} {kind} per step, the same {kind} in the same order; steps {WARM_UP + 1}-{args.steps}"
    )
    print(
        f"{'framework':<18} {'tokens/item':>11} {'ref items/s':>11} {'step s':>7} {'real tok/s':>11} "
        f"{'peak RSS':>9} {'ratio':>6}"
    )
    for label, figures in (("nxd-train", ours), (PEERS[args.method], theirs)):
        ratio = f"{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x" if figures is ours else ""
        rate = "-" if figures["reference_rate"] is None else f"{figures['reference_rate']:.2f}"
        print(
            f"{label:<18} {figures['per_item']:>11,.0f} {rate:>11} {figures['step_time']:>7.3f} "
            f"{figures['tokens_per_s']:>11,.0f} {figures['peak_rss'] / 2**20:>5,.0f} MiB {ratio:>6}"
        )
    if ours["reference_rate"] and theirs["reference_rate"]:
        print(f"reference pass: {ours['reference_rate'] / theirs['reference_rate']:.2f}x TRL's items per second")
    return 0


if __name__ == "__main__":
    sys.exit(main())
