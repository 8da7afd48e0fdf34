"""The model protocol: everything the rest of nxd asks of a model family, answered by each family.

nxd-parallel shards a model, nxd-ckpt exports it and nxd-train wires them through a `ModelFamily`;
none of them asks which family a model is. `model_family(spec, attention)` picks the implementation
from the description: a `GPTConfig` (the Megatron-style decoder) or a transformers `PretrainedConfig`.
Both families name their parts alike (`model.embed_tokens`, `model.layers.N`, `model.norm`, `lm_head`).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from .attention import AttentionKernel, ContextParallelAttention
from .build import build_causal_lm, build_on_meta, causal_lm_logits
from .causal_lm_losses import causal_lm_token_losses
from .context_parallel import use_context_parallel
from .errors import ModelConfigError
from .flops import training_flops_per_token
from .gpt import SCORE_BIASES, GPTConfig, gpt_tp_plan
from .hf import hf_tp_plan
from .hf_mapping import HFMapping, hf_mapping, hf_self_mapping
from .hf_moe import moe_of
from .hf_recompute import recompute_core_attention
from .hf_types import is_hf_config
from .initialisation import init_rule, initial_values
from .layer_kinds import layer_kind
from .moe import MoESpec, moe_layers
from .neox_layout import NeoXLayout, neox_layout
from .pipeline import decoder_layers, keep_pipeline_stage, pipeline_stage_problems
from .recompute_units import ACTIVATION_MULTIPLY, MEGATRON_ALIASES, split_activation_multiply
from .score_head import check_head
from .score_mapping import score_mapping

if TYPE_CHECKING:
    from transformers import PretrainedConfig

CORE_ATTENTION = "CoreAttention"
"""NxDT's name of the attention core (softmax(QK^T)V) in `activations_checkpoint_recompute`."""


