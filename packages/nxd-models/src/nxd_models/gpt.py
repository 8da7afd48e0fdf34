"""The Megatron-style decoder: GPT / Llama shapes from NxDT's `model` keys.

Module names follow Hugging Face's causal-LM layout (`model.embed_tokens`, `model.layers.N.self_attn.q_proj`,
`lm_head` ...) so that pipeline cuts read the same for both model families and the Hugging Face key
mapping of a Llama-shaped model is a rename-free table (see `hf_mapping.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .activations import ACTIVATIONS
from .attention import (
    MASKED_ROWS_UP_TO,
    AttentionKernel,
    CoreAttention,
    Spans,
    apply_rotary,
    document_mask,
    document_spans,
    rotary_cos_sin,
    sliding_window_mask,
)
from .distributed_types import is_dtensor
from .errors import ModelConfigError
from .init_methods import INIT_METHODS, init_weight, normal_std
from .kv_cache import KVCache, LayerCache, decoding_mask
from .layer_kinds import LayerKind, kinds_of, layer_kind, layer_kinds
from .maximal_update import MupSpec, Width, widths
from .moe import Experts, MoELayer, MoESpec
from .norms import NORMS, QueryKeyNorm, ScaleNorm, build_norm
from .positions import RelativePositionBias, StableEmbedding, alibi_bias, alibi_slopes, sinusoidal_embedding
from .qkv import QKVLinear, qkv_part_unit
from .recompute_units import ActivationMultiplyMLP
from .score_head import ScoreHead
from .token_losses import IGNORE_INDEX, LOSS_TEMPERATURE, chunked_token_cross_entropy

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask


@dataclass(frozen=True)
class GPTConfig:
    """Architecture of the Megatron-style decoder (plain values; nxd-train fills them from `model`)."""

    vocab_size: int
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    ffn_hidden_size: int | None = None
    num_kv_heads: int | None = None
    kv_channels: int | None = None
    max_position_embeddings: int | None = None
    init_method_std: float = 0.02
    use_scaled_init_method: bool = True
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    ffn_dropout: float = 0.0
    apply_query_key_layer_scaling: bool = True
    normalization: str = "layernorm"
    layernorm_epsilon: float = 1e-5
    qk_layernorm: bool = False
    """GPT-NeoX's use_qk_layernorm: a norm of the queries and keys of each token (see `QueryKeyNorm`)."""
    transformer_block_type: str = "pre_ln"
    make_vocab_size_divisible_by: int = 128
    tensor_parallel_size: int = 1
    share_embeddings_and_output_weights: bool = True
    position_embedding_type: str = "learned_absolute"
    position_embedding_offset: int = 0
    """Added to the position ids before the learned or sinusoidal table (OPT's learned positions start at 2)."""
    position_embedding_multiplier: float = 1.0
    """The learned or sinusoidal position embeddings are multiplied by it (GPT-NeoX's mup_rp_embedding_mult)."""
    position_embedding_norm: bool = False
    """The learned position table is bitsandbytes' StableEmbedding (`StableEmbedding`: a LayerNorm over its rows,
    fp32 optimizer state), as GPT-NeoX builds it with use_bnb_optimizer."""
    rpe_num_buckets: int = 32
    """T5's relative position buckets (position_embedding_type "rpe")."""
    rpe_max_distance: int = 128
    """The distance from which every key shares rpe's last bucket."""
    rotary_percentage: float = 1.0
    rope_theta: float = 10000.0
    activation: str = "gelu"
    has_bias: bool = True
    attention_bias: bool | None = None
    """Biases of the q, k, v and output projections; None follows has_bias."""
    mlp_bias: bool | None = None
    """Biases of the MLP's linear layers; None follows has_bias."""
    init_method: str = "normal"
    """How every weight but the output projections is drawn (see `init_methods`)."""
    output_layer_init_method: str | None = None
    """How the attention output and MLP down projections are drawn; None: scaled_normal with
    use_scaled_init_method, else normal."""
    qkv_linear: bool = False
    fuse_qkv: bool = True
    sliding_window: int | None = None
    """Mistral's sliding-window attention: query i sees keys i - window < j <= i (None: full causal)."""
    attention_layers: tuple[str, ...] | None = None
    """One kind per layer (a registered `LayerKind`: dense, a block-sparse layout, or a gMLP / aMLP, Mamba or RWKV
    block); None: dense everywhere."""
    layer_settings: tuple[Any, ...] = ()
    """The settings of the kinds in use, one dataclass each (`SparsitySpec`, `GMLPSpec`, `MambaSpec`, `RWKVSpec` or
    a plug-in kind's): a kind without one takes its defaults (see `settings`)."""
    soft_prompt_tokens: int = 0
    """GPT-NeoX's soft prompt tuning: this many learned vectors before every sequence (`SoftPrompt`); 0: none."""
    soft_prompt_init_range: float = 0.5
    """The prompt is drawn from U(-range, range) unless `soft_prompt_init_ids` are given."""
    soft_prompt_init_ids: tuple[int, ...] = ()
    """Token ids whose embedding rows start the prompt (NeoX's init_string), repeated to its length."""
    num_unique_layers: int | None = None
    """Layers with their own weights (Megatron's parameter sharing): num_layers positions run these in
    `param_sharing_style` order; None: every layer its own."""
    param_sharing_style: str = "grouped"
    """grouped: position i runs unique layer i mod num_unique_layers ([1, 2, 1, 2]); spaced: i // (num_layers /
    num_unique_layers) ([1, 1, 2, 2])."""
    loss_chunk_tokens: int = 0
    """Per-token losses are computed this many tokens at a time (see `chunked_token_cross_entropy`);
    0 computes the whole micro-batch's logits at once."""
    moe: MoESpec | None = None
    """Mixture of experts in place of the MLP of layers frequency, 2 x frequency, ... (1-based)."""
    mup: MupSpec | None = None
    """muP (see `maximal_update`): base shapes, temperatures and multipliers; None: the standard parametrisation."""

    def __post_init__(self) -> None:
        problems = _problems(self)
        if problems:
            raise ModelConfigError(*problems)

    @property
    def attention_has_bias(self) -> bool:
        return self.has_bias if self.attention_bias is None else self.attention_bias

    @property
    def mlp_has_bias(self) -> bool:
        return self.has_bias if self.mlp_bias is None else self.mlp_bias

    @property
    def output_init(self) -> str:
        if self.output_layer_init_method is not None:
            return self.output_layer_init_method
        return "scaled_normal" if self.use_scaled_init_method else "normal"

    @property
    def gated(self) -> bool:
        """Whether the MLP computes act(gate(x)) * up(x)."""
        return ACTIVATIONS[self.activation][1]

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def moe_layers(self) -> list[int]:
        """Indices (0-based) of the MoE layers."""
        if self.moe is None:
            return []
        return [index for index in range(self.num_layers) if self.moe.is_moe_layer(index, one_based=True)]

    def attention_kind(self, layer_number: int) -> str:
        """The attention kind of layer `layer_number` (1-based)."""
        return "dense" if self.attention_layers is None else self.attention_layers[layer_number - 1]

    @property
    def unique_layers(self) -> int:
        """The decoder layers the model holds (each with its own weights)."""
        return self.num_unique_layers or self.num_layers

    @property
    def shares_layers(self) -> bool:
        """Whether some layers run the same weights (num_unique_layers below num_layers)."""
        return self.unique_layers != self.num_layers

    @property
    def layer_order(self) -> tuple[int, ...]:
        """For each of the num_layers positions, the index of the unique layer it runs."""
        unique = self.unique_layers
        if self.param_sharing_style == "spaced":
            return tuple(index // (self.num_layers // unique) for index in range(self.num_layers))
        return tuple(index % unique for index in range(self.num_layers))

    def settings(self, kind: str) -> Any:
        """The settings of layer kind `kind`: its settings dataclass from layer_settings, or that class's defaults."""
        wanted = layer_kind(kind).settings
        if wanted is None:  # a kind without settings
            return None
        return next((spec for spec in self.layer_settings if type(spec) is wanted), None) or wanted()

    @property
    def max_positions(self) -> int:
        return self.max_position_embeddings or self.seq_length

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.rotary_percentage) // 2 * 2

    @property
    def padded_vocab_size(self) -> int:
        """Vocabulary rounded up to a multiple of make_vocab_size_divisible_by * tp, as Megatron pads it."""
        multiple = self.make_vocab_size_divisible_by * self.tensor_parallel_size
        return math.ceil(self.vocab_size / multiple) * multiple


