"""Pipeline schedules and context parallel, from one run:

    uv run python benchmarks/pipeline_context.py [--steps 6] [--seq 4096] [--attention-seq 8192]

1. Step time of PP2 with 1F1B against PP2 with interleaved 1F1B (2 virtual stages per rank), on
   bench_20m (8 layers) with 8 micro-batches per step, launched as a user launches them (nxd-train).
2. Step time of CP1 (one process, SDPA) against CP2 (two processes, ring attention) on a 2-layer
   model at a long sequence, same global batch, the same total CPU threads.
3. Activation memory of the attention alone at a longer sequence: the bytes it keeps for backward
   (saved tensors) and the growth of the process's peak resident memory during forward + backward,
   for CP1 (SDPA on the whole sequence) and CP2 (ring attention on half of it, per rank).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parallel_overhead import ROOT, step_times  # noqa: E402
from smoke import TINY_MODEL, parse_args  # noqa: E402

PP_OVERRIDES = [
    "trainer.devices=2",
    "+distributed_strategy.pipeline_model_parallel_size=2",
    "data.micro_batch_size=1",
    "data.global_batch_size=8",
]
PP_LAYOUTS = {
    "PP2 1F1B": PP_OVERRIDES,
    "PP2 interleaved (v=2)": [*PP_OVERRIDES, "+distributed_strategy.virtual_pipeline_model_parallel_size=2"],
}


def long_sequence_layouts(seq: int) -> dict[str, list[str]]:
    model = [
        "model.num_layers=2",
        f"model.encoder_seq_length={seq}",
        f"data.seq_length={seq}",
        f"+model.max_position_embeddings={seq}",
        "data.micro_batch_size=1",
        "data.global_batch_size=2",
    ]
    return {
        "CP1": [*model, "trainer.devices=1", "distributed_strategy.zero1=False"],
        "CP2": [
            *model,
            "trainer.devices=2",
            "distributed_strategy.zero1=False",
            "+distributed_strategy.context_parallel_size=2",
            "+model.fusions.ring_attention=True",
        ],
    }


HEADS, KV_HEADS, HEAD_DIM = 8, 2, 64


def _attention_memory(rank: int, world: int, seq: int, directory: str) -> None:
    """Forward + backward of one attention call; records saved bytes and peak-RSS growth."""
    from nxd_parallel import ring_attention, split_sequence

    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group(
            "gloo", store=dist.FileStore(os.path.join(directory, "store"), world), rank=rank, world_size=world
        )
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, HEADS, seq, HEAD_DIM, generator=generator)
    k, v = (torch.randn(1, KV_HEADS, seq, HEAD_DIM, generator=generator) for _ in range(2))
    if world > 1:
        q, k, v = (split_sequence(t, world, rank, dim=2) for t in (q, k, v))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    saved = []

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.data_ptr() not in {t.data_ptr() for t in (q, k, v)}:  # the inputs exist anyway
            saved.append(tensor.nbytes)
        return tensor

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        if world > 1:
            out = ring_attention(q, k, v, group=dist.group.WORLD)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out.sum().backward()
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    torch.save({"saved": sum(saved), "peak": peak}, os.path.join(directory, f"{world}-{rank}.pt"))
    if world > 1:
        dist.destroy_process_group()


def attention_memory(seq: int) -> dict[str, dict[str, int]]:
    figures = {}
    for world in (1, 2):
        with tempfile.TemporaryDirectory() as directory:
            mp.start_processes(_attention_memory, args=(world, seq, directory), nprocs=world, start_method="spawn")
            per_rank = [torch.load(os.path.join(directory, f"{world}-{rank}.pt")) for rank in range(world)]
        figures[f"CP{world}"] = {key: max(r[key] for r in per_rank) for key in ("saved", "peak")}
    return figures


def _median(times: list[float]) -> float:
    return statistics.median(times[2:] if len(times) > 3 else times)  # after warm-up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--attention-seq", type=int, default=8192)
    args = parse_args(parser, steps=1, seq=128, attention_seq=256)
    config = ROOT / "configs" / "bench_20m.yaml"
    shrunk = [*TINY_MODEL, "model.num_layers=4"] if args.smoke else []  # pp x v = 4 divides the layers
    print(f"torch {torch.__version__}, {os.cpu_count()} CPU threads")

    print("\n1. bench_20m, 8 layers, global batch 8 = 8 micro-batches of 1 x 512 tokens, 2 processes")
    pipeline = {
        name: _median(step_times(config, [*shrunk, *overrides], args.steps, 2))
        for name, overrides in PP_LAYOUTS.items()
    }
    base = pipeline["PP2 1F1B"]
    for name, seconds in pipeline.items():
        print(f"  {name:<24} {seconds:7.3f} s/step  {seconds / base:5.2f}x")

    print(f"\n2. 2 layers of bench_20m's width, global batch 2 x {args.seq} tokens")
    context = {
        name: _median(step_times(config, [*shrunk, *overrides], args.steps, 2 if name == "CP2" else 1))
        for name, overrides in long_sequence_layouts(args.seq).items()
    }
    for name, seconds in context.items():
        print(f"  {name:<24} {seconds:7.3f} s/step  {context['CP1'] / seconds:5.2f}x speed of CP1")

    print(
        f"\n3. one causal attention, {HEADS} query / {KV_HEADS} key-value heads x {HEAD_DIM}, "
        f"{args.attention_seq} tokens, fp32 (per rank)"
    )
    memory = attention_memory(args.attention_seq)
    for name, figures in memory.items():
        print(
            f"  {name:<6} saved for backward {figures['saved'] / 2**20:8.1f} MiB "
            f"({figures['saved'] / memory['CP1']['saved']:.2f}x)   "
            f"peak RSS growth {figures['peak'] / 2**20:8.1f} MiB "
            f"({figures['peak'] / max(memory['CP1']['peak'], 1):.2f}x)"
        )  # CP1's may not grow at all


if __name__ == "__main__":
    main()
