"""Training tokens/s of nxd's Mamba layers (PyTorch selective scan) against transformers' MambaForCausalLM (its
PyTorch path, the one it takes without the mamba-ssm kernels) on the same shape and weights, in one process.

Both models are two Mamba layers (GPT-NeoX's block: 16 states a channel, convolution of 4, inner 2 x hidden), tied
embeddings, rmsnorm; each trains on the same random tokens with AdamW (forward, backward, step), median of the timed
steps after a warm-up. The two compute the same logits (tests/models/test_mamba.py checks them to 1e-5).

    uv run python benchmarks/mamba_scan.py [--seq 512] [--hidden 256] [--steps 4]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers
from nxd_models import GPTConfig, build_causal_lm
from smoke import parse_args
from transformers import MambaConfig, MambaForCausalLM

VOCAB = 8192


def nxd_model(args: argparse.Namespace) -> torch.nn.Module:
    config = GPTConfig(
        vocab_size=VOCAB,
        num_layers=2,
        hidden_size=args.hidden,
        num_attention_heads=4,
        seq_length=args.seq,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        position_embedding_type="none",
        normalization="rmsnorm",
        attention_layers=("mamba", "mamba"),
    )
    return build_causal_lm(config, seed=0)


def reference_model(ours: torch.nn.Module, args: argparse.Namespace) -> torch.nn.Module:
    """transformers' Mamba holding nxd's weights."""
    config = MambaConfig(
        vocab_size=VOCAB,
        hidden_size=args.hidden,
        state_size=16,
        num_hidden_layers=2,
        expand=2,
        conv_kernel=4,
        use_bias=False,
        use_conv_bias=True,
        hidden_act="silu",
        time_step_rank=-(-args.hidden // 16),
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=True,
        use_mambapy=False,
    )
    model = MambaForCausalLM(config)
    weights = dict(ours.named_parameters())
    state = {
        "backbone.embeddings.weight": weights["model.embed_tokens.weight"],
        "backbone.norm_f.weight": weights["model.norm.weight"],
    }
    for index in range(2):
        state[f"backbone.layers.{index}.norm.weight"] = weights[f"model.layers.{index}.input_layernorm.weight"]
        mixer = ours.model.layers[index].mixer
        for name, value in mixer.named_parameters():
            state[f"backbone.layers.{index}.mixer.{name}"] = value.view(mixer.inner, 16) if name == "A_log" else value
    model.load_state_dict({key: value.detach().clone() for key, value in state.items()}, strict=False)
    return model


def tokens_per_second(model: torch.nn.Module, ids: torch.Tensor, steps: int, logits_of) -> float:  # noqa: ANN001
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        logits = logits_of(model, ids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return ids.numel() / statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    args = parse_args(parser, seq=64, hidden=64, batch=1, steps=1)
    ids = torch.randint(0, VOCAB, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    ours = nxd_model(args)
    theirs = reference_model(ours, args)
    with torch.no_grad():
        gap = (ours(ids[:, :64]) - theirs(ids[:, :64]).logits[..., :VOCAB]).abs().max().item()
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}, "
        f"seq {args.seq}, hidden {args.hidden}, batch {args.batch}, fp32, CPU; largest logit gap {gap:.1e}"
    )
    nxd = tokens_per_second(ours, ids, args.steps, lambda m, x: m(x))
    reference = tokens_per_second(theirs, ids, args.steps, lambda m, x: m(x).logits)
    print("| model | tokens/s |\n|---|---:|")
    print(f"| nxd mamba layers | {nxd:,.0f} |\n| transformers MambaForCausalLM (PyTorch path) | {reference:,.0f} |")
    print(f"| nxd / transformers | {nxd / reference:.2f}x |")


if __name__ == "__main__":
    main()