def _problems(c: GPTConfig) -> list[str]:
    found = []
    for name, allowed in (
        ("transformer_block_type", BLOCK_TYPES),
        ("normalization", NORMS),
        ("activation", tuple(ACTIVATIONS)),
        ("position_embedding_type", POSITIONS),
        ("init_method", INIT_METHODS),
        ("output_init", INIT_METHODS),
    ):
        if getattr(c, name) not in allowed:
            key = "output_layer_init_method" if name == "output_init" else name
            found.append(f"model.{key}: expected one of {', '.join(allowed)}, found {getattr(c, name)!r}")
    if c.position_embedding_type == "sinusoidal" and c.hidden_size % 2:
        found.append(
            f"model.hidden_size: sinusoidal positions pair a sine with a cosine; expected an even width, "
            f"found {c.hidden_size}"
        )
    if c.kv_channels is None and c.hidden_size % c.num_attention_heads:
        found.append(
            f"model.hidden_size: expected a multiple of num_attention_heads ({c.num_attention_heads}) "
            f"when kv_channels is null, found {c.hidden_size}"
        )
    if c.num_attention_heads % c.kv_heads:
        found.append(
            f"model.num_kv_heads: expected a divisor of num_attention_heads ({c.num_attention_heads}), "
            f"found {c.kv_heads}"
        )
    if c.position_embedding_offset:
        if c.position_embedding_type not in ("learned_absolute", "sinusoidal"):
            found.append(
                f"model.position_embedding_offset: shifts the learned or sinusoidal positions; expected 0 "
                f"with {c.position_embedding_type!r} positions, found {c.position_embedding_offset}"
            )
        elif c.position_embedding_offset < 0:
            found.append(f"model.position_embedding_offset: expected 0 or more, found {c.position_embedding_offset}")
        elif (
            c.position_embedding_type == "learned_absolute"
            and c.seq_length + c.position_embedding_offset > c.max_positions
        ):
            found.append(
                f"model.position_embedding_offset: positions up to encoder_seq_length + offset - 1 "
                f"({c.seq_length + c.position_embedding_offset - 1}) index the learned table; expected "
                f"max_position_embeddings of at least {c.seq_length + c.position_embedding_offset}, "
                f"found {c.max_positions}"
            )
    if c.position_embedding_norm and c.position_embedding_type != "learned_absolute":
        found.append(
            f"model.position_embedding_norm: normalises the learned position table's rows; expected "
            f"learned_absolute positions with it, found {c.position_embedding_type!r}"
        )
    if c.qk_layernorm and c.kv_heads != c.num_attention_heads:
        found.append(
            f"model.qk_layernorm: the query/key norm's weights are one per query head, and nxd keeps fewer "
            f"key heads unrepeated; expected num_kv_heads {c.num_attention_heads} with it, found "
            f"{c.kv_heads}"
        )
    if c.position_embedding_type == "rpe" and not 2 <= c.rpe_num_buckets < 2 * c.rpe_max_distance:
        found.append(
            f"model.rpe_num_buckets: expected 2 up to twice rpe_max_distance ({c.rpe_max_distance}) "
            f"exclusive (half the buckets are exact distances below rpe_max_distance), found "
            f"{c.rpe_num_buckets}"
        )
    if c.position_embedding_type == "rope" and c.rotary_dim < 2:
        found.append(f"model.rotary_percentage: rotates {c.rotary_dim} of {c.head_dim} dims; expected at least 2")
    if c.sliding_window is not None and c.sliding_window < 1:  # one wider than the sequence masks nothing
        found.append(f"model.sliding_window_size: expected at least 1, found {c.sliding_window}")
    if c.num_unique_layers is not None:
        if not 1 <= c.num_unique_layers <= c.num_layers or c.num_layers % c.num_unique_layers:
            found.append(
                f"model.num_unique_layers: expected a divisor of num_layers ({c.num_layers}), found "
                f"{c.num_unique_layers}"
            )
        if c.param_sharing_style not in SHARING_STYLES:
            found.append(
                f"model.param_sharing_style: expected one of {', '.join(SHARING_STYLES)}, found "
                f"{c.param_sharing_style!r}"
            )
        if c.moe is not None and c.num_unique_layers != c.num_layers:
            found.append(
                "model.moe: MoE layers are counted over the stack's positions, and model.num_unique_layers "
                "shares layers between positions; expected one of them unset"
            )
        if c.attention_layers is not None and c.num_unique_layers != c.num_layers:
            found.append(
                "model.attention_layers: a kind per layer, and model.num_unique_layers shares layers; "
                "expected one of them unset"
            )
    if c.soft_prompt_tokens < 0:
        found.append(f"model.soft_prompt.n_tokens: expected 1 or more, found {c.soft_prompt_tokens}")
    elif (
        c.soft_prompt_tokens
        and c.position_embedding_type == "learned_absolute"
        and c.seq_length + c.soft_prompt_tokens > c.max_positions
    ):
        found.append(
            f"model.max_position_embeddings: the soft prompt's {c.soft_prompt_tokens} positions come "
            f"before the sequence's; expected at least {c.seq_length + c.soft_prompt_tokens}, found "
            f"{c.max_positions}"
        )
    if c.attention_layers is not None:
        found += _layer_kind_problems(c)
    settled = {kind.settings for kind in layer_kinds()}
    for spec in c.layer_settings:
        if type(spec) not in settled:
            found.append(f"model.layer_settings: {type(spec).__name__} is the settings of no registered layer kind")
    if c.mup is not None:
        found += _mup_problems(c)
    if c.moe is not None and c.moe.frequency > c.num_layers:
        found.append(f"model.moe.frequency: expected at most num_layers ({c.num_layers}), found {c.moe.frequency}")
    if c.seq_length > c.max_positions:
        found.append(
            f"model.encoder_seq_length: expected at most max_position_embeddings ({c.max_positions}), "
            f"found {c.seq_length}"
        )
    return found


