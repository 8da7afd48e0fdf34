"""The mixture-of-experts layer of NxDT's `model.moe` block (Mixtral), shared by both model families.

A router scores each token against every expert; each token goes to its `top_k` experts (or, with
Sinkhorn routing, to the top-1 expert of a balanced assignment), whose gated MLP outputs are summed,
weighted by the router's affinities. The semantics are those of NeuronX Distributed's MoE module,
which NxDT builds its Mixtral recipes from:

- affinities: `router_activation` (softmax or sigmoid) of the router logits (the router runs in its
  parameters' dtype, outside autocast; the logits and what follows in fp32);
  `normalize_top_k_affinities` rescales a token's kept affinities to sum to one.
- capacity: with a `capacity_factor` (and not dropless) each expert takes at most
  C = min(T, max(ceil(T * top_k * capacity_factor / num_experts), min_capacity)) of the T tokens of a
  micro-batch (`eval_capacity_factor` in evaluation), in token order; a token beyond it is dropped for that
  expert (its affinity there becomes zero).
- routing "deepspeed" is DeepSpeed's gate instead (see `deepspeed_gating`), and `residual` mixes a dense MLP
  with the experts per token (DeepSpeed's PR-MoE).
- the load-balancing loss of one layer (Switch Transformer eq. 4-6, scaled as NxD and megablocks do
  so that a balanced router scores 1): E / k * sum over k and e of f[k, e] * P[e], where f[k, e] is the
  fraction of tokens whose k-th choice (top-k of the softmax) is expert e and P[e] the mean softmax
  probability of e. nxd averages it over the MoE layers (transformers' Mixtral pools the layers'
  tokens first; the two agree for one layer) and adds `router_aux_loss_coef` times it to the loss.

Expert weights are stacked (experts first): `gate_proj` and `up_proj` (E, ffn, hidden) and
`down_proj` (E, hidden, ffn), so expert parallelism shards dimension 0 and tensor parallelism the ffn
dimension. Tokens reach the experts through a `Dispatcher`: this module's own runs every expert
here; nxd-parallel installs one that exchanges tokens with the ranks holding the other experts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .deepspeed_gating import DEEPSPEED_TOP_K, deepspeed_capacity, deepspeed_gate
from .distributed_types import is_dtensor
from .errors import ModelConfigError

ROUTING = ("top_k", "sinkhorn", "neox_sinkhorn", "deepspeed")
ROUTER_ACTIVATIONS = ("softmax", "sigmoid")


@dataclass(frozen=True)
class MoESpec:
    """The `model.moe` block as plain values (nxd-train fills it)."""

    num_experts: int
    top_k: int = 1
    frequency: int = 1
    """Every `frequency`-th decoder layer is an MoE layer (see `MoESpec.is_moe_layer`)."""
    routing: str = "top_k"
    router_activation: str = "softmax"
    normalize_top_k_affinities: bool = False
    capacity_factor: float | None = None
    """None (or dropless): no token is dropped."""
    eval_capacity_factor: float | None = None
    """The capacity factor of evaluation forwards (DeepSpeed's eval_capacity_factor); None: capacity_factor."""
    min_capacity: int = 0
    """An expert takes at least this many tokens when capacity drops some (DeepSpeed's min_capacity)."""
    residual: bool = False
    """PR-MoE (DeepSpeed's use_residual): a dense MLP beside the experts, the two mixed per token by
    softmax(Linear(hidden, 2)) (`MoELayer.coefficient`)."""
    glu: bool = False
    """The experts gate their activation, act(gate(x)) * up(x), even when the dense MLP does not (moe_glu)."""
    random_token_selection: bool = True
    """deepspeed routing, top-1: an expert over capacity keeps a random choice of its tokens while training
    (DeepSpeed's use_rts); false: the first in token order."""
    sample_second_expert: bool = True
    """deepspeed routing, top-2: the second expert is the largest of the other logits plus Gumbel noise while
    training (DeepSpeed's top2_2nd_expert_sampling); false: the second-largest logit."""
    dropout: float = 0.0
    """Dropout on the experts' inner activation, as ffn_dropout on a dense MLP's."""
    sinkhorn_iterations: int = 30
    sinkhorn_tol: float | None = None
    router_aux_loss: bool = False
    """Compute the load-balancing loss (NxDT's output_router_logits)."""
    router_aux_loss_coef: float = 0.0
    jitter_eps: float | None = None
    """While training, the top-k router reads its input times uniform noise in [1 - eps, 1 + eps) (GPT-NeoX's
    moe_jitter_eps); None: no jitter."""

    def __post_init__(self) -> None:
        problems = moe_problems(self)
        if problems:
            raise ModelConfigError(*problems)

    def is_moe_layer(self, index: int, one_based: bool) -> bool:
        """Whether decoder layer `index` (0-based) is an MoE layer. The Megatron-style model counts
        layers from 1 (layers f, 2f, ...), NxDT's Mixtral from 0 (layers 0, f, 2f, ...)."""
        return (index + 1 if one_based else index) % self.frequency == 0


def moe_problems(spec: MoESpec) -> list[str]:
    key = "model.moe"
    found = []
    if spec.num_experts < 2:
        found.append(
            f"{key}.num_experts: expected at least 2 (one expert is the dense MLP: remove the moe "
            f"block), found {spec.num_experts}"
        )
    if not 1 <= spec.top_k <= spec.num_experts:
        found.append(f"{key}.top_k: expected 1 to num_experts ({spec.num_experts}), found {spec.top_k}")
    if spec.routing not in ROUTING:
        found.append(f"{key}.routing_algorithm: expected one of {', '.join(ROUTING)}, found {spec.routing!r}")
    elif spec.routing == "sinkhorn" and spec.top_k != 1:
        found.append(
            f"{key}.routing_algorithm: sinkhorn balances top-1 routing only; expected top_k 1, found {spec.top_k}"
        )
    if spec.jitter_eps is not None and not 0 < spec.jitter_eps < 1:
        found.append(
            f"{key}.jitter_eps: expected a fraction between 0 and 1 (the noise scales the router's input by "
            f"1 +- eps), found {spec.jitter_eps}"
        )
    elif spec.jitter_eps is not None and spec.routing != "top_k":  # DeepSpeed's gate takes no jitter from NeoX
        found.append(
            f"{key}.jitter_eps: the top-k router jitters its input (GPT-NeoX's Sinkhorn router does not); "
            f"expected routing_algorithm top_k with it, found {spec.routing}"
        )
    if spec.routing == "deepspeed":
        if spec.top_k not in DEEPSPEED_TOP_K:
            found.append(
                f"{key}.top_k: DeepSpeed's gate is top-1 or top-2; expected 1 or 2 with routing_algorithm "
                f"deepspeed, found {spec.top_k}"
            )
        if spec.router_activation != "softmax" or spec.normalize_top_k_affinities:
            found.append(
                f"{key}.routing_algorithm: DeepSpeed's gate weighs by softmax (renormalised for top-2 only); "
                "expected router_activation softmax and normalize_top_k_affinities false with deepspeed"
            )
    if spec.min_capacity < 0:
        found.append(f"{key}.min_capacity: expected 0 or more, found {spec.min_capacity}")
    if spec.eval_capacity_factor is not None and spec.eval_capacity_factor <= 0:
        found.append(f"{key}.eval_capacity_factor: expected a positive factor, found {spec.eval_capacity_factor}")
    if spec.router_activation not in ROUTER_ACTIVATIONS:
        found.append(
            f"{key}.router_activation: expected one of {', '.join(ROUTER_ACTIVATIONS)}, "
            f"found {spec.router_activation!r}"
        )
    if spec.capacity_factor is not None and spec.capacity_factor <= 0:
        found.append(f"{key}.capacity_factor: expected a positive factor (or dropless), found {spec.capacity_factor}")
    if spec.router_aux_loss_coef and not spec.router_aux_loss:
        found.append(
            f"{key}.router_aux_loss_coef: the load-balancing loss is computed only with "
            f"output_router_logits: True; found {spec.router_aux_loss_coef} with False"
        )
    return found


def expert_capacity(tokens: int, spec: MoESpec, training: bool = True) -> int | None:
    """Tokens one expert takes from a micro-batch of `tokens` (None: all of them); evaluation forwards take
    eval_capacity_factor when it is set."""
    if spec.capacity_factor is None:
        return None
    factor = spec.capacity_factor if training or spec.eval_capacity_factor is None else spec.eval_capacity_factor
    if spec.routing == "deepspeed":
        return deepspeed_capacity(tokens, spec.num_experts, spec.top_k, factor, spec.min_capacity)
    return min(tokens, max(math.ceil(tokens * spec.top_k * factor / spec.num_experts), spec.min_capacity))


def load_balancing_loss(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """One layer's auxiliary loss from its router logits (tokens, experts); see the module docstring."""
    num_experts = logits.shape[-1]
    probabilities = torch.softmax(logits.float(), dim=-1)
    chosen = torch.topk(probabilities, top_k, dim=-1).indices
    fraction = F.one_hot(chosen, num_experts).float().mean(0)  # (top_k, experts)
    return (fraction * probabilities.mean(0)).sum() * (num_experts / top_k)


def sinkhorn(cost: torch.Tensor, iterations: int, tol: float | None = None) -> torch.Tensor:
    """Megatron's Sinkhorn balancing of exp(cost) over tokens and experts, a fixed number of iterations;
    ModelConfigError when `tol` is given and the last iteration's change exceeds it."""
    cost = torch.exp(cost)
    d0 = torch.ones(cost.shape[0], dtype=cost.dtype, device=cost.device)
    d1 = torch.ones(cost.shape[1], dtype=cost.dtype, device=cost.device)
    error = torch.zeros((), dtype=cost.dtype, device=cost.device)
    for _ in range(iterations):
        d0 = (1 / d0.shape[0]) / (torch.sum(d1 * cost, 1) + 1e-8)
        new_d1 = (1 / d1.shape[0]) / (torch.sum(d0.unsqueeze(1) * cost, 0) + 1e-8)
        error, d1 = torch.mean(torch.abs(new_d1 - d1)), new_d1
    if tol is not None and float(error) >= tol:
        raise ModelConfigError(
            f"model.moe.sinkhorn_tol: Sinkhorn changed by {float(error):.3g} in its last "
            f"iteration; expected under {tol} (raise sinkhorn_iterations)"
        )
    return d1 * cost * d0.unsqueeze(1)


NEOX_SINKHORN_ITERATIONS, NEOX_SINKHORN_TOL = 3, 1e-4
"""GPT-NeoX's SinkhornRouter.sinkhorn: at most three iterations, stopping once the expert scaling moves less."""


def neox_sinkhorn(cost: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX's Sinkhorn balancing of exp(cost): the expert scaling starts at 1 / (experts x column sums) and
    alternates with the token scaling for at most NEOX_SINKHORN_ITERATIONS, stopping once its mean change is
    below NEOX_SINKHORN_TOL."""
    cost = torch.exp(cost)
    tokens, experts = cost.shape
    d0 = torch.ones(tokens, dtype=cost.dtype, device=cost.device)
    d1 = 1 / (experts * torch.sum(cost, 0))
    for _ in range(NEOX_SINKHORN_ITERATIONS):
        d0 = (1 / tokens) / (torch.sum(d1 * cost, 1) + 1e-8)
        new_d1 = (1 / experts) / (torch.sum(d0.unsqueeze(1) * cost, 0) + 1e-8)
        error, d1 = torch.mean(torch.abs(d1 - new_d1)), new_d1
        if float(error) < NEOX_SINKHORN_TOL:
            break
    return d1 * cost * d0.unsqueeze(1)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter (the tensor itself when it is not sharded)."""
    return tensor.to_local() if is_dtensor(tensor) else tensor


class Experts(nn.Module):
    """The experts' stacked gated MLPs: down(act(gate(x)) * up(x)), or down(act(up(x))) ungated."""

    def __init__(
        self,
        num_experts: int,
        hidden: int,
        ffn: int,
        activation: Callable[[torch.Tensor], torch.Tensor],
        gated: bool,
        dropout: float,
    ):
        super().__init__()
        self.activation, self.gated = activation, gated
        if gated:
            self.gate_proj = nn.Parameter(torch.empty(num_experts, ffn, hidden))
        self.up_proj = nn.Parameter(torch.empty(num_experts, ffn, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, ffn))
        self.dropout = nn.Dropout(dropout)
        self.gradient_scale = 1.0
        """Set by expert parallelism: gradients summed over more ranks' tokens than the loss scale counts."""

    def forward(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Outputs of rows grouped by expert: the first counts[0] rows go to this rank's first expert...
        (called as a module, so that data parallelism gathers the weights first)."""
        # unbind, not indexing: the backward then stacks the experts' gradients once per weight, where
        # indexing would build a zero-filled gradient of the whole stack for every expert
        weights = [_scaled_gradient(local(w), self.gradient_scale).unbind(0) for w in self._weights()]
        outputs = []
        for expert, part in enumerate(torch.split(rows, counts)):
            if self.gated:
                gate, up, down = (w[expert] for w in weights)
                inner = self.activation(F.linear(part, gate)) * F.linear(part, up)
            else:
                up, down = (w[expert] for w in weights)
                inner = self.activation(F.linear(part, up))
            outputs.append(F.linear(self.dropout(inner), down))
        return torch.cat(outputs) if outputs else rows.new_zeros(0, rows.shape[-1])

    def _weights(self) -> list[torch.Tensor]:
        return [self.gate_proj, self.up_proj, self.down_proj] if self.gated else [self.up_proj, self.down_proj]


class _GradientScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


def _scaled_gradient(tensor: torch.Tensor, scale: float) -> torch.Tensor:
    return tensor if scale == 1.0 else _GradientScale.apply(tensor, scale)


class Dispatcher(Protocol):
    """How rows (one per kept token-expert pair, grouped by expert) reach their experts and come back."""

    def __call__(self, rows: torch.Tensor, counts: torch.Tensor, experts: Experts) -> torch.Tensor:
        """The experts' outputs for `rows`, in the same order; `counts` (num_experts) rows per expert."""


def run_here(rows: torch.Tensor, counts: torch.Tensor, experts: Experts) -> torch.Tensor:
    """Every expert is on this rank."""
    return experts(rows, counts.tolist())


class _AuxLossGradient(torch.autograd.Function):
    """Identity on the layer output; in backward, the auxiliary loss receives gradient `weight`, so the
    loss joins the training objective without travelling to the loss function (pipeline stages)."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, aux_loss: torch.Tensor, weight: float) -> torch.Tensor:
        ctx.weight = weight
        ctx.save_for_backward(aux_loss)
        return output.view_as(output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        (aux_loss,) = ctx.saved_tensors
        return grad, torch.full_like(aux_loss, ctx.weight), None


@dataclass
class RoutingTotals:
    """One MoE layer's routing over the training forwards since the last `take_routing_totals`."""

    forwards: int = 0
    aux_loss: torch.Tensor | float = 0.0
    """Sum of the layer's auxiliary loss over those forwards (kept on the device: no host sync)."""
    assigned: torch.Tensor | None = None
    """(experts,) token-expert assignments the router made, before capacity."""
    dropped: torch.Tensor | float = 0.0
    """Assignments dropped by capacity."""


class MoELayer(nn.Module):
    """Router + experts in place of a decoder layer's MLP: (batch, seq, hidden) -> the same shape. With
    `spec.residual` the caller's dense `residual_mlp` runs beside the experts (PR-MoE)."""

    def __init__(
        self,
        spec: MoESpec,
        hidden: int,
        ffn: int,
        activation: Callable[[torch.Tensor], torch.Tensor],
        gated: bool,
        moe_index: int,
        moe_layer_count: int,
        residual_mlp: nn.Module | None = None,
    ):
        super().__init__()
        self.spec, self.moe_index, self.moe_layer_count = spec, moe_index, moe_layer_count
        self.router = nn.Linear(hidden, spec.num_experts, bias=False)
        self.experts = Experts(spec.num_experts, hidden, ffn, activation, gated or spec.glu, spec.dropout)
        if spec.residual:
            if residual_mlp is None:
                raise ModelConfigError(
                    "model.moe.residual: this model family builds no dense MLP beside the experts; expected false"
                )
            self.residual_mlp = residual_mlp
            self.coefficient = nn.Linear(hidden, 2)
            """The per-token mix of the experts' output and the dense MLP's (softmax of two logits)."""
        self.dispatch: Dispatcher = run_here
        self.aux_loss_weight = 0.0
        """Gradient the auxiliary loss of one forward receives (`set_aux_loss_weights`)."""
        self.totals = RoutingTotals()
        self.drops_tokens = True
        """Experts keep at most their capacity (spec.capacity_factor); off for inference (`route_every_token`)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        shape = hidden.shape
        tokens = hidden.reshape(-1, shape[-1])
        with torch.autocast(tokens.device.type, enabled=False):  # the router in its parameters' dtype
            logits = self.router(self._jittered(tokens.to(self.router.weight.dtype))).float()
        chosen, choice, weights = self._route(logits)
        pair_expert, pair_token = choice.t().nonzero(as_tuple=True)  # grouped by expert, then token order
        rows = self.dispatch(tokens[pair_token], choice.sum(0), self.experts)
        weighted = rows.float() * weights[pair_token, pair_expert].unsqueeze(1)
        output = torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
        output = output.index_add(0, pair_token, weighted).to(hidden.dtype).reshape(shape)
        if self.spec.residual:  # PR-MoE: experts and the dense MLP mixed per token
            mix = torch.softmax(self.coefficient(hidden), dim=-1)
            output = output * mix[..., 0:1] + self.residual_mlp(hidden) * mix[..., 1:]
        recording = self.training and torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1
        aux_k = 1 if self.spec.routing == "deepspeed" else self.spec.top_k  # DeepSpeed counts first choices only
        aux = load_balancing_loss(logits, aux_k) if self.spec.router_aux_loss else None
        if recording:  # not in eval, nor when activation recompute replays the forward in backward
            self._record(chosen, choice, aux)
        if aux is not None and self.aux_loss_weight and torch.is_grad_enabled():
            output = _AuxLossGradient.apply(output, aux, self.aux_loss_weight)
        return output

    def _jittered(self, tokens: torch.Tensor) -> torch.Tensor:
        """The router's input, times 1 - eps + 2 eps u with u ~ U[0, 1) per value while training (drawn from torch's
        generator, whose state activation recompute restores, so a replay draws the same noise)."""
        eps = self.spec.jitter_eps
        if not self.training or eps is None:
            return tokens
        return tokens * (1.0 - eps + torch.rand_like(tokens) * (2.0 * eps))

    def _route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens, experts) choices and those kept by capacity (bool), and the combine weights (fp32,
        zero where not kept)."""
        spec = self.spec
        capacity = expert_capacity(logits.shape[0], spec, self.training) if self.drops_tokens else None
        if spec.routing == "deepspeed":
            return deepspeed_gate(
                logits,
                spec.top_k,
                capacity,
                random_selection=self.training and spec.random_token_selection,
                sample_second=self.training and spec.sample_second_expert,
            )
        affinities = torch.softmax(logits, dim=-1) if spec.router_activation == "softmax" else torch.sigmoid(logits)
        with torch.no_grad():
            if spec.routing == "sinkhorn":
                balanced = (
                    sinkhorn(logits.detach(), spec.sinkhorn_iterations, spec.sinkhorn_tol)
                    if self.training
                    else logits.detach()
                )
                index = balanced.argmax(dim=-1, keepdim=True)
            elif spec.routing == "neox_sinkhorn":  # balanced top-k while training, plain top-k in evaluation
                balanced = neox_sinkhorn(logits.detach().float()) if self.training else logits.detach()
                index = torch.topk(balanced, spec.top_k, dim=-1).indices
            else:
                index = torch.topk(logits.detach(), spec.top_k, dim=-1).indices
            chosen = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, index, True)
            kept = chosen if capacity is None else chosen & (torch.cumsum(chosen.int(), dim=0) <= capacity)
        weights = affinities.masked_fill(~kept, 0.0)
        if spec.normalize_top_k_affinities:
            weights = F.normalize(weights, p=1.0, dim=-1)
        return chosen, kept, weights

    @torch.no_grad()
    def _record(self, chosen: torch.Tensor, kept: torch.Tensor, aux: torch.Tensor | None) -> None:
        totals = self.totals
        assigned = chosen.sum(0).double()
        totals.forwards += 1
        totals.assigned = assigned if totals.assigned is None else totals.assigned + assigned
        totals.dropped = totals.dropped + (chosen.sum() - kept.sum()).double()
        if aux is not None:
            totals.aux_loss = totals.aux_loss + aux.detach().double()


def route_every_token(model: nn.Module) -> None:
    """No expert capacity in `model`'s MoE layers: for inference, where what a forward holds (one decoded token,
    or a batch padded for scoring) would otherwise decide which tokens are dropped; DeepSpeed sets a separate
    eval capacity for the same reason."""
    for layer in moe_layers(model):
        layer.drops_tokens = False


def moe_layers(model: nn.Module | Iterable[nn.Module]) -> list[MoELayer]:
    """The MoE layers of a model (or of a rank's pipeline stages)."""
    modules = [model] if isinstance(model, nn.Module) else list(model)
    return [layer for module in modules for layer in module.modules() if isinstance(layer, MoELayer)]


def set_aux_loss_weights(model: nn.Module | Iterable[nn.Module], micro_batches: int) -> None:
    """Weigh each MoE layer's auxiliary loss into the gradient: `router_aux_loss_coef` times the mean over
    the model's MoE layers and a step's `micro_batches` (per data-parallel rank; the data-parallel
    reduction averages the ranks' gradients)."""
    for layer in moe_layers(model):
        layer.aux_loss_weight = layer.spec.router_aux_loss_coef / (micro_batches * layer.moe_layer_count)


def take_routing_totals(model: nn.Module | Iterable[nn.Module]) -> dict[int, RoutingTotals]:
    """Each MoE layer's totals since the last call (by its index among the model's MoE layers), reset."""
    taken = {}
    for layer in moe_layers(model):
        taken[layer.moe_index], layer.totals = layer.totals, RoutingTotals()
    return taken


def routing_metrics(
    totals: dict[int, RoutingTotals],
    *,
    moe_layer_count: int,
    num_experts: int,
    group: dist.ProcessGroup | None = None,
    copies: int = 1,
) -> dict[str, float]:
    """A step's routing figures over every rank: `moe_aux_loss` (mean over MoE layers and micro-batches,
    when computed), `moe_dropped_fraction` (assignments dropped by capacity) and `moe_expert_load_min`
    / `_max` (an expert's assignments over a balanced share, 1.0 when even; over all MoE layers).
    Ranks holding the same tokens (tensor-parallel peers) report the same totals: `copies` of each."""
    table = torch.zeros(moe_layer_count, 3 + num_experts, dtype=torch.float64)
    for index, t in totals.items():
        table[index, :3] = torch.stack(
            [torch.as_tensor(value, dtype=torch.float64).cpu() for value in (t.forwards, t.aux_loss, t.dropped)]
        )
        if t.assigned is not None:
            table[index, 3:] = t.assigned.cpu()
    if group is not None or (dist.is_available() and dist.is_initialized()):
        reduced = table.to(_device(group))
        dist.all_reduce(reduced, group=group)
        table = reduced.cpu() / copies
    forwards, aux, dropped, assigned = table[:, 0], table[:, 1], table[:, 2], table[:, 3:]
    if forwards.sum() == 0:
        return {}
    used = assigned.sum(1) > 0
    load = assigned[used] / (assigned[used].sum(1, keepdim=True) / num_experts)
    metrics = {
        "moe_dropped_fraction": float(dropped.sum() / assigned.sum()),
        "moe_expert_load_min": float(load.min()),
        "moe_expert_load_max": float(load.max()),
    }
    if aux.any():
        metrics["moe_aux_loss"] = float(aux.sum() / forwards.sum())
    return metrics


def _device(group: dist.ProcessGroup | None) -> torch.device:
    backend = dist.get_backend(group)
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
