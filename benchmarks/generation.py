"""Generation and evaluation speed: nxd-train's generate path and lm-eval model against transformers' `generate`
and lm-eval's `HFLM` on the exported model (same weights).

A Llama-shaped model (the tiny config widened: hidden 256, 4 layers, 8 heads, 4 key/value heads, 512 positions,
SDPA attention as transformers' model has it)
is trained one step with a checkpoint, loaded as `nxd-train generate` loads it, and exported to Hugging Face.
Generation: the same prompts (equal lengths, so transformers needs no padding), greedy, exactly --tokens new
tokens per row (no end-of-document stop), batch 1 and 8, best of --repeats; tokens/s counts the new tokens.
Evaluation: lm-eval's `simple_evaluate` on three local tasks (multiple choice, rolling perplexity,
generate-until), one task at a time, nxd's `NxdLM` against `HFLM`, both at batch size 8.

    uv run python benchmarks/generation.py [--tokens 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import tempfile
import time
from pathlib import Path

import torch
import transformers
from nxd_config import load_config
from nxd_models.generation import generate
from nxd_train.checks.preflight import plan_run
from nxd_train.cli import default_config_path
from nxd_train.commands.ckpt import export_command
from nxd_train.inference.loading import load_run
from nxd_train.run.corpus import default_cache_dir
from nxd_train.run.loop import train
from smoke import parse_args
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

SHAPE = [
    "model.hidden_size=256",
    "model.num_layers=4",
    "model.num_attention_heads=8",
    "model.num_kv_heads=4",
    "model.ffn_hidden_size=704",
    "model.encoder_seq_length=512",
    "data.micro_batch_size=1",
    "data.global_batch_size=1",
    "model.init_method_std=0.2",
    "model.fusions.flash_attention=True",
]
SMOKE_SHAPE = [
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.num_attention_heads=4",
    "model.num_kv_heads=2",
    "model.ffn_hidden_size=176",
    "model.encoder_seq_length=128",
    "data.micro_batch_size=1",
    "data.global_batch_size=1",
]
TASKS = ("nxd_choice", "nxd_text", "nxd_until")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_args(parser, tokens=4, repeats=1)
    torch.set_num_threads(torch.get_num_threads())
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        overrides = [
            *(SMOKE_SHAPE if args.smoke else SHAPE),
            "trainer.max_steps=1",
            "exp_manager.create_checkpoint_callback=True",
            "exp_manager.create_tensorboard_logger=False",
            "trainer.limit_val_batches=0",
            f"+exp_manager.explicit_log_dir={root / 'run'}",
        ]
        config = load_config(default_config_path(), overrides)
        train(plan_run(config, default_cache_dir()))
        assert export_command(root / "run", root / "hf", None, False) == 0
        run = load_run(config, default_cache_dir())
        hf = AutoModelForCausalLM.from_pretrained(root / "hf").eval()
        print(
            f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
            f"{torch.__version__}, transformers {transformers.__version__}; model {run.family.parameter_count():,} "
            f"parameters, fp32, greedy, {args.tokens} new tokens per row"
        )
        print("| batch | nxd tokens/s | transformers tokens/s | nxd / transformers |")
        print("|---:|---:|---:|---:|")
        text = run.tokenizer.encode([Path(transformers.__file__).read_text()])[0]
        for batch in (1, 8):
            prompts = [text[i * 40 : i * 40 + 32] for i in range(batch)]
            ours = _best(
                args.repeats,
                lambda p=prompts: generate(
                    run.logits,
                    run.new_cache,
                    p,
                    maximum_tokens=args.tokens,
                    context=run.context,
                    end_id=-1,
                    vocab_size=run.vocab_size,
                ),
            )
            ids = torch.tensor(prompts)
            with torch.no_grad():
                theirs = _best(
                    args.repeats,
                    lambda i=ids: hf.generate(
                        i,
                        max_new_tokens=args.tokens,
                        min_new_tokens=args.tokens,
                        do_sample=False,
                        eos_token_id=None,
                        pad_token_id=0,
                    ),
                )
            tokens = batch * args.tokens
            print(f"| {batch} | {tokens / ours:,.0f} | {tokens / theirs:,.0f} | {theirs / ours:.2f}x |")
        _evaluation(run, root, hf, limit=4 if args.smoke else None)


def _best(repeats: int, work) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def _evaluation(run, root: Path, hf, limit: int | None) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from nxd_train.inference.lm_eval_model import NxdLM

    tasks = root / "tasks"
    _write_tasks(tasks)
    manager = TaskManager(include_path=str(tasks))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(root / "hf" / "tokenizer.json"), eos_token=run.tokenizer.token(run.tokenizer.eod_id)
    )
    reference = HFLM(pretrained=hf, tokenizer=tokenizer, batch_size=8, max_length=run.context)
    ours = NxdLM(run, batch_size=8)
    print("\n| lm-eval task | nxd s | HFLM s | nxd / HFLM |")
    print("|---|---:|---:|---:|")
    for task in TASKS:
        seconds = []
        for model in (ours, reference):
            started = time.perf_counter()
            simple_evaluate(
                model=model, tasks=[task], task_manager=manager, log_samples=False, verbosity="ERROR", limit=limit
            )
            seconds.append(time.perf_counter() - started)
        print(f"| {task} | {seconds[0]:.2f} | {seconds[1]:.2f} | {seconds[1] / seconds[0]:.2f}x |")


def _write_tasks(folder: Path) -> None:
    """Three local tasks: 200 multiple-choice questions, 40 texts for rolling perplexity, 24 generate-until prompts."""
    rng = random.Random(0)
    words = [
        "def",
        "class",
        "return",
        "import",
        "self",
        "value",
        "list",
        "dict",
        "print",
        "open",
        "read",
        "write",
        "with",
        "for",
        "while",
        "if",
        "else",
    ]
    folder.mkdir()
    rows = {
        "choice": [
            {
                "question": " ".join(rng.choices(words, k=12)),
                "answer": rng.randrange(4),
                "choices": [" " + " ".join(rng.choices(words, k=3)) for _ in range(4)],
            }
            for _ in range(200)
        ],
        "text": [{"text": " ".join(rng.choices(words, k=rng.randrange(200, 700)))} for _ in range(40)],
        "prompts": [{"question": " ".join(rng.choices(words, k=8)), "answer": "x"} for _ in range(24)],
    }
    for name, records in rows.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    head = "dataset_path: json\ntest_split: test\ndataset_kwargs:\n  data_files:\n    test: {}\n"
    (folder / "nxd_choice.yaml").write_text(
        "task: nxd_choice\n" + head.format(folder / "choice.jsonl") + "output_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\n"
        "metric_list:\n  - metric: acc\n"
    )
    (folder / "nxd_text.yaml").write_text(
        "task: nxd_text\n" + head.format(folder / "text.jsonl") + "output_type: loglikelihood_rolling\n"
        "doc_to_text: ''\ndoc_to_target: '{{text}}'\nmetric_list:\n  - metric: word_perplexity\n"
    )
    (folder / "nxd_until.yaml").write_text(
        "task: nxd_until\n" + head.format(folder / "prompts.jsonl") + "output_type: generate_until\n"
        "doc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\ngeneration_kwargs:\n  until: ['\\n\\n']\n"
        "  max_gen_toks: 32\n  do_sample: false\nmetric_list:\n  - metric: exact_match\n"
    )


if __name__ == "__main__":
    main()
