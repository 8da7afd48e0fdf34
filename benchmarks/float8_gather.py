"""ZeRO-3's weight gathers with `precision.fp8.all_gather` against gathers in the parameters' dtype, from one run of
two gloo processes on the CPU (torchao's emulated float8).

    uv run python benchmarks/float8_gather.py [--steps 3]

The model is a 4-layer Llama shape 512 wide (SwiGLU 1408, 8,192-token vocabulary), fp32 parameters, ZeRO-3 over 2
processes. Each setting trains the same batches; the table gives the bytes each rank passes to FSDP2's all-gathers
per step (counted at torch.distributed), the median step time and the losses' largest difference between the two.
On the CPU the float8 matmuls are emulated, so the time is not the GPU's; the bytes are what a GPU's NCCL moves."""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from functools import partial

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from nxd_models import GPTConfig, model_family
from nxd_parallel import Layout, ParallelDims, build_parallel_model
from nxd_precision import Float8Spec, prepare_parameters, resolve_policy
from smoke import parse_args

SHAPE = GPTConfig(
    vocab_size=8192,
    num_layers=4,
    hidden_size=512,
    num_attention_heads=8,
    seq_length=256,
    ffn_hidden_size=1408,
    normalization="rmsnorm",
    activation="swiglu",
    position_embedding_type="rope",
    has_bias=False,
    share_embeddings_and_output_weights=False,
    hidden_dropout=0.0,
    attention_dropout=0.0,
)
SMOKE_SHAPE = GPTConfig(
    vocab_size=512,
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    seq_length=32,
    ffn_hidden_size=176,
    normalization="rmsnorm",
    activation="swiglu",
    position_embedding_type="rope",
    has_bias=False,
    share_embeddings_and_output_weights=False,
    hidden_dropout=0.0,
    attention_dropout=0.0,
)
"""Widths stay multiples of 16, so that the layers still swap to float8."""
MICRO_BATCH = 2


def _counting(gathered: list[int]):  # noqa: ANN202
    """torch.distributed.all_gather_single, counting the bytes this rank sends."""
    original = dist.all_gather_single

    def counted(output: torch.Tensor, input: torch.Tensor, *args, **kwargs):  # noqa: A002, ANN002, ANN003, ANN202
        gathered.append(input.numel() * input.element_size())
        return original(output, input, *args, **kwargs)

    return counted


def _train(float8_gather: bool, steps: int, shape: GPTConfig) -> tuple[list[float], list[float], list[int]]:
    family = model_family(shape)
    policy = resolve_policy("fp32", float8=Float8Spec(emulate=True, all_gather=float8_gather))
    mesh = ParallelDims(dist.get_world_size()).build_mesh("cpu")
    model = build_parallel_model(
        family,
        Layout(zero1=True, zero3=True),
        mesh,
        torch.device("cpu"),
        seed=0,
        prepare=partial(prepare_parameters, policy=policy),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(dist.get_rank())
    losses, times, per_step = [], [], []
    gathered: list[int] = []
    dist.all_gather_single, original = _counting(gathered), dist.all_gather_single
    try:
        for _ in range(steps):
            ids = torch.randint(0, shape.vocab_size, (MICRO_BATCH, shape.seq_length + 1), generator=generator)
            gathered.clear()
            started = time.perf_counter()
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - started)
            per_step.append(sum(gathered))
            losses.append(loss.item())
    finally:
        dist.all_gather_single = original
    return losses, times, per_step


def _worker(rank: int, world: int, directory: str, steps: int, shape: GPTConfig) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", store=dist.FileStore(os.path.join(directory, "store"), world), rank=rank, world_size=world
    )
    results = {setting: _train(setting, steps, shape) for setting in (False, True)}
    if rank == 0:
        torch.save(results, os.path.join(directory, "results.pt"))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    args = parse_args(parser, steps=1)
    shape = SMOKE_SHAPE if args.smoke else SHAPE
    with tempfile.TemporaryDirectory() as directory:
        mp.start_processes(_worker, args=(2, directory, args.steps, shape), nprocs=2, start_method="spawn")
        results = torch.load(os.path.join(directory, "results.pt"), weights_only=True)
    print(f"{'gathers':<28}{'MiB gathered / step / rank':>28}{'median step (s)':>18}")
    rows = {}
    for setting, name in ((False, "in the parameters' dtype"), (True, "float8 (all_gather: true)")):
        losses, times, per_step = results[setting]
        rows[setting] = (statistics.median(per_step) / 2**20, statistics.median(times))
        print(f"{name:<28}{rows[setting][0]:>28.2f}{rows[setting][1]:>18.2f}")
    print(
        f"ratio float8 / parameters' dtype: bytes {rows[True][0] / rows[False][0]:.3f}, "
        f"time {rows[True][1] / rows[False][1]:.2f}"
    )
    difference = max(abs(a - b) for a, b in zip(results[False][0], results[True][0], strict=True))
    print(f"largest loss difference: {difference:.1e}")


if __name__ == "__main__":
    main()
