"""Mixture of experts on this CPU: tokens/s of an MoE model with its experts on every rank (EP1) and
split over two ranks (EP2), against a dense model of the same active parameters, and the share of the
step spent in the all-to-all token exchange.

    uv run --group bench python benchmarks/moe.py [--steps 5] [--seq 512]

Two fresh gloo processes (one thread each) train each layout with data parallelism (global batch 8: two
micro-batches of 2 per rank), AdamW, fp32, through nxd's own wiring (`build_parallel_model`, the step
executor with the token objective). The models are Llama-shaped (hidden 512, 4 layers, 8 heads, vocab
8192): the dense one has an MLP of ffn 1408; the MoE one 8 experts of ffn 704 with dropless top-2 routing
(each token runs two experts: the same active MLP parameters) and the load-balancing loss. The all-to-all
share is the time of the exchange's collectives (forward and backward, counts included) over the step's,
from torch's profiler on rank 0 over two further steps.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from nxd_align import TokenObjective
from nxd_models import GPTConfig, MoESpec, model_family, resident_memory, set_aux_loss_weights
from nxd_parallel import Layout, ParallelDims, build_executor, build_parallel_model, modules_of
from smoke import parse_args

WORLD, GLOBAL_BATCH, MICRO_BATCH, VOCAB = 2, 8, 2, 8192
MOE = MoESpec(num_experts=8, top_k=2, normalize_top_k_affinities=True, router_aux_loss=True, router_aux_loss_coef=0.02)
EXCHANGE = ("all_to_all", "alltoall", "wait_tensor")
"""Profiler event names of the token exchange (no other functional collective runs in these layouts)."""


def spec(seq: int, moe: bool, hidden: int = 512, layers: int = 4) -> GPTConfig:
    """The dense model, or the MoE one with each expert half as wide (the same active parameters at top-2)."""
    return GPTConfig(
        vocab_size=VOCAB,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=8,
        num_kv_heads=8,
        seq_length=seq,
        ffn_hidden_size=hidden * 11 // 8 if moe else hidden * 11 // 4,
        normalization="rmsnorm",
        activation="swiglu",
        position_embedding_type="rope",
        has_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        make_vocab_size_divisible_by=128,
        share_embeddings_and_output_weights=False,
        moe=MOE if moe else None,
    )


LAYOUTS = {"dense": (False, 1), "moe_ep1": (True, 1), "moe_ep2": (True, 2)}


def _worker(rank: int, name: str, steps: int, seq: int, directory: str, hidden: int, layers: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", store=dist.FileStore(os.path.join(directory, f"{name}.store"), WORLD), rank=rank, world_size=WORLD
    )
    try:
        result = _measure(*LAYOUTS[name], rank, steps, seq, hidden, layers)
        if rank == 0:
            torch.save(result, os.path.join(directory, f"{name}.pt"))
    finally:
        dist.destroy_process_group()


def _measure(moe: bool, ep: int, rank: int, steps: int, seq: int, hidden: int, layers: int) -> dict:
    family = model_family(spec(seq, moe, hidden, layers))
    mesh = ParallelDims(WORLD, ep=ep).build_mesh("cpu")
    model = build_parallel_model(family, Layout(), mesh, torch.device("cpu"), seed=1)
    accumulation = GLOBAL_BATCH // WORLD // MICRO_BATCH
    set_aux_loss_weights(modules_of(model), accumulation)
    executor = build_executor(model, family.token_losses, torch.device("cpu"), pp=None, microbatches=accumulation)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    generator = torch.Generator().manual_seed(rank)
    tokens = GLOBAL_BATCH * seq

    def step() -> None:
        batches = []
        for _ in range(accumulation):
            ids = torch.randint(0, VOCAB, (MICRO_BATCH, seq + 1), generator=generator)
            batches.append(
                {
                    "input_ids": ids[:, :-1],
                    "labels": ids[:, 1:],
                    "position_ids": torch.arange(seq).expand(MICRO_BATCH, seq),
                }
            )
        executor.run(batches, TokenObjective().loss, scale=WORLD / tokens)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    dist.barrier()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    step_time = (time.perf_counter() - started) / steps
    exchange = 0.0
    if ep > 1:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            started = time.perf_counter()
            for _ in range(2):
                step()
            profiled = time.perf_counter() - started
        exchange = (
            sum(
                event.self_cpu_time_total
                for event in profile.key_averages()
                if any(part in event.key for part in EXCHANGE)
            )
            / 1e6
            / profiled
        )
    return {
        "parameters": sum(p.numel() for p in family.build_on_meta().parameters()),
        "step_time": step_time,
        "tokens_per_s": tokens / step_time,
        "peak_gib": resident_memory(peak=True) / 2**30,
        "exchange_share": exchange,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    args = parse_args(parser, steps=1, seq=32, hidden=64, layers=1)
    results = {}
    with tempfile.TemporaryDirectory() as directory:
        for name in LAYOUTS:  # fresh processes per layout: each peak is its own
            mp.start_processes(
                _worker,
                args=(name, args.steps, args.seq, directory, args.hidden, args.layers),
                nprocs=WORLD,
                start_method="spawn",
            )
            results[name] = torch.load(os.path.join(directory, f"{name}.pt"))
    dense = results["dense"]["tokens_per_s"]
    print(f"torch {torch.__version__}, {WORLD} gloo processes x 1 thread, seq {args.seq}, global batch {GLOBAL_BATCH}")
    print("| layout | parameters (M) | step (s) | tokens/s | vs dense | all-to-all share | peak RSS rank 0 (GiB) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        share = f"{r['exchange_share']:.1%}" if LAYOUTS[name][1] > 1 else "-"
        print(
            f"| {name} | {r['parameters'] / 1e6:.1f} | {r['step_time']:.3f} | {r['tokens_per_s']:,.0f} | "
            f"{r['tokens_per_s'] / dense:.2f}x | {share} | {r['peak_gib']:.2f} |"
        )


if __name__ == "__main__":
    main()
