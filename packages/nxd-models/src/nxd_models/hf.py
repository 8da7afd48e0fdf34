"""Hugging Face causal LMs built from a local config.json (never a download), with NxDT's overrides."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ModelConfigError
from .gpt import EMBEDDING_NORMS_OUTPUT_PLAN, moe_tp_plan
from .hf_moe import moe_of, set_moe
from .hf_qkv import PROJECTIONS, qkv_linear_of, set_qkv_linear
from .moe import MoESpec

if TYPE_CHECKING:
    from transformers import PretrainedConfig

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3")
"""Decoder families whose layout (q/k/v/o and gate/up/down projections or Mixtral's experts, RMSNorm,
RoPE) nxd shards."""


@dataclass(frozen=True)
class HFOverrides:
    """The `model` keys NxDT lets a user set over config.json (None keeps the file's value)."""

    num_layers: int | None = None
    hidden_size: int | None = None
    max_position_embeddings: int | None = None
    rope_theta: float | None = None
    qkv_linear: bool = False
    """NxDT's QKV module (see `hf_qkv`); `fuse_qkv` computes it in one matmul."""
    fuse_qkv: bool = True
    moe: MoESpec | None = None
    """The `model.moe` block: a Mixtral's experts and routing (see `hf_moe`)."""


def load_hf_config(path: str | Path, overrides: HFOverrides = HFOverrides()) -> PretrainedConfig:
    """Read config.json (a file, or a directory holding one) and apply the overrides."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ModelConfigError(
            f"model.model_config: expected a config.json file or a directory with one, found no file at {file}"
        )
    try:
        raw = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ModelConfigError(f"{file}: expected a JSON object, found unreadable content ({error})") from None
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if model_type not in SUPPORTED_MODEL_TYPES:
        architectures = raw.get("architectures") if isinstance(raw, dict) else None
        raise ModelConfigError(
            f"{file}: model_type: expected one of {', '.join(SUPPORTED_MODEL_TYPES)}, found {model_type!r}"
            + (f" (architectures {architectures})" if architectures else "")
        )
    try:
        from transformers import AutoConfig
    except ImportError:
        raise ModelConfigError(
            f"{file}: a Hugging Face model needs transformers, which is not installed; install "
            "nxd-models[hf] (pip install 'nxd-models[hf]')"
        ) from None
    try:
        config = AutoConfig.for_model(**raw)
    except (TypeError, ValueError) as error:
        raise ModelConfigError(f"{file}: transformers rejects this {model_type} config: {error}") from None
    if overrides.num_layers is not None:
        config.num_hidden_layers = overrides.num_layers
        if getattr(config, "layer_types", None):  # keep the file's pattern (e.g. sliding/full alternation)
            pattern = config.layer_types
            config.layer_types = [pattern[i % len(pattern)] for i in range(overrides.num_layers)]
    if overrides.hidden_size is not None:
        config.hidden_size = overrides.hidden_size
    if overrides.max_position_embeddings is not None:
        config.max_position_embeddings = overrides.max_position_embeddings
    if overrides.rope_theta is not None:
        config.rope_parameters = {
            **(config.rope_parameters or {"rope_type": "default"}),
            "rope_theta": overrides.rope_theta,
        }
    set_qkv_linear(config, overrides.qkv_linear, overrides.fuse_qkv)
    set_moe(config, overrides.moe, str(file))
    return config


def hf_tp_plan(config: PretrainedConfig) -> dict[str, str]:
    """The family's own TP plan (transformers' `base_model_tp_plan`) under `model.`, plus the
    embedding, norms and output layer in nxd's vocabulary of styles; key and value projections are
    `colwise_kv` (kv_replicator may replicate them), or all three one `qkv` module under qkv_linear."""
    plan = {}
    qkv_linear = qkv_linear_of(config) is not None
    moe = moe_of(config) is not None
    for pattern, style in (config.base_model_tp_plan or {}).items():
        if moe and ".mlp." in f"{pattern}.":  # transformers' experts: nxd's MoE layer replaces them
            continue
        if qkv_linear and pattern.endswith(tuple(f"self_attn.{name}" for name in PROJECTIONS)):
            plan[f"model.{pattern.rpartition('.')[0]}.qkv_proj"] = "qkv"
            continue
        kv = pattern.endswith(("self_attn.k_proj", "self_attn.v_proj")) and style == "colwise"
        plan[f"model.{pattern}"] = "colwise_kv" if kv else style
    if moe:
        plan.update(moe_tp_plan(range(config.num_hidden_layers)))
    return {**plan, **EMBEDDING_NORMS_OUTPUT_PLAN}