class ModelFamily(ABC):
    """One model description (`spec`) with its attention kernel, and what nxd needs to know of it."""

    source_key: str
    """Where a user sets the architecture (named in messages)."""

    def __init__(
        self,
        spec: GPTConfig | PretrainedConfig,
        attention: AttentionKernel = AttentionKernel.FLASH,
        head: str = "causal_lm",
    ):
        self.spec, self.attention, self.head = spec, attention, check_head(head)

    def with_head(self, head: str) -> ModelFamily:
        """The same decoder with another output layer (`HEADS`)."""
        return type(self)(self.spec, self.attention, head)

    def _finish(self, model: nn.Module) -> nn.Module:
        """What a family adds to each model it builds (nothing here)."""
        return model

    @property
    def packs_exactly(self) -> bool:
        """Whether a document packed into a row after others computes as it does alone (each layer reads its
        document's tokens and position ids only, not their places in the row)."""
        return True

    @property
    def attends_document_spans(self) -> bool:
        """Documents packed into one row are attended span by span, each costing its own length squared;
        False: the kernel takes masks only (the unfused one), so a packed row costs its whole width squared."""
        return self.attention is not AttentionKernel.UNFUSED

    def build_on_meta(self) -> nn.Module:
        """A new module tree on the meta device (shapes and names, no memory), for the caller to shard or cut."""
        return self._finish(build_on_meta(self.spec, self.attention, self.head))

    @functools.cached_property
    def _reference(self) -> nn.Module:
        """One meta build for the read-only questions below (names, shapes, counts), made once."""
        return self.build_on_meta()

    def parameter_shapes(self) -> dict[str, torch.Size]:
        """The whole model's state-dict shapes, whatever the layout it is trained in."""
        return {name: value.shape for name, value in self._reference.state_dict().items()}

    def build(
        self, device: torch.device | str = "cpu", *, seed: int | None = None, use_cpu_initialization: bool = True
    ) -> nn.Module:
        """The whole model, initialised from `seed` (None: a seed drawn from the torch RNG)."""
        return self._finish(
            build_causal_lm(
                self.spec,
                device,
                seed=seed,
                use_cpu_initialization=use_cpu_initialization,
                attention=self.attention,
                head=self.head,
            )
        )

    def initial_values(
        self, *, seed: int, device: torch.device, names: Collection[str] | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The whole model's initial tensors that `build(seed=seed)` holds, one module at a time, only the
        modules owning a name in `names`: what a process keeping shards slices, never holding the model."""
        meta = self.build_on_meta()
        return initial_values(meta, init_rule(meta), seed=seed, device=device, names=names)

    @staticmethod
    def logits(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Logits (batch, seq, vocab; a score head's (batch, seq, 1)) of a micro-batch (`input_ids`,
        `position_ids` and, for packed documents, `document_ids`) through a model of this family,
        wrapped or sharded."""
        return causal_lm_logits(model, batch["input_ids"], batch["position_ids"], batch.get("document_ids"))

    @staticmethod
    def token_losses(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Per-token cross-entropy (batch, seq) of a micro-batch with `labels`, in fp32 (0 where a label
        is ignored): what every objective is computed from; a score head's per-position scores
        instead (a reward model). Call it inside `loss_parallel()`."""
        return causal_lm_token_losses(model, batch)

    def tp_plan(self) -> dict[str, str]:
        """Module-name pattern -> tensor-parallel style (applied by nxd-parallel); a score head is
        row-parallel, its one output summed over the ranks."""
        plan = self._tp_plan()
        return {**plan, "lm_head": "score"} if self.head == "score" else plan

    @abstractmethod
    def _tp_plan(self) -> dict[str, str]:
        """The plan of the causal LM."""

    @property
    @abstractmethod
    def head_dim(self) -> int: ...

    @abstractmethod
    def sharded_sizes(self) -> dict[str, int]:
        """The sizes tensor parallelism splits, under the names a user looks for: query heads first,
        then key/value heads, then the others."""

    def hf_mapping(self, pad_token_id: int | None = None) -> HFMapping:
        """The Hugging Face counterpart (config.json and key table); ModelConfigError when there is none.
        A reward model's is the causal LM's `*ForSequenceClassification`, with `pad_token_id` (the id
        its rows are padded with: the classifier reads the score at the last other token)."""
        mapping = self._hf_mapping()
        return score_mapping(mapping, pad_token_id) if self.head == "score" else mapping

    @abstractmethod
    def _hf_mapping(self) -> HFMapping:
        """The causal LM's counterpart."""

    def neox_layout(self) -> NeoXLayout:
        """Where each weight lies in a GPT-NeoX checkpoint of this model; ModelConfigError when NeoX has none."""
        raise ModelConfigError(
            f"a GPT-NeoX checkpoint holds a Megatron-style model (model.num_layers and its "
            f"siblings); this run's model comes from {self.source_key}"
        )

    @staticmethod
    def decoder_layers(model: nn.Module) -> list[nn.Module]:
        """The decoder layers `model` holds (a pipeline stage holds some of them)."""
        return decoder_layers(model)

    aliases: dict[str, str] = {}
    """NxDT unit names -> this family's class names computing the same thing."""

    def recompute_units(self, model: nn.Module, names: Iterable[str], include_mlp: bool = False) -> list[nn.Module]:
        """The modules of `model` whose activations NxDT's recompute names (`activations_checkpoint_recompute`)
        select, plus each layer's MLP with `include_mlp`; ModelConfigError for a name no module has."""
        wanted = {self.aliases.get(name, name): name for name in names}
        modules = [module for module in model.modules() if type(module).__name__ in wanted]
        missing = sorted(wanted[name] for name in set(wanted) - {type(module).__name__ for module in modules})
        if missing:
            layers = self.decoder_layers(model)
            parts = {type(child).__name__ for child in layers[0].children()} if layers else set()
            known = [CORE_ATTENTION, ACTIVATION_MULTIPLY, *sorted((parts | set(self.aliases)) - {"Dropout"})]
            raise ModelConfigError(
                f"model.activations_checkpoint_recompute: {', '.join(missing)} names no module "
                f"of {type(model).__name__}; expected class names such as {', '.join(known)}"
            )
        if include_mlp:
            modules += [
                layer.mlp
                for layer in self.decoder_layers(model)  # a gMLP layer has none
                if getattr(layer, "mlp", None) is not None and layer.mlp not in modules
            ]
        return modules

    @staticmethod
    def pipeline_stage_problems(model: nn.Module) -> list[str]:
        """Why `model` cannot be cut into pipeline stages (empty when it can)."""
        return pipeline_stage_problems(model)

    @staticmethod
    def keep_pipeline_stage(model: nn.Module, layers: range, *, first: bool, last: bool) -> nn.Module:
        """`model` reduced (in place) to one pipeline stage, with whole-model parameter names."""
        return keep_pipeline_stage(model, layers, first=first, last=last)

    @staticmethod
    def stage_costs(model: nn.Module) -> tuple[int, int, int]:
        """Parameters of one decoder layer, of what the first stage adds (embeddings) and of what the
        last stage adds (final norm and output layer): the costs pipeline stages are balanced by."""

        def size(module: nn.Module | None) -> int:
            return 0 if module is None else sum(p.numel() for p in module.parameters())

        decoder = model.model
        first = size(decoder.embed_tokens) + size(getattr(decoder, "position_embeddings", None))
        return size(decoder_layers(model)[0]), first, size(model.lm_head) + size(decoder.norm)

    @staticmethod
    def use_context_parallel(model: nn.Module, attention: ContextParallelAttention) -> None:
        """Point every attention layer at a context-parallel kernel (ring attention)."""
        use_context_parallel(model, attention)

    def flops_per_token(self, seq_length: int) -> int:
        """Training FLOPs per token (the numerator of MFU; see `training_flops_per_token`)."""
        return training_flops_per_token(self._reference, seq_length)

    @property
    def loss_chunk_tokens(self) -> int | None:
        """Tokens per chunk of the loss (0: whole logits at once)."""
        return 0

    def layer_widths(self) -> dict[str, int | bool]:
        """Per-token widths of a decoder layer and the output layer, for memory plans: hidden, query and
        key_value (attention widths), ffn (gated: swiglu's gate beside up), vocab (the output rows) and
        experts_per_token (top_k of a mixture-of-experts model, whose ffn is one expert's; 0 when dense)."""
        model = self._reference
        hidden, vocab = model.model.embed_tokens.weight.shape[1], model.lm_head.weight.shape[0]
        layer = next((layer for layer in model.model.layers if hasattr(layer, "self_attn")), None)
        if layer is None:  # gMLP, Mamba or RWKV layers only: what they keep a token, as an ungated MLP's 2 x ffn
            kept = model.model.layers[0].kept_per_token
            return {
                "hidden": hidden,
                "query": 0,
                "key_value": 0,
                "ffn": kept // 2,
                "gated": False,
                "vocab": vocab,
                "experts_per_token": 0,
            }
        attention, mlp = layer.self_attn, layer.mlp
        qkv = getattr(attention, "qkv_proj", None)
        query, key = (
            (qkv.weight_q, qkv.weight_k) if qkv is not None else (attention.q_proj.weight, attention.k_proj.weight)
        )
        moe = next(iter(moe_layers(model)), None)
        if moe is not None:  # per token: top_k experts' MLPs
            ffn, gated, experts_per_token = moe.experts.up_proj.shape[1], moe.experts.gated, moe.spec.top_k
        else:
            ffn, gated, experts_per_token = mlp.up_proj.weight.shape[0], hasattr(mlp, "gate_proj"), 0
        return {
            "hidden": hidden,
            "query": query.shape[0],
            "key_value": key.shape[0],
            "ffn": ffn,
            "gated": gated,
            "vocab": vocab,
            "experts_per_token": experts_per_token,
        }

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self._reference.parameters())

    @property
    def moe(self) -> MoESpec | None:
        """The mixture-of-experts layers' description (None for a dense model)."""
        return None

    @property
    def moe_layer_count(self) -> int:
        """How many decoder layers are MoE layers."""
        return len(moe_layers(self._reference))

    def optimizer_scales(self, names: Iterable[str], optimizer: str) -> list[tuple[float, float]] | None:
        """(learning rate, weight decay) multipliers of the parameters `names` under `optimizer` (muP's), or None
        when every parameter steps alike."""
        return None

    def fp32_state_parameters(self, names: Iterable[str]) -> list[bool] | None:
        """Which of the parameters `names` keep fp32 state under an 8-bit optimizer (bitsandbytes' StableEmbedding
        tables), or None when none does."""
        return None


class MegatronFamily(ModelFamily):
    """The Megatron-style GPT / Llama decoder of nxd-models."""

    source_key = "model"
    aliases = MEGATRON_ALIASES

    def _tp_plan(self) -> dict[str, str]:
        return gpt_tp_plan(self.spec)

    @property
    def head_dim(self) -> int:
        return self.spec.head_dim

    def sharded_sizes(self) -> dict[str, int]:
        s = self.spec
        return {
            "num_attention_heads": s.num_attention_heads,
            "num_kv_heads": s.kv_heads,
            "ffn_hidden_size": s.ffn_size,
            "vocab_size (padded)": s.padded_vocab_size,
        }

    def _hf_mapping(self) -> HFMapping:
        return hf_mapping(self.spec)

    def neox_layout(self) -> NeoXLayout:
        return neox_layout(self.spec)

    @property
    def loss_chunk_tokens(self) -> int:
        return self.spec.loss_chunk_tokens

    @property
    def attends_document_spans(self) -> bool:
        return super().attends_document_spans and self.spec.position_embedding_type not in SCORE_BIASES

    @property
    def packs_exactly(self) -> bool:
        kinds = set(self.spec.attention_layers or ("dense",))
        return not any(layer_kind(kind).reads_row_positions for kind in kinds)

    @property
    def moe(self) -> MoESpec | None:
        return self.spec.moe

    def optimizer_scales(self, names: Iterable[str], optimizer: str) -> list[tuple[float, float]] | None:
        if self.spec.mup is None:
            return None
        return [self._reference.mup_widths[name].optimizer_scales(optimizer) for name in names]

    def fp32_state_parameters(self, names: Iterable[str]) -> list[bool] | None:
        if not self.spec.position_embedding_norm:
            return None
        return [name.endswith("position_embeddings.weight") for name in names]


class HuggingFaceFamily(ModelFamily):
    """A transformers causal LM (Llama, Mistral, Mixtral, Qwen2, Qwen3) built from its config.json;
    `loss_chunk_tokens` as a Megatron-style model's config has it (config.json has no such key, and an
    export must not carry one), kept on each model built for its stage forward."""

    source_key = "model.model_config"

    def __init__(
        self,
        spec: PretrainedConfig,
        attention: AttentionKernel = AttentionKernel.FLASH,
        head: str = "causal_lm",
        loss_chunk_tokens: int = 0,
    ):
        super().__init__(spec, attention, head)
        self._loss_chunk_tokens = loss_chunk_tokens

    def with_head(self, head: str) -> HuggingFaceFamily:
        return type(self)(self.spec, self.attention, head, self._loss_chunk_tokens)

    def _finish(self, model: nn.Module) -> nn.Module:
        model.nxd_loss_chunk_tokens = self._loss_chunk_tokens
        return model

    @property
    def loss_chunk_tokens(self) -> int:
        return self._loss_chunk_tokens

    def _tp_plan(self) -> dict[str, str]:
        return hf_tp_plan(self.spec)

    @property
    def head_dim(self) -> int:
        return getattr(self.spec, "head_dim", None) or self.spec.hidden_size // self.spec.num_attention_heads

    def sharded_sizes(self) -> dict[str, int]:
        s = self.spec
        return {
            "num_attention_heads": s.num_attention_heads,
            "num_key_value_heads": s.num_key_value_heads or s.num_attention_heads,
            "intermediate_size": s.intermediate_size,
            "vocab_size": s.vocab_size,
        }

    def _hf_mapping(self) -> HFMapping:
        return hf_self_mapping(self.spec, list(self.parameter_shapes()))

    @property
    def moe(self) -> MoESpec | None:
        return moe_of(self.spec)

    def recompute_units(self, model: nn.Module, names: Iterable[str], include_mlp: bool = False) -> list[nn.Module]:
        """As for every family; the attention core is a function in transformers, not a module, so
        `CoreAttention` switches the model's attention function to a recomputed one here, and
        `ActivationMultiplyMLP`, inline in transformers' MLPs, becomes a module of each first."""
        names = set(names)
        if CORE_ATTENTION in names:
            recompute_core_attention(model)
        if ACTIVATION_MULTIPLY in names:
            split_activation_multiply(model)
        return super().recompute_units(model, names - {CORE_ATTENTION}, include_mlp)


def model_family(
    spec: GPTConfig | PretrainedConfig,
    attention: AttentionKernel = AttentionKernel.FLASH,
    head: str = "causal_lm",
    loss_chunk_tokens: int = 0,
) -> ModelFamily:
    """The family that builds `spec`, with an LM head or (`head` "score") a reward model's score head;
    a transformers model computes its loss `loss_chunk_tokens` at a time (a Megatron-style model takes
    it from its config)."""
    if isinstance(spec, GPTConfig):
        return MegatronFamily(spec, attention, head)
    if is_hf_config(spec):
        return HuggingFaceFamily(spec, attention, head, loss_chunk_tokens)
    raise ModelConfigError(
        f"model: expected a GPTConfig or a transformers PretrainedConfig, found {type(spec).__name__}"
    )
