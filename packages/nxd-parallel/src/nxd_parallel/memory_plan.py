"""How much memory each rank of a layout needs, counted before launch from shapes alone.

Per pipeline stage (tensor, data and context-parallel ranks of a stage hold the same amounts), in bytes:
- parameters: each parameter's share on a rank (tensor-parallel styles split rows, columns or the
  vocabulary; a replicated key/value projection under kv_replicator and norms stay whole; ZeRO-1
  divides by the data x context ranks, and adds the unsharded parameters FSDP2 holds while computing);
- gradients, master weights and optimizer state of the trainable parameters (LoRA: the adapters), by
  the precision policy's dtypes and the optimizer's state count, divided under ZeRO-1; the fp32 copies
  a policy without masters makes for the step only (bf16SR) are counted at the step;
- activations saved for the backward of one micro-batch (`LayerWidths`: per token, the values each
  decoder layer keeps: norm inputs, the linear layers' inputs, attention's q, k, v (grouped-query k
  and v repeated to the query heads, as the attention kernels take them) and output, the MLP's inner
  products; a mixture of experts keeps those of top_k experts and the rows it exchanges, its experts
  split over ep x tp ranks and balanced), times the stage's layers and the micro-batches in flight (1F1B: pp - stage);
  full recompute keeps each layer's input only (plus one layer recomputed), selective drops the parts
  it recomputes, sequence parallelism divides the norm inputs by tp, context parallelism the tokens;
- the loss: the last stage's logits of one micro-batch (or of one chunk, with a loss chunk size) in
  the compute dtype, their fp32 log-softmax and its gradient;
- the runtime: what the process holds besides (measured by the caller, 0 on an accelerator).
The peak is the steady state plus the larger of the forward/backward and the optimizer step.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from torch import nn

from .dims import ParallelDims
from .pipeline import rank_stages

GIB = 2**30
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_SPLIT = {
    "colwise",
    "colwise_output",
    "vocab",
    "qkv",
    "colwise_kv",
    "rowwise",
    "lora_b_colwise",
    "lora_b_colwise_kv",
    "lora_a_rowwise",
    "heads",
}
_KV = {"colwise_kv", "lora_b_colwise_kv"}


@dataclass(frozen=True)
class LayerWidths:
    """Per-token widths of one decoder layer and the output layer (from the model family)."""

    hidden: int
    query: int
    key_value: int
    """Keys' width (values have the same)."""
    ffn: int
    gated: bool
    vocab: int
    experts_per_token: int = 0
    """Experts each token visits (MoE top_k, `ffn` then one expert's); 0 for a dense MLP."""


@dataclass(frozen=True)
class StateBytes:
    """Bytes per value (from the precision policy and the optimizer)."""

    parameter: int
    gradient: int
    master: int
    """Per trainable value, 0 without persistent master weights."""
    optimizer_state: int
    """All the optimizer's state tensors of one trainable value."""
    step_copies: int
    """Per trainable value, made for the optimizer step only (fp32 copies of bf16 parameters and gradients)."""
    compute: int
    """The activations' dtype."""
    block_state: int = 0
    """Per trainable value, optimizer state in blocks of 256 consecutive values of the whole tensor (8-bit Adam's):
    divided as the parameter where each rank's shard is whole blocks (its last axis a multiple of 256 on every
    rank), else kept whole on every rank."""


@dataclass(frozen=True)
class Workload:
    micro_batch: int
    seq_length: int
    microbatches: int
    """Micro-batches per step on a data-parallel rank (gradient accumulation)."""
    loss_chunk_tokens: int = 0


@dataclass(frozen=True)
class RankMemory:
    """One pipeline stage's ranks, in bytes."""

    stage: int
    parameters: int
    gradients: int
    master_weights: int
    optimizer_state: int
    activations: int
    loss: int
    step: int
    runtime: int
    offloaded: int = 0
    """Host memory of the shards CPU offload keeps there (parameters, gradients, masters, optimizer state and
    the step's copies), not in `total`."""

    @property
    def total(self) -> int:
        steady = self.parameters + self.gradients + self.master_weights + self.optimizer_state + self.runtime
        return steady + max(self.activations + self.loss, self.step)


