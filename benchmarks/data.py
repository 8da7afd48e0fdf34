"""Data pipeline speed: preprocessing tokens/s with 1 and 2 workers, and the data loader's samples/s
against the samples/s a training step consumes, from one run.

    uv run python benchmarks/data.py [--copies 3] [--steps 6] [--batches 200]

The corpus is the built-in one (Python's standard-library sources) written `--copies` times to a
jsonl file and tokenised by the built-in BPE. For the tiny default config and configs/bench_20m.yaml
the script trains `--steps` steps on the preprocessed data (nxd's loop, median samples/s of the
steps after the first), then reads `--batches` micro-batches through the same dataset, sampler and
DataLoader with 0 and 2 worker processes, and prints loader samples/s over training samples/s: the
headroom (above 1 the loader is never the bottleneck).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from nxd_config import load_config
from nxd_data import PretrainingSampler, WithPadding, collate, preprocess_jsonl
from nxd_train.checks.preflight import plan_run
from nxd_train.cli import default_config_path
from nxd_train.run.corpus import builtin_tokenizer, default_cache_dir, stdlib_corpus
from nxd_train.run.loop import train
from smoke import parse_args
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"tiny": default_config_path(), "bench_20m": ROOT / "configs" / "bench_20m.yaml"}


def training_samples_per_second(config: Path, overrides: list[str], log_dir: Path) -> float:
    cfg = load_config(config, [*overrides, f"+exp_manager.explicit_log_dir={log_dir}"])
    train(plan_run(cfg, default_cache_dir()))
    with open(log_dir / "metrics.csv") as handle:
        rates = [float(row["samples_per_s"]) for row in csv.DictReader(handle) if row.get("samples_per_s")]
    return statistics.median(rates[1:])


def loader_samples_per_second(config: Path, overrides: list[str], batches: int, workers: int) -> float:
    cfg = load_config(config, overrides)
    data = plan_run(cfg, default_cache_dir()).data
    sampler = PretrainingSampler(
        len(data.train),
        cfg.global_batch_size,
        cfg.data.micro_batch_size,
        steps=batches * cfg.data.micro_batch_size // cfg.global_batch_size + 1,
    )
    loader = DataLoader(
        WithPadding(data.train, data.padding), batch_sampler=sampler, collate_fn=collate, num_workers=workers
    )
    iterator = iter(loader)
    next(iterator)  # worker start-up is paid once per run, not per batch
    started, samples = time.perf_counter(), 0
    for _, batch in zip(range(batches), iterator, strict=False):
        samples += len(batch["input_ids"])
    return samples / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--documents", type=int, default=None, help="the corpus's first N documents (default: all)")
    args = parse_args(parser, copies=1, steps=2, batches=2, configs="tiny", documents=200)
    corpus = stdlib_corpus()
    tokenizer = builtin_tokenizer(corpus, default_cache_dir())
    documents = corpus.documents[: args.documents]
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "corpus.jsonl"
        with source.open("w") as handle:
            for _ in range(args.copies):
                handle.writelines(json.dumps({"text": document}) + "\n" for document in documents)
        size = source.stat().st_size
        print(f"corpus: {len(documents) * args.copies} documents, {size / 1e6:.1f} MB of jsonl")
        rates = {}
        for workers in (1, 2):
            summary = preprocess_jsonl(
                [source], Path(scratch) / f"w{workers}", tokenizer, append_eod=True, workers=workers, progress=False
            )
            rates[workers] = summary.tokens_per_second
            print(
                f"preprocess, {workers} worker(s): {summary.tokens:,} tokens in {summary.seconds:.2f} s = "
                f"{summary.tokens_per_second:,.0f} tokens/s ({size / 1e6 / summary.seconds:.2f} MB/s)"
            )
        print(f"preprocess speed-up 2 workers / 1 worker: {rates[2] / rates[1]:.2f}x")
        prefix = str(Path(scratch) / "w2_text_document")
        data = [f"+data.data_prefix={prefix}", f"+data.tokenizer.type={tokenizer}"]
        rows = []
        for name in args.configs.split(","):
            config = CONFIGS[name]
            overrides = [
                *data,
                f"trainer.max_steps={args.steps}",
                "trainer.log_every_n_steps=1",
                "trainer.limit_val_batches=0",
                "trainer.limit_test_batches=0",
            ]
            if name == "tiny":
                overrides += [
                    f"model.optim.sched.max_steps={args.steps}",
                    "exp_manager.create_tensorboard_logger=False",
                ]
            training = training_samples_per_second(config, overrides, Path(scratch) / f"run-{name}")
            loaders = [loader_samples_per_second(config, overrides, args.batches, workers) for workers in (0, 2)]
            rows.append((name, training, *loaders))
    print()
    print(
        f"{'config':<10} {'train samples/s':>15} {'loader, 0 workers':>18} {'loader, 2 workers':>18} "
        f"{'headroom (0 / 2 workers)':>25}"
    )
    for name, training, inline, workers in rows:
        print(
            f"{name:<10} {training:>15,.1f} {inline:>18,.0f} {workers:>18,.0f} "
            f"{inline / training:>15,.0f}x / {workers / training:,.0f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
