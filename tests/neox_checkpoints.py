"""GPT-NeoX checkpoints written as GPT-NeoX (DeepSpeed) lays them out, from transformers' own models: the parts of
each tensor-parallel rank under NeoX's parameter names (megatron/model/transformer.py, gpt2_model.py), in
`layer_XX-model_YY-model_states.pt` files (a PipelineModule's) or in `mp_rank_YY_model_states.pt` under
`module` (`sequential.XX.name`), beside `latest` naming `global_stepN`. NeoX itself does not run here; the
layout follows its checkpoint format and tools/ckpts/convert_neox_to_hf.py, which reads it back."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from transformers import GPTNeoXForCausalLM, LlamaForCausalLM

Layers = dict[int, dict[str, torch.Tensor]]
"""NeoX layer index -> that layer's tensors on one rank."""


def _pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])


def pythia_parts(
    model: GPTNeoXForCausalLM, ranks: int, padded_vocab: int, *, older_mlp_names: bool = False, parallel: bool = True
) -> list[Layers]:
    """Each rank's layers of a GPT-NeoX model (transformers' GPTNeoXForCausalLM holds NeoX's tensors whole):
    query_key_value is head by head, so a rank's rows are its heads; a row-parallel bias is split in equal
    parts that add up to it in a parallel-residual block (each rank adds its own before the sum) and held
    whole on every rank otherwise."""
    weights, config = model.state_dict(), model.config
    layers = config.num_hidden_layers
    mlp_in, mlp_out = ("dense_h_to_4h", "dense_4h_to_h") if older_mlp_names else ("linear1", "linear2")
    parts: list[Layers] = [{} for _ in range(ranks)]

    def rows(tensor: torch.Tensor) -> list[torch.Tensor]:
        return list(tensor.chunk(ranks, dim=0))

    def columns(tensor: torch.Tensor) -> list[torch.Tensor]:
        return list(tensor.chunk(ranks, dim=1))

    def whole(tensor: torch.Tensor) -> list[torch.Tensor]:
        return [tensor.clone() for _ in range(ranks)]

    def row_bias(tensor: torch.Tensor) -> list[torch.Tensor]:
        return [tensor / ranks for _ in range(ranks)] if parallel else whole(tensor)

    def put(layer: int, name: str, values: list[torch.Tensor]) -> None:
        for rank, value in enumerate(values):
            parts[rank].setdefault(layer, {})[name] = value.contiguous()

    put(0, "word_embeddings.weight", rows(_pad_rows(weights["gpt_neox.embed_in.weight"], padded_vocab)))
    for index in range(layers):
        theirs, at = f"gpt_neox.layers.{index}.", index + 2
        for norm in ("input_layernorm", "post_attention_layernorm"):
            for kind in ("weight", "bias"):
                put(at, f"{norm}.{kind}", whole(weights[f"{theirs}{norm}.{kind}"]))
        for kind in ("weight", "bias"):
            put(at, f"attention.query_key_value.{kind}", rows(weights[f"{theirs}attention.query_key_value.{kind}"]))
            put(at, f"mlp.{mlp_in}.{kind}", rows(weights[f"{theirs}mlp.dense_h_to_4h.{kind}"]))
        put(at, "attention.dense.weight", columns(weights[f"{theirs}attention.dense.weight"]))
        put(at, "attention.dense.bias", row_bias(weights[f"{theirs}attention.dense.bias"]))
        put(at, f"mlp.{mlp_out}.weight", columns(weights[f"{theirs}mlp.dense_4h_to_h.weight"]))
        put(at, f"mlp.{mlp_out}.bias", row_bias(weights[f"{theirs}mlp.dense_4h_to_h.bias"]))
    for kind in ("weight", "bias"):
        put(layers + 3, f"norm.{kind}", whole(weights[f"gpt_neox.final_layer_norm.{kind}"]))
    put(layers + 4, "final_linear.weight", rows(_pad_rows(weights["lm_head.weight"], padded_vocab)))
    return parts


def llama_parts(model: LlamaForCausalLM, ranks: int, padded_vocab: int) -> list[Layers]:
    """Each rank's layers of a Llama-shaped NeoX model: with fewer key/value heads than query heads a rank's
    query_key_value is [its queries | its keys | its values] (else head by head), linear1 is [up | gate] of
    its share, RMSNorm's weight is `scale`; no biases."""
    weights, config = model.state_dict(), model.config
    layers, heads, kv_heads = config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads
    dim = config.hidden_size // heads
    parts: list[Layers] = [{} for _ in range(ranks)]

    def put(layer: int, name: str, values: list[torch.Tensor]) -> None:
        for rank, value in enumerate(values):
            parts[rank].setdefault(layer, {})[name] = value.contiguous()

    put(0, "word_embeddings.weight", list(_pad_rows(weights["model.embed_tokens.weight"], padded_vocab).chunk(ranks)))
    for index in range(layers):
        theirs, at = f"model.layers.{index}.", index + 2
        put(at, "input_layernorm.scale", [weights[f"{theirs}input_layernorm.weight"]] * ranks)
        put(at, "post_attention_layernorm.scale", [weights[f"{theirs}post_attention_layernorm.weight"]] * ranks)
        q, k, v = (weights[f"{theirs}self_attn.{name}_proj.weight"].chunk(ranks) for name in "qkv")
        if kv_heads == heads:
            qkv = [
                torch.stack([part.reshape(heads // ranks, dim, -1) for part in (q[r], k[r], v[r])], dim=1).reshape(
                    -1, config.hidden_size
                )
                for r in range(ranks)
            ]
        else:
            qkv = [torch.cat([q[r], k[r], v[r]]) for r in range(ranks)]
        put(at, "attention.query_key_value.weight", qkv)
        put(at, "attention.dense.weight", list(weights[f"{theirs}self_attn.o_proj.weight"].chunk(ranks, dim=1)))
        up, gate = (weights[f"{theirs}mlp.{name}_proj.weight"].chunk(ranks) for name in ("up", "gate"))
        put(at, "mlp.linear1.weight", [torch.cat([up[r], gate[r]]) for r in range(ranks)])
        put(at, "mlp.linear2.weight", list(weights[f"{theirs}mlp.down_proj.weight"].chunk(ranks, dim=1)))
    put(layers + 3, "norm.scale", [weights["model.norm.weight"]] * ranks)
    put(layers + 4, "final_linear.weight", list(_pad_rows(weights["lm_head.weight"], padded_vocab).chunk(ranks)))
    return parts


def write_neox_checkpoint(load: Path, parts: list[Layers], *, iteration: int, pipelined: bool) -> Path:
    """`parts` saved as GPT-NeoX saves at `iteration` into its load folder `load`; the checkpoint folder. Each
    mp_rank file holds DeepSpeed's client state too (iteration, random states as numpy and python keep them)."""
    folder = load / f"global_step{iteration}"
    folder.mkdir(parents=True)
    client = {
        "iteration": iteration,
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "args": {"num_layers": len(parts[0]) - 3},
        "global_steps": iteration,
        "dp_world_size": 1,
        "mp_world_size": len(parts),
    }
    for rank, layers in enumerate(parts):
        if pipelined:
            for layer, tensors in layers.items():
                torch.save(tensors, folder / f"layer_{layer:02d}-model_{rank:02d}-model_states.pt")
            module = None
        else:
            module = {
                f"sequential.{layer}.{name}": value
                for layer, tensors in layers.items()
                for name, value in tensors.items()
            }
        torch.save({"module": module, **client}, folder / f"mp_rank_{rank:02d}_model_states.pt")
    (load / "latest").write_text(f"global_step{iteration}")
    return folder
