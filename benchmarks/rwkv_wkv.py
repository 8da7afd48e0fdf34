"""Training tokens/s of RWKV-6's WKV recurrence in nxd's chunked form against the token-by-token loop (NeoX's CUDA
kernel's order, which nxd ran before), forward and backward on the same inputs, in one process.

The two compute the same outputs and gradients to fp32 rounding (tests/models/test_rwkv.py checks the chunked form
against NeoX's kernel written out). Median of the timed repetitions after a warm-up; a layer's projections, norms and
channel mix are not included (benchmarks/layer_kinds.py times whole layers).

    uv run python benchmarks/rwkv_wkv.py [--seq 1024] [--heads 4] [--head-size 64] [--batch 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from nxd_models.rwkv import WKV_CHUNK, wkv, wkv_steps
from smoke import parse_args


def timed(function, inputs: list[torch.Tensor], repeats: int) -> float:
    times = []
    for index in range(repeats + 1):
        start = time.perf_counter()
        out = function(*inputs)
        (out.float() ** 2).mean().backward()
        if index:  # the first is a warm-up
            times.append(time.perf_counter() - start)
        for tensor in inputs:
            tensor.grad = None
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_args(parser, seq=32, heads=2, head_size=16, batch=1, repeats=1)
    generator = torch.Generator().manual_seed(0)
    shape = (args.batch, args.seq, args.heads, args.head_size)
    inputs = [torch.randn(shape, generator=generator).requires_grad_() for _ in range(3)]
    inputs.append((torch.rand(shape, generator=generator) * 4 - 5).requires_grad_())  # NeoX's decay range
    inputs.append(torch.randn(args.heads, args.head_size, generator=generator).requires_grad_())
    tokens = args.batch * args.seq
    chunked = tokens / timed(wkv, inputs, args.repeats)
    steps = tokens / timed(wkv_steps, inputs, args.repeats)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch} x {args.seq} tokens, "
        f"{args.heads} heads of {args.head_size}, chunks of {WKV_CHUNK}, fp32, forward + backward"
    )
    print("| WKV | tokens/s | / token-by-token |")
    print("|---|---:|---:|")
    print(f"| nxd chunked | {chunked:,.0f} | {chunked / steps:.2f}x |")
    print(f"| token by token (NeoX's kernel order) | {steps:,.0f} | 1.00x |")


if __name__ == "__main__":
    main()