def memory_plan(
    model: nn.Module,
    tp_plan: dict[str, str],
    stages: list[range],
    widths: LayerWidths,
    *,
    sizes: ParallelDims,
    state: StateBytes,
    work: Workload,
    zero1: bool,
    sequence_parallel: bool,
    kv_replicator: int,
    recompute: str | None,
    recompute_modules: tuple[str, ...] = (),
    virtual_stages: int = 1,
    runtime: int = 0,
    zero3: bool = False,
    cpu_offload: bool = False,
) -> list[RankMemory]:
    """Each pipeline rank's memory for `model` (a meta build of the whole model, adapters included) split
    by `tp_plan` and `stages` (the layers of each pipeline stage, `pipeline_ranges`) over the layout `sizes`.
    FSDP2's gathered copies: every layer's between forward and backward (zero1), or two layers' at a time (zero3: the
    one computing and the one gathered ahead), beside the embedding's and output layer's. With `cpu_offload` the sharded
    state is counted in host memory (`offloaded`) and the device keeps the gathered copies only."""
    modules = [name for name, _ in model.named_modules()]
    styles = {name: style for pattern, style in tp_plan.items() for name in fnmatch.filter(modules, pattern)}
    plans = []
    for pp_rank in range(sizes.pp):
        numbers = rank_stages(pp_rank, sizes.pp, virtual_stages)
        held = trained = 0.0  # values on a rank: a parameter's tensor-parallel share over its ZeRO-1 ranks
        blocks = 0.0  # block state's values on a rank: shards of whole blocks, or whole tensors
        gathered = 0  # FSDP2's unsharded copy while computing
        per_layer: dict[int, int] = {}  # the same of each decoder layer (zero3 gathers them one by one)
        for name, parameter in model.named_parameters():
            if not _on_stages(name, numbers, stages):
                continue
            module = name.rpartition(".")[0]
            data = sizes.dp * sizes.cp if zero1 else 1
            if module.endswith(".experts") and styles.get(module.removesuffix(".experts")) == "moe":
                share = -(-parameter.numel() // (sizes.tp * sizes.ep))  # experts over ep, their ffn over tp
                data = sizes.dp * sizes.cp // sizes.ep if zero1 else 1  # ZeRO-1 over the ranks holding them
            else:
                share = _tp_share(parameter, styles.get(module), sizes.tp, kv_replicator)
            held += share / data
            trained += share / data if parameter.requires_grad else 0
            if parameter.requires_grad:
                blocks += _block_state_values(parameter, share, data, styles.get(module), sizes.tp, kv_replicator)
            layer = LAYER.search(name)
            if data > 1 and zero3 and layer is not None:
                per_layer[int(layer.group(1))] = per_layer.get(int(layer.group(1)), 0) + share
            elif data > 1:
                gathered += share
        gathered += sum(sorted(per_layer.values())[-2:])
        held, trained = int(held), int(trained)
        layers = sum(len(stages[number]) for number in numbers)
        in_flight = min(sizes.pp - pp_rank, work.microbatches) if sizes.pp > 1 else 1
        tokens = work.micro_batch * work.seq_length // sizes.cp
        activations = in_flight * _activation_bytes(
            widths, tokens, layers, state.compute, sizes.tp, sequence_parallel, recompute, recompute_modules
        )
        last = len(stages) - 1 in numbers
        loss_tokens = min(work.loss_chunk_tokens, tokens) if work.loss_chunk_tokens > 0 else tokens
        # logits in the compute dtype; their fp32 copy, log-softmax and its gradient
        loss = loss_tokens * -(-widths.vocab // sizes.tp) * (state.compute + 12) if last else 0
        sharded = {
            "gradients": trained * state.gradient,
            "master_weights": trained * state.master,
            "optimizer_state": trained * state.optimizer_state + int(blocks) * state.block_state,
            "step": trained * state.step_copies,
        }
        offloaded = 0
        if cpu_offload and zero1 and sizes.dp * sizes.cp > 1:
            offloaded = held * state.parameter + sum(sharded.values())
            held, sharded = 0, dict.fromkeys(sharded, 0)
        plans.append(
            RankMemory(
                stage=pp_rank,
                parameters=(held + gathered) * state.parameter,
                **sharded,
                activations=activations,
                loss=loss,
                runtime=runtime,
                offloaded=offloaded,
            )
        )
    return plans


def _on_stages(name: str, numbers: list[int], stages: list[range]) -> bool:
    """Whether parameter `name` belongs to one of the stages `numbers`: its layer's, or the embedding's
    (the first stage) and the final norm's and output layer's (the last)."""
    layer = LAYER.search(name)
    if layer is not None:
        return any(int(layer.group(1)) in stages[number] for number in numbers)
    first = "embed" in name or "position_embeddings" in name
    return (0 if first else len(stages) - 1) in numbers


def _block_state_values(
    parameter: nn.Parameter, share: int, data: int, style: str | None, tp: int, kv_replicator: int
) -> float:
    """Values of `parameter`'s state in 256-value blocks (8-bit Adam's) on one rank: its `share` over its `data`
    ranks where each shard is whole rows of whole blocks; with the last axis's split undone where that split
    (over tp for row-parallel weights and column-parallel biases, over ZeRO's ranks for a vector) would cut
    blocks; the whole tensor where rows are not whole blocks."""
    if parameter.dim() == 0 or parameter.shape[-1] % 256:
        return parameter.numel()
    tp_last = (
        tp
        if tp > 1
        and style in _SPLIT
        and not (style in _KV and kv_replicator > 1)
        and (style in ("rowwise", "lora_a_rowwise")) == (parameter.dim() > 1)
        else 1
    )
    data_last = data if parameter.dim() == 1 else 1
    if parameter.shape[-1] % (256 * tp_last * data_last) == 0:
        return share / data
    return parameter.numel() if parameter.dim() == 1 else share * tp_last / data


def _tp_share(parameter: nn.Parameter, style: str | None, tp: int, kv_replicator: int) -> int:
    """Values of `parameter` on one tensor-parallel rank."""
    count = parameter.numel()
    if tp == 1 or style not in _SPLIT:
        return count
    if style in _KV and kv_replicator > 1:
        return count  # a rank keeps the whole unreplicated weight
    if style in ("rowwise", "lora_a_rowwise") and parameter.dim() == 1:
        return count  # a row-parallel bias is replicated
    return -(-count // tp)


def _activation_bytes(
    w: LayerWidths,
    tokens: int,
    layers: int,
    dtype_bytes: int,
    tp: int,
    sequence_parallel: bool,
    recompute: str | None,
    recompute_modules: tuple[str, ...],
) -> int:
    """Saved activations of `layers` decoder layers for `tokens` tokens of one micro-batch."""
    norm_inputs = 2 * w.hidden / (tp if sequence_parallel else 1)
    linear_inputs = 2 * w.hidden  # the normed inputs of the q/k/v and the gate/up projections
    # q, k and v as the attention kernel takes them (grouped-query k and v repeated to the query heads),
    # its output and o_proj's input; recomputing the core keeps q, the unrepeated k and v, and o_proj's input
    attention = 5 * w.query / tp
    mlp = (4 if w.gated else 2) * w.ffn / tp  # gate, up, activation and product (or up and activation)
    if w.experts_per_token:  # each token's rows at top_k experts: sent, received and returned rows, their MLPs
        mlp = w.experts_per_token * (mlp + 3 * w.hidden)
    if recompute == "selective":
        if "CoreAttention" in recompute_modules:
            attention = (2 * w.query + 2 * w.key_value) / tp
        if "ActivationMultiplyMLP" in recompute_modules and w.gated:
            mlp -= 2 * w.ffn / tp
    per_layer = norm_inputs + linear_inputs + attention + mlp
    if recompute == "full":  # each layer's input, and one layer recomputed in the backward
        return int(tokens * dtype_bytes * (layers * w.hidden / (tp if sequence_parallel else 1) + per_layer))
    return int(tokens * dtype_bytes * layers * per_layer)
