"""Checkpoint save and load speed against the disk's own write speed, and the training stall of an
async save, from one run.

    uv run python benchmarks/ckpt.py [--config configs/bench_20m.yaml] [--steps 4] [--dir DIR]

The run writes a plain file of the checkpoint's size with fsync (the disk's write speed), then saves
the model, AdamW state and the rest of a training state with nxd-ckpt (synchronously: MB/s and the
ratio to the disk), loads it back into the live state (MB/s; the file is in the page cache, so this
is the read path's own cost), and finally trains: the median step time, the time the training loop
is blocked by an async save (the copy to host memory), and the step time while the save is written
in the background. The stall is reported as a fraction of the step time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from smoke import parse_args

ROOT = Path(__file__).resolve().parents[1]


def disk_write_speed(directory: Path, size: int) -> float:
    """MB/s of writing `size` bytes in 16 MiB blocks and fsyncing them."""
    block = os.urandom(16 * 2**20)
    path = directory / "disk_probe"
    started = time.perf_counter()
    with open(path, "wb") as handle:
        for _ in range(max(1, size // len(block))):
            handle.write(block)
        handle.flush()
        os.fsync(handle.fileno())
    seconds = time.perf_counter() - started
    written = path.stat().st_size
    path.unlink()
    return written / 2**20 / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "bench_20m.yaml")
    parser.add_argument("--steps", type=int, default=4, help="training steps timed before and during the async save")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary directory)")
    args = parse_args(parser, config=ROOT / "configs" / "tiny.yaml", steps=1)

    from nxd_ckpt import Checkpointer, SavePolicy, load_checkpoint
    from nxd_config import load_config
    from nxd_models import causal_lm_logits
    from nxd_precision import PrecisionOptimizer, resolve_policy
    from nxd_train.checks.preflight import plan_run
    from nxd_train.run.corpus import default_cache_dir
    from nxd_train.run.training_state import TrainingState, rng_states
    from torch.optim.lr_scheduler import LambdaLR

    cfg = load_config(args.config, ["trainer.max_steps=1"])
    plan = plan_run(cfg, default_cache_dir())
    torch.manual_seed(0)
    model = plan.family.build()
    optimizer = PrecisionOptimizer(
        model.parameters(), resolve_policy("fp32"), lambda tensors: torch.optim.AdamW(tensors, lr=1e-4)
    )
    scheduler = LambdaLR(optimizer.optimizer, lambda step: 1.0)
    training = TrainingState(model, optimizer, scheduler, use_master_weights=False)
    batch = cfg.data.micro_batch_size
    ids = torch.randint(0, plan.data.vocab_size, (batch, plan.seq_length))
    positions = torch.arange(plan.seq_length).expand(batch, -1)

    def step() -> float:
        started = time.perf_counter()
        logits = causal_lm_logits(model, ids, positions)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - started

    step()  # optimizer state exists from here on

    def state() -> dict:
        return training.state(progress={"step": 1, "consumed_samples": batch}, sampler={}, rng={"rank0": rng_states()})

    scratch = Path(tempfile.mkdtemp(dir=args.dir, prefix="nxd-ckpt-bench-"))
    try:
        sync = Checkpointer(scratch / "sync", SavePolicy(save_top_k=-1, filename="{step}"))
        started = time.perf_counter()
        path = sync.save(state(), step=1, consumed_samples=batch, metrics={})
        save_seconds = time.perf_counter() - started
        size = sum(p.stat().st_size for p in path.iterdir())
        disk = disk_write_speed(scratch, size)
        started = time.perf_counter()
        load_checkpoint(path, state())
        load_seconds = time.perf_counter() - started

        steps = [step() for _ in range(args.steps)]
        background = Checkpointer(scratch / "async", SavePolicy(save_top_k=-1, filename="{step}"), asynchronous=True)
        started = time.perf_counter()
        background.save(state(), step=2, consumed_samples=2 * batch, metrics={})
        stall = time.perf_counter() - started
        during = []
        while background.in_flight:
            during.append(step())
        background.wait()
        step_time = statistics.median(steps)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    mb = size / 2**20
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"{args.config.name}: {parameters / 1e6:.1f}M parameters, checkpoint {mb:,.1f} MiB "
        f"(model + AdamW state + scheduler + RNG), torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(f"{'':28}{'MB/s':>10}{'vs disk':>10}")
    print(f"{'disk write (fsync)':28}{disk:>10,.0f}{1:>10.2f}x")
    print(f"{'nxd-ckpt save (sync)':28}{mb / save_seconds:>10,.0f}{mb / save_seconds / disk:>10.2f}x")
    print(f"{'nxd-ckpt load':28}{mb / load_seconds:>10,.0f}{mb / load_seconds / disk:>10.2f}x")
    print(
        f"training step {step_time:.3f} s; async save blocks the loop {stall:.3f} s = {stall / step_time:.1%} "
        f"of a step; {len(during)} step(s) ran during the background write"
        + (
            f", median {statistics.median(during):.3f} s ({statistics.median(during) / step_time:.2f}x)"
            if during
            else ""
        )
    )


if __name__ == "__main__":  # the guard async checkpointing needs
    main()
