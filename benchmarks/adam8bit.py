"""8-bit Adam's optimizer state and step time against bitsandbytes' own Adam8bit and torch's fused AdamW, from
one run.

    uv run python benchmarks/adam8bit.py [--steps 5]

The model is bench_125m's shape (12 layers, 768 wide, SwiGLU 2048, untied output layer) with a 32,000-token
vocabulary, in fp32 on one process. Each optimizer steps the same random gradients; the table gives the bytes of
state it keeps and its median step time, and the ratios of nxd's adam8bit to the two peers. Also checked: nxd's
weights equal bitsandbytes' after the steps (the same kernels)."""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import bitsandbytes as bnb
import torch
from nxd_models import GPTConfig, build_causal_lm
from nxd_precision.adam8bit import Adam8bit
from smoke import parse_args

SHAPE = GPTConfig(
    vocab_size=32000,
    num_layers=12,
    hidden_size=768,
    num_attention_heads=12,
    seq_length=1024,
    ffn_hidden_size=2048,
    normalization="rmsnorm",
    activation="swiglu",
    position_embedding_type="rope",
    has_bias=False,
    share_embeddings_and_output_weights=False,
)
SMOKE_SHAPE = GPTConfig(
    vocab_size=512,
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    seq_length=64,
    ffn_hidden_size=176,
    normalization="rmsnorm",
    activation="swiglu",
    position_embedding_type="rope",
    has_bias=False,
    share_embeddings_and_output_weights=False,
)


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(
        value.nbytes
        for state in optimizer.state.values()
        for key, value in state.items()
        if torch.is_tensor(value) and value.ndim and not key.startswith("qmap")
    )


def run(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> list[float]:
    times = []
    for step in range(steps):
        generator = torch.Generator().manual_seed(step)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=generator) * 1e-3
        started = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    args = parse_args(parser, steps=1)
    torch.manual_seed(0)
    base = build_causal_lm(SMOKE_SHAPE if args.smoke else SHAPE)
    values = sum(p.numel() for p in base.parameters())
    options = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    rows, models = [], {}
    for name, make in (
        ("nxd adam8bit", lambda ps: Adam8bit(ps, **options)),
        ("bitsandbytes Adam8bit", lambda ps: bnb.optim.Adam8bit(ps, **options)),
        ("torch AdamW (fused)", lambda ps: torch.optim.AdamW(ps, fused=True, **options)),
    ):
        model = copy.deepcopy(base)
        optimizer = make(list(model.parameters()))
        times = run(model, optimizer, args.steps)
        models[name] = model
        rows.append((name, state_bytes(optimizer), statistics.median(times[1:] or times)))
    pairs = zip(models["nxd adam8bit"].parameters(), models["bitsandbytes Adam8bit"].parameters(), strict=True)
    equal = all(torch.equal(a, b) for a, b in pairs)
    print(
        f"{'smoke' if args.smoke else 'bench_125m'} shape: {values / 1e6:.1f}M parameters, fp32, {args.steps} steps, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, bitsandbytes {bnb.__version__}"
    )
    print("| optimizer | state (MiB) | bytes per value | median step (ms) |")
    print("|---|---:|---:|---:|")
    for name, size, seconds in rows:
        print(f"| {name} | {size / 2**20:,.1f} | {size / values:.3f} | {seconds * 1e3:,.0f} |")
    ours, peer, adamw = rows
    print(
        f"nxd / bitsandbytes: state {ours[1] / peer[1]:.3f}x, step time {ours[2] / peer[2]:.2f}x; "
        f"nxd / AdamW: state {ours[1] / adamw[1]:.3f}x, step time {ours[2] / adamw[2]:.2f}x; "
        f"weights equal to bitsandbytes': {equal}"
    )


if __name__ == "__main__":
    main()