def _layer_kind_problems(c: GPTConfig) -> list[str]:
    """What the registry's kinds say of `c`: their own problems (a transformer kind's first), and the rules every
    block shares."""
    names, found = set(c.attention_layers), []
    if len(c.attention_layers) != c.num_layers:
        found.append(
            f"model.attention_layers: expected one kind per layer ({c.num_layers}), found {len(c.attention_layers)}"
        )
    known = [kind.name for kind in layer_kinds()]
    if names - set(known):
        return [
            *found,
            f"model.attention_layers: expected kinds among {', '.join(known)}, found "
            f"{', '.join(sorted(names - set(known)))}",
        ]
    kinds = kinds_of(c)

    def own_problems(blocks: bool) -> list[str]:  # kinds sharing one function are asked once
        asked = dict.fromkeys(kind.problems for kind in kinds if kind.is_block == blocks and kind.problems)
        return [problem for problems in asked for problem in problems(c, names)]

    found += own_problems(blocks=False)
    gating = sorted(kind.name for kind in kinds if kind.splits_activation)
    if gating and c.gated:
        found.append(
            f"model.activation: {', '.join(gating)} layers split their inner activations into a value "
            f"and a gate themselves; expected an ungated activation, found {c.activation}"
        )
    whole = sorted(kind.name for kind in kinds if kind.is_block)
    if whole and c.moe is not None:
        found.append(
            f"model.moe: {', '.join(whole)} layers have no MLP to replace with experts; expected one "
            "of model.moe and those layers"
        )
    scanning = sorted(kind.name for kind in kinds if kind.scans)
    if scanning and c.soft_prompt_tokens:
        found.append(
            f"model.soft_prompt: every packed document sees the prompt's positions, which a "
            f"{scanning[0]} layer's scan cannot give; expected no soft prompt with {', '.join(scanning)} "
            "layers"
        )
    return found + own_problems(blocks=True)


def _mup_problems(c: GPTConfig) -> list[str]:
    """muP's rules are those of transformer layers drawn from normal distributions."""
    found = []
    whole = sorted(kind.name for kind in kinds_of(c) if kind.is_block)
    if whole:
        found.append(
            f"model.mup: muP's rules cover attention and MLP layers; expected none of {', '.join(whole)} "
            "in model.attention_layers"
        )
    for key, method in (("init_method", c.init_method), ("output_layer_init_method", c.output_init)):
        if method not in MUP_INIT_METHODS:  # the others' spread already follows the width muP rescales it by
            found.append(
                f"model.{key}: muP rescales draws whose spread does not depend on the width; expected one "
                f"of {', '.join(MUP_INIT_METHODS)}, found {method}"
            )
    return found


