"""Training tokens/s of a two-layer model per layer kind (GPT-NeoX's attention_config kinds nxd builds)
against dense causal attention of the same width, in one process.

Each kind trains the same shape (both layers of that kind) on the same random tokens with AdamW: forward,
backward and step, median of the timed steps after a warm-up. The layout's density is the share of the causal
(query, key) pairs it keeps. On CUDA a sparse layer runs FlexAttention over its blocks only; on the CPU (no
FlexAttention backward there) it runs SDPA with the layout's boolean mask, where dense attention gets the fused
causal kernel. gMLP and aMLP layers replace attention and MLP with a spatial gating unit (4 x hidden wide, gelu,
as GPT-NeoX builds them; aMLP with a 64-wide tiny attention); their "pairs" column is the causal share of the
spatial projection, which they always read whole. Mamba layers are GPT-NeoX's block (inner 2 x hidden, 16 states a
channel) with nxd's PyTorch scan, RWKV layers GPT-NeoX's RWKV-6 (4 heads of 64, channel mix 3.5 x hidden) with its
WKV recurrence in PyTorch; their column says 100% for the whole prefix their state summarises.

    uv run python benchmarks/layer_kinds.py [--seq 1024] [--hidden 256] [--steps 6]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from nxd_models import GPTConfig, SparsitySpec, build_causal_lm
from nxd_models.sparse_attention import SPARSE_KINDS, BlockSparseLayout
from smoke import parse_args

GATING_KINDS = ("gmlp", "amlp")
WHOLE_KINDS = (*GATING_KINDS, "mamba", "rwkv")
"""Kinds in place of attention and MLP (no attention pairs to keep)."""
SPARSITY = SparsitySpec(block=16, num_local_blocks=4, num_random_blocks=1)
"""NeoX's defaults but a local window of 4 blocks (configs/sparse.yml uses 32 at its longer sequences)."""


def density(kind: str, seq: int) -> float:
    """The share of causal (query, key) pairs the layout keeps."""
    if kind == "dense" or kind in WHOLE_KINDS:
        return 1.0
    mask = BlockSparseLayout(kind, SPARSITY, 1, seq, 1).mask(slice(0, 1), seq, seq, torch.device("cpu"))
    return mask.sum().item() / (seq * (seq + 1) / 2)


def tokens_per_second(kind: str, args: argparse.Namespace, device: torch.device) -> float:
    config = GPTConfig(
        vocab_size=8192,
        num_layers=2,
        hidden_size=args.hidden,
        num_attention_heads=args.heads,
        seq_length=args.seq,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        position_embedding_type="rope",
        normalization="rmsnorm",
        activation="gelu" if kind in GATING_KINDS else "swiglu",
        has_bias=False,
        attention_layers=None if kind == "dense" else (kind, kind),
        layer_settings=(SPARSITY,),
    )
    model = build_causal_lm(config, seed=0).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 8192, (args.batch, args.seq), generator=torch.Generator().manual_seed(0)).to(device)
    times = []
    for _ in range(args.steps + 1):
        start = time.perf_counter()
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return args.batch * args.seq / statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    args = parse_args(parser, seq=128, hidden=64, heads=2, batch=1, steps=1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(
        f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, seq {args.seq}, hidden "
        f"{args.hidden}, {args.heads} heads, batch {args.batch}, block {SPARSITY.block}"
    )
    dense = tokens_per_second("dense", args, device)
    print("| kind | causal pairs kept | parameters per layer | tokens/s | / dense |\n|---|---:|---:|---:|---:|")
    print(f"| dense | 100.0% | {layer_parameters('dense', args):,} | {dense:,.0f} | 1.00x |")
    for kind in (*SPARSE_KINDS, *WHOLE_KINDS):
        found = tokens_per_second(kind, args, device)
        print(
            f"| {kind} | {density(kind, args.seq):.1%} | {layer_parameters(kind, args):,} | {found:,.0f} | "
            f"{found / dense:.2f}x |",
            flush=True,
        )


def layer_parameters(kind: str, args: argparse.Namespace) -> int:
    """The weights of one layer of `kind` at the benchmark's shape."""
    config = GPTConfig(
        vocab_size=8192,
        num_layers=1,
        hidden_size=args.hidden,
        num_attention_heads=args.heads,
        seq_length=args.seq,
        position_embedding_type="rope",
        normalization="rmsnorm",
        activation="gelu" if kind in GATING_KINDS else "swiglu",
        has_bias=False,
        attention_layers=None if kind == "dense" else (kind,),
        layer_settings=(SPARSITY,),
    )
    model = build_causal_lm(config, seed=0)
    return sum(parameter.numel() for parameter in model.model.layers[0].parameters())


if __name__ == "__main__":
    main()