MUP_INIT_METHODS = ("normal", "scaled_normal", "single_residual_scaled_normal")
"""The init methods muP takes: a spread set by init_method_std and the depth, never by the width (small_init's and
wang_init's fall with the hidden size, which muP's 1 / sqrt(width multiplier) would count twice)."""
BLOCK_TYPES = ("pre_ln", "gpt_j", "gpt_neox")
"""pre_ln: sequential pre-norm blocks; gpt_j: attention and MLP in parallel from one norm of the input;
gpt_neox: in parallel from two norms of the input (GPT-NeoX's gpt_j_residual, Pythia)."""
POSITIONS = ("learned_absolute", "rope", "sinusoidal", "alibi", "rpe", "none")
SHARING_STYLES = ("grouped", "spaced")
"""How shared layers repeat (see `GPTConfig.param_sharing_style`)."""
SCORE_BIASES = ("alibi", "rpe")
"""Positions added to the attention scores: the unfused and math kernels take them with masks, not spans."""


def _norm(config: GPTConfig) -> nn.Module:
    return build_norm(config.normalization, config.hidden_size, config.layernorm_epsilon)


class SelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer_number: int, kernel: AttentionKernel):
        super().__init__()
        self.config = config
        heads, kv_heads, head_dim = config.num_attention_heads, config.kv_heads, config.head_dim
        bias = config.attention_has_bias
        if config.qkv_linear:
            self.qkv_proj = QKVLinear(
                config.hidden_size, heads * head_dim, kv_heads * head_dim, bias=bias, fuse=config.fuse_qkv
            )
        else:
            self.q_proj = nn.Linear(config.hidden_size, heads * head_dim, bias=bias)
            self.k_proj = nn.Linear(config.hidden_size, kv_heads * head_dim, bias=bias)
            self.v_proj = nn.Linear(config.hidden_size, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, config.hidden_size, bias=bias)
        kind = layer_kind(config.attention_kind(layer_number))
        self.sparse = None if kind.attention_layout is None else kind.attention_layout(config, kind.name, layer_number)
        """The layer's block-sparse layout (plain values: built from the config, never trained or saved)."""
        self.core_attention = CoreAttention(
            layer_number,
            kernel,
            0.0 if self.sparse else config.attention_dropout,
            config.apply_query_key_layer_scaling,
        )
        if self.sparse is not None:  # GPT-NeoX drops a sparse layer's output, not its probabilities
            self.context_dropout = nn.Dropout(config.attention_dropout)
        if config.qk_layernorm:
            self.qk_norm = QueryKeyNorm(config.normalization, heads, head_dim, config.layernorm_epsilon)
        self.alibi = alibi_slopes(heads) if config.position_embedding_type == "alibi" else None
        """ALiBi's slope of every query head (plain numbers: computed, never trained or saved)."""
        self.query_multiplier = (
            None if config.mup is None else 1 / (math.sqrt(head_dim) * config.mup.attention_temperature)
        )
        """muP: the queries scaled so that every kernel's 1/sqrt(d) makes scores / (d x attention_temperature)."""

    def forward(
        self,
        hidden: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor] | None,
        allowed: torch.Tensor | Spans | None = None,
        documents: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        position_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`position_bias` (this rank's heads, seq, keys): rpe's bias on the scores, shared by every layer."""
        batch, seq, _ = hidden.shape
        head_dim = self.config.head_dim
        # -1 heads: under tensor parallelism a rank holds a slice of the heads.
        if self.config.qkv_linear:
            projections = self.qkv_proj(hidden)
        else:
            projections = self.q_proj(hidden), self.k_proj(hidden), self.v_proj(hidden)
        query, key, value = (p.view(batch, seq, -1, head_dim) for p in projections)
        if self.config.qk_layernorm:  # QK normalisation (Dehghani et al. 2023), before rotary as in NeoX
            query, key = self.qk_norm(query), self.qk_norm(key)
        query, key, value = (t.transpose(1, 2) for t in (query, key, value))
        if rotary is not None:
            query, key = apply_rotary(query, *rotary), apply_rotary(key, *rotary)
        if self.query_multiplier is not None:
            query = query * self.query_multiplier
        if cache is not None:  # attend over every token seen so far
            key, value = cache.extend(key, value)
        bias = position_bias
        if self.alibi is not None:
            local = query.shape[1]
            start = self._head_offset(local)
            bias = alibi_bias(
                self.alibi[start : start + local], query.shape[2], query.device, past=key.shape[2] - query.shape[2]
            )
        if self.sparse is not None:
            allowed = self._sparse_mask(query, key, allowed, documents, bias)
        context = self.core_attention(query, key, value, allowed, documents, bias)
        if self.sparse is not None:
            context = self.context_dropout(context)
        return self.o_proj(context.transpose(1, 2).reshape(batch, seq, -1))

    def _sparse_mask(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        allowed: torch.Tensor | Spans | None,
        documents: torch.Tensor | None,
        bias: torch.Tensor | None,
    ) -> torch.Tensor | BlockMask:
        """The layout's mask for this rank's heads, within what `allowed` permits (documents, a sliding window,
        decoding): FlexAttention's block mask when training on CUDA where nothing else masks or biases, else a boolean
        mask."""
        if self.core_attention.context_parallel is not None:
            raise ModelConfigError(
                f"model.attention_layers: a {self.sparse.kind} layer's layout is not available "
                "with context parallelism (ring attention takes no mask)"
            )
        local = query.shape[1]
        first = self._head_offset(local)
        heads = slice(first, first + local)
        queries, keys = query.shape[2], key.shape[2]
        plain = allowed is None and bias is None and queries == keys and self.training  # one compiled length
        if plain and query.is_cuda and self.core_attention.kernel is AttentionKernel.FLASH:
            return self.sparse.block_mask(heads, keys, query.device)
        mask = self.sparse.mask(heads, queries, keys, query.device)
        if isinstance(allowed, list):  # document spans: their mask
            allowed = document_mask(documents)
        return mask if allowed is None else mask & allowed

    def _head_offset(self, local_heads: int) -> int:
        """The index of this rank's first query head: tensor parallelism gives each rank an equal run of them."""
        weight = self.qkv_proj.weight_q if self.config.qkv_linear else self.q_proj.weight
        return weight.device_mesh.get_local_rank() * local_heads if is_dtensor(weight) else 0


class MLP(nn.Module):
    """Gated (swiglu, geglu ...): down(act(gate(x)) * up(x)); otherwise down(act(up(x))). ffn_dropout after the
    activation."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        hidden, ffn, bias = config.hidden_size, config.ffn_size, config.mlp_has_bias
        self.activation, self.gated = ACTIVATIONS[config.activation]
        if self.gated:
            self.gate_proj = nn.Linear(hidden, ffn, bias=bias)
            self.activation_multiply = ActivationMultiplyMLP(self.activation)
        self.up_proj = nn.Linear(hidden, ffn, bias=bias)
        self.down_proj = nn.Linear(ffn, hidden, bias=bias)
        self.dropout = nn.Dropout(config.ffn_dropout)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        up = self.up_proj(hidden)
        inner = self.activation_multiply(self.gate_proj(hidden), up) if self.gated else self.activation(up)
        return self.down_proj(self.dropout(inner))


class DecoderLayer(nn.Module):
    """pre_ln: x + drop(attn(norm1(x))), then + drop(mlp(norm2(.))); gpt_neox: x + drop(attn(norm1(x))) +
    drop(mlp(norm2(x))); gpt_j: the same from one norm, x + drop(attn(norm1(x))) + drop(mlp(norm1(x)))."""

    def __init__(self, config: GPTConfig, layer_number: int, kernel: AttentionKernel):
        super().__init__()
        self.block = config.transformer_block_type
        self.input_layernorm = _norm(config)
        self.self_attn = SelfAttention(config, layer_number, kernel)
        if self.block != "gpt_j":
            self.post_attention_layernorm = _norm(config)
        moe_layers = config.moe_layers
        if layer_number - 1 in moe_layers:
            activation, gated = ACTIVATIONS[config.activation]
            self.mlp = MoELayer(
                config.moe,
                config.hidden_size,
                config.ffn_size,
                activation,
                gated,
                moe_layers.index(layer_number - 1),
                len(moe_layers),
                MLP(config) if config.moe.residual else None,
            )
        else:
            self.mlp = MLP(config)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(
        self,
        hidden: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor] | None,
        allowed: torch.Tensor | Spans | None = None,
        documents: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        position_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        normed = self.input_layernorm(hidden)
        attention = self.dropout(self.self_attn(normed, rotary, allowed, documents, cache, position_bias))
        if self.block == "pre_ln":
            hidden = hidden + attention
            return hidden + self.dropout(self.mlp(self.post_attention_layernorm(hidden)))
        mlp_input = normed if self.block == "gpt_j" else self.post_attention_layernorm(hidden)
        return hidden + attention + self.dropout(self.mlp(mlp_input))


class SoftPrompt(nn.Module):
    """Learned input vectors placed before every sequence's token embeddings (prompt tuning, Lester et al. 2021;
    GPT-NeoX's soft_prompt_tuning). They take positions 0 .. n - 1 and the tokens n onwards; their outputs are
    dropped, so the model's outputs are the tokens'."""

    def __init__(self, tokens: int, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(tokens, hidden))

    def forward(self, batch: int) -> torch.Tensor:
        weight = self.weight.to_local() if is_dtensor(self.weight) else self.weight
        return weight.unsqueeze(0).expand(batch, -1, -1)


def _layer(config: GPTConfig, layer_number: int, kernel: AttentionKernel) -> nn.Module:
    """Decoder layer `layer_number` (1-based) of the kind `attention_layers` gives it."""
    kind = layer_kind(config.attention_kind(layer_number))
    return DecoderLayer(config, layer_number, kernel) if kind.build is None else kind.build(config, layer_number)


class GPTDecoder(nn.Module):
    def __init__(self, config: GPTConfig, kernel: AttentionKernel):
        super().__init__()
        self.config, self.kernel = config, kernel
        self.embed_tokens = nn.Embedding(config.padded_vocab_size, config.hidden_size)
        if config.position_embedding_type == "learned_absolute":
            table = StableEmbedding if config.position_embedding_norm else nn.Embedding
            self.position_embeddings = table(config.max_positions, config.hidden_size)
        if config.position_embedding_type == "rpe":  # one table for every layer, as GPT-NeoX shares it
            self.relative_position_bias = RelativePositionBias(
                config.num_attention_heads, config.head_dim, config.rpe_num_buckets, config.rpe_max_distance
            )
        self.soft_prompt = (
            SoftPrompt(config.soft_prompt_tokens, config.hidden_size) if config.soft_prompt_tokens else None
        )
        self.embedding_dropout = nn.Dropout(config.hidden_dropout)
        self.layers = nn.ModuleList(_layer(config, number, kernel) for number in range(1, config.unique_layers + 1))
        """The unique layers; the stack runs them in `config.layer_order` (each once without sharing)."""
        self.norm = _norm(config)
        self.context_parallel = False
        """Set by `use_context_parallel`: the layers' attention covers a split sequence."""

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        document_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        hidden = input_ids  # a later pipeline stage (no embeddings) takes the residual stream
        prompt = 0 if self.soft_prompt is None else self.config.soft_prompt_tokens
        prepend = self.prompt_positions(cache)  # decoding: the cache holds the prompt's keys after the first call
        position_ids = position_ids + prompt
        if prepend:  # the prompt at positions 0 .. n - 1 (in every document: id -1, seen by all)
            position_ids = torch.cat(
                [torch.arange(prompt, device=position_ids.device).expand(position_ids.shape[0], -1), position_ids],
                dim=1,
            )
            if document_ids is not None:
                document_ids = torch.cat([document_ids.new_full((document_ids.shape[0], prompt), -1), document_ids], 1)
        if self.embed_tokens is not None:
            hidden = self.embed(input_ids, position_ids[:, prompt:] if prepend else position_ids)
            if prepend:
                hidden = torch.cat([self.embed_prompt(hidden.shape[0], position_ids[:, :prompt]), hidden], dim=1)
            hidden = self.embedding_dropout(hidden)
            if self.config.mup is not None and self.config.mup.embedding_multiplier != 1:
                hidden = hidden * self.config.mup.embedding_multiplier
        stack = (
            [self.layers[index] for index in self.config.layer_order]
            if self.config.shares_layers
            else [layer for layer in self.layers if layer is not None]
        )
        hidden = self.run_layers(stack, hidden, position_ids, document_ids, cache)
        return hidden if self.norm is None else self.norm(hidden)

    def prompt_positions(self, cache: KVCache | None) -> int:
        """How many soft-prompt positions a forward puts before the tokens: all of them unless decoding continues
        a cache that holds them already."""
        return 0 if self.soft_prompt is None or (cache is not None and cache.length) else self.config.soft_prompt_tokens

    def embed_prompt(self, batch: int, position_ids: torch.Tensor) -> torch.Tensor:
        """The soft prompt's rows with their positions' learned or sinusoidal embeddings, as tokens get."""
        hidden = self.soft_prompt(batch)
        return (
            hidden + self.embed(None, position_ids, hidden.dtype)
            if self.config.position_embedding_type in ("learned_absolute", "sinusoidal")
            else hidden
        )

    def embed(
        self, input_ids: torch.Tensor | None, position_ids: torch.Tensor, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """Token embeddings plus their positions' (learned or sinusoidal); the positions' alone without ids."""
        hidden = 0 if input_ids is None else self.embed_tokens(input_ids)
        dtype = hidden.dtype if input_ids is not None else dtype
        positions = position_ids + self.config.position_embedding_offset
        if self.config.position_embedding_type == "learned_absolute":
            table = self.position_embeddings(positions)
        elif self.config.position_embedding_type == "sinusoidal":
            table = sinusoidal_embedding(positions, self.config.hidden_size, dtype)
        else:
            return hidden
        multiplier = self.config.position_embedding_multiplier
        return hidden + (table if multiplier == 1 else table * multiplier)

    def run_layers(
        self,
        layers: Iterable[nn.Module],
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        document_ids: torch.Tensor | None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """`hidden` through `layers` (all of them, or a pipeline stage's). A context-parallel attention
        masks documents itself (its part of the sequence is not contiguous); the others get each
        document's span, or a mask where a document is not one contiguous run, the kernel is the
        unfused one (it takes masks only) or the rows are short (`MASKED_ROWS_UP_TO`). With a `cache`
        the tokens extend those it holds, attending to them under the decoding mask."""
        allowed = None
        seq, window = position_ids.shape[-1], self.config.sliding_window  # whole rows (sequence parallel splits hidden)
        if cache is not None:
            allowed = decoding_mask(cache.length, seq, window, hidden.device)
            document_ids = window = None
        spans = document_spans(document_ids) if document_ids is not None and not self.context_parallel else None
        longest = max(end - start for row in spans for start, end in row) if spans else seq
        window = window if window is not None and window < longest else None  # a wider one changes nothing
        if window is not None:  # sliding window: a mask (and documents within it)
            allowed = sliding_window_mask(seq, window, document_ids, hidden.device)
        elif document_ids is not None and not self.context_parallel:
            masks_only = (
                self.kernel is AttentionKernel.UNFUSED
                or self.config.position_embedding_type in SCORE_BIASES
                or seq <= MASKED_ROWS_UP_TO
            )
            allowed = (None if masks_only else spans) or document_mask(document_ids)
        rotary = bias = None
        if self.config.position_embedding_type == "rope":
            rotary = rotary_cos_sin(position_ids, self.config.rotary_dim, self.config.rope_theta, hidden.dtype)
        elif self.config.position_embedding_type == "rpe":
            bias = self.relative_position_bias(seq, 0 if cache is None else cache.length)
        for position, layer in enumerate(layers):  # a shared layer caches each position's keys apart
            hidden = layer(hidden, rotary, allowed, document_ids, None if cache is None else cache.slot(position), bias)
        return hidden


class GPTForCausalLM(nn.Module):
    """Decoder plus output layer. forward(input_ids, position_ids) -> logits over the padded vocabulary,
    or with `labels`, the per-token cross-entropy (computed in chunks of `loss_chunk_tokens`).
    `attention` is the kernel of every layer's attention core (the fusions keys)."""

    def __init__(self, config: GPTConfig, attention: AttentionKernel = AttentionKernel.FLASH):
        super().__init__()
        self.config = config
        self.model = GPTDecoder(config, attention)
        self.lm_head = nn.Linear(config.hidden_size, config.padded_vocab_size, bias=False)
        if config.share_embeddings_and_output_weights:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.mup_widths: dict[str, Width] = (
            {}
            if config.mup is None
            else widths(dict(config.mup.base_shapes), {name: p.shape for name, p in self.named_parameters()})
        )
        """muP: each parameter's widths against the base shapes (full shapes, read before any sharding)."""
        self.readout_multiplier = 1.0
        """What the output layer's input is multiplied by: muP's 1 / (width multiplier x output_temperature)."""
        if config.mup is not None:
            readout = "model.embed_tokens.weight" if config.share_embeddings_and_output_weights else "lm_head.weight"
            self.readout_multiplier = 1 / (self.mup_widths[readout].multiplier * config.mup.output_temperature)
        self.layer_kinds = kinds_of(config)
        """The kinds of the layers (their own initialisation; plain records, never trained or saved)."""
        self.output_projections = (
            "o_proj",
            "down_proj",
            *(n for kind in self.layer_kinds for n in kind.output_projections),
        )
        """Name endings of the linear layers drawn by output_layer_init_method."""
        if config.soft_prompt_tokens:  # prompt tuning: the prompt trains, every other weight stays as it starts
            for name, parameter in self.named_parameters():
                parameter.requires_grad_(name.startswith("model.soft_prompt."))

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """`document_ids` (batch, seq), when given, confines attention to each document. A pipeline
        stage (see `keep_pipeline_stage`) takes and returns the residual stream where it lacks the
        embedding or the output layer (and then ignores `labels`). With a `cache` (decoding) the tokens
        continue those the cache holds: `position_ids` then start at the number of tokens before them (a soft
        prompt's positions, which the cache holds too, are not counted). A soft prompt's positions give no output."""
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand(input_ids.shape[:2])
        prompt = self.model.prompt_positions(cache)  # outputs of a soft prompt's positions are dropped
        hidden = self.model(input_ids, position_ids, document_ids, cache)
        if self.lm_head is None:
            return hidden
        if self.readout_multiplier != 1:  # muP's readout (mup's MuReadout)
            hidden = hidden * self.readout_multiplier
        if labels is None:  # a soft prompt's positions cut off in a copy: FSDP2 wants no view as the output
            return self.lm_head(hidden)[:, prompt:].clone() if prompt else self.lm_head(hidden)
        if isinstance(self.lm_head, ScoreHead):  # a reward model: its scores stand for the token losses
            return self.lm_head.scores(hidden)
        if not prompt:
            return chunked_token_cross_entropy(
                hidden, self.lm_head, labels, self.config.loss_chunk_tokens, getattr(self, LOSS_TEMPERATURE, 1.0)
            )
        # a soft prompt's positions, counted nowhere (sequence parallelism holds the whole sequence only in the
        # output layer), then cut off in a copy
        labels = torch.cat([labels.new_full((labels.shape[0], prompt), IGNORE_INDEX), labels], dim=1)
        losses = chunked_token_cross_entropy(
            hidden, self.lm_head, labels, self.config.loss_chunk_tokens, getattr(self, LOSS_TEMPERATURE, 1.0)
        )
        return losses[:, prompt:].clone()

    @torch.no_grad()
    def start_soft_prompt(self) -> None:
        """Set the soft prompt to the embedding rows of `soft_prompt_init_ids` (NeoX's init_string) from the weights
        the run starts with, repeated to its length; every rank calls it (a sharded embedding is gathered). Without
        init ids the prompt keeps its uniform draw."""
        c, prompt = self.config, self.model.soft_prompt
        if prompt is None or not c.soft_prompt_init_ids:
            return
        table = self.model.embed_tokens.weight
        table = table.full_tensor() if is_dtensor(table) else table
        ids = torch.tensor(c.soft_prompt_init_ids, device=table.device)
        rows = table[ids.repeat(math.ceil(c.soft_prompt_tokens / len(ids)))[: c.soft_prompt_tokens]]
        weight = prompt.weight
        if is_dtensor(weight):
            from torch.distributed.tensor import distribute_tensor

            rows = distribute_tensor(rows.to(weight.dtype), weight.device_mesh, weight.placements)
        weight.copy_(rows)

    @torch.no_grad()
    def init_module(self, name: str, module: nn.Module, seeded: Callable[[str], AbstractContextManager[None]]) -> None:
        """Megatron's init of one module's own tensors (nxd-models' `initial_values` rule): N(0, std)
        for weights, std / sqrt(2 * layers) on the output projections when use_scaled_init_method, zero
        biases, unit norms. A QKV module's parts draw as the q/k/v Linear layers they stand for."""
        c = self.config

        def draw(weight: torch.Tensor, method: str, fans: tuple[int, int] | None = None) -> None:
            init_weight(weight, method, std=c.init_method_std, layers=c.num_layers, hidden=c.hidden_size, fans=fans)

        qkv_fans = (c.hidden_size, (c.num_attention_heads + 2 * c.kv_heads) * c.head_dim)
        if any(kind.init(name, module) for kind in self.layer_kinds if kind.init is not None):
            pass  # a layer kind's own draw
        elif name.endswith(".mlp.coefficient"):
            module.reset_parameters()  # DeepSpeed's PR-MoE mix keeps torch's default draw
        elif isinstance(module, nn.Linear | nn.Embedding):
            if name.endswith(self.output_projections):
                draw(module.weight, c.output_init)
            elif name.endswith(("q_proj", "k_proj", "v_proj")):
                draw(module.weight, c.init_method, qkv_fans)
            elif name.endswith(("gate_proj", "up_proj")):  # one matrix [up | gate] in GPT-NeoX
                draw(module.weight, c.init_method, (c.hidden_size, c.ffn_size * (2 if c.gated else 1)))
            elif not (
                name == "lm_head" and c.share_embeddings_and_output_weights and not isinstance(module, ScoreHead)
            ):  # a score head is never tied
                draw(module.weight, c.init_method)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, Experts):
            for key, parameter in module.named_parameters(recurse=False):
                method = c.output_init if key == "down_proj" else c.init_method
                if (sigma := normal_std(method, c.init_method_std, c.num_layers, c.hidden_size)) is not None:
                    nn.init.normal_(parameter, 0.0, sigma)
                else:
                    for expert in parameter:
                        draw(expert, method)
        elif isinstance(module, QKVLinear):
            for part in ("q", "k", "v"):
                with seeded(qkv_part_unit(name, part)):
                    draw(getattr(module, f"weight_{part}"), c.init_method, qkv_fans)
                if getattr(module, f"bias_{part}") is not None:
                    nn.init.zeros_(getattr(module, f"bias_{part}"))
        elif isinstance(module, QueryKeyNorm):
            for key, parameter in module.named_parameters(recurse=False):
                (nn.init.zeros_ if key == "bias" else nn.init.ones_)(parameter)
        elif isinstance(module, SoftPrompt):  # NeoX's uniform draw; init_string's rows come from `start_soft_prompt`
            nn.init.uniform_(module.weight, -c.soft_prompt_init_range, c.soft_prompt_init_range)
        elif isinstance(module, RelativePositionBias):  # NeoX's init of the (buckets, heads) table
            nn.init.xavier_normal_(module.weight)
        elif isinstance(module, nn.LayerNorm | nn.RMSNorm | ScaleNorm | nn.GroupNorm) and module.weight is not None:
            nn.init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        if c.mup is not None and isinstance(module, nn.Linear | nn.Embedding | Experts | QKVLinear):
            for key, parameter in module.named_parameters(recurse=False):  # muP's draw: mup's normal_ x init_scale
                if parameter.dim() > 1 and (width := self.mup_widths.get(f"{name}.{key}" if name else key)):
                    parameter.mul_(width.init_factor(c.mup.init_scale))

    def tp_plan(self) -> dict[str, str]:
        """How each module shards under tensor parallelism (applied by nxd-parallel)."""
        return gpt_tp_plan(self.config)


EMBEDDING_NORMS_OUTPUT_PLAN: dict[str, str] = {
    "model.embed_tokens": "vocab",
    "model.layers.*.input_layernorm": "sequence",
    "model.layers.*.post_attention_layernorm": "sequence",
    "model.norm": "sequence",
    "lm_head": "colwise_output",
}
"""The non-projection entries shared by every decoder nxd builds (both families use these names):
vocab-parallel embedding, sequence-parallel norms, and a column-parallel output layer whose logits stay
sharded for a vocab-parallel loss."""

GPT_TP_PLAN: dict[str, str] = {
    **EMBEDDING_NORMS_OUTPUT_PLAN,
    "model.layers.*.self_attn.q_proj": "colwise",
    "model.layers.*.self_attn.k_proj": "colwise_kv",
    "model.layers.*.self_attn.v_proj": "colwise_kv",
    "model.layers.*.self_attn.o_proj": "rowwise",
    "model.layers.*.mlp.gate_proj": "colwise",
    "model.layers.*.mlp.up_proj": "colwise",
    "model.layers.*.mlp.down_proj": "rowwise",
}
"""Module-name pattern -> sharding style (colwise / rowwise linear, colwise_kv for the key and value
projections that kv_replicator may replicate, plus the shared entries above) of a swiglu model with
separate q/k/v projections; `gpt_tp_plan(config)` gives any model's."""


def gpt_tp_plan(config: GPTConfig) -> dict[str, str]:
    """The plan of a model built from `config`: only swiglu has a gate projection, and with qkv_linear
    the fused module replaces the q/k/v entries."""
    dropped = ("q_proj", "k_proj", "v_proj") if config.qkv_linear else ()
    if not config.gated:
        dropped += ("gate_proj",)
    if config.transformer_block_type == "gpt_j":
        dropped += ("post_attention_layernorm",)
    if len(config.moe_layers) == config.num_layers:
        dropped += ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    plan = {pattern: style for pattern, style in GPT_TP_PLAN.items() if not pattern.endswith(dropped)}
    if config.qkv_linear:
        plan["model.layers.*.self_attn.qkv_proj"] = "qkv"
    if config.position_embedding_type == "rpe":
        plan["model.relative_position_bias"] = "heads"
    if config.qk_layernorm:  # a rank's heads as a slice of all, so that the norm's reductions cover every head
        plan["model.layers.*.self_attn.qk_norm"] = "replicated_with_grad_allreduce"
    if any(kind.is_block for kind in kinds_of(config)):  # blocks are whole on every rank but for their own
        # entries: the layer entries name each layer
        plan = _per_layer(plan, [layer_kind(name) for name in config.attention_layers])
    return {**plan, **moe_tp_plan(config.moe_layers)}


def _per_layer(plan: dict[str, str], kinds: list[LayerKind]) -> dict[str, str]:
    """`plan` with each `model.layers.*.` entry named for every layer holding that part: a transformer layer holds
    them all, a block those of its own plan (with its styles), whose other entries follow."""
    layer = "model.layers.*."
    per_layer = {}
    for pattern, style in plan.items():
        if not pattern.startswith(layer):
            per_layer[pattern] = style
            continue
        part = pattern.removeprefix(layer)
        for index, kind in enumerate(kinds):
            if not kind.is_block or part in kind.tp_plan:
                per_layer[f"model.layers.{index}.{part}"] = kind.tp_plan.get(part, style)
    for index, kind in enumerate(kinds):
        for part, style in kind.tp_plan.items():
            per_layer.setdefault(f"model.layers.{index}.{part}", style)
    return per_layer


def moe_tp_plan(layers: Iterable[int]) -> dict[str, str]:
    """The MoE layers' entries: each `model.layers.N.mlp` is a "moe" module (router replicated, stacked
    experts split over the ffn dimension; nxd-parallel's expert parallelism)."""
    return {f"model.layers.{index}.mlp": "moe" for index in layers}
