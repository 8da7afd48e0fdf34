"""GPT-NeoX's own optimizers, as its megatron/optimizers.py steps them: Lion, MADGRAD with decoupled
weight decay (madgrad_wd) and SM3. None is in torch; the PyPI packages differ from NeoX's (madgrad decays after
the step, from the old weights) or keep a global step counter outside the per-parameter state that
torch's distributed checkpoints save, so they are written here, with those packages as test references."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .dtensors import is_dtensor


def _evaluate(closure: Callable[[], float] | None) -> float | None:
    """The loss a step's closure recomputes (with gradients), as torch's optimizers take it."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, arXiv:2302.06675): the sign of the momentum interpolated with the gradient is
    the update; weight decay multiplies the weights by 1 - lr x weight_decay first. One state tensor."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ) -> None:
        if lr < 0 or weight_decay < 0 or not all(0.0 <= beta <= 1.0 for beta in betas):
            raise ValueError(
                f"Lion: expected lr and weight_decay >= 0 and betas in [0, 1], found lr {lr}, "
                f"weight_decay {weight_decay}, betas {betas}"
            )
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = _evaluate(closure)
        for group in self.param_groups:
            lr, decay, (beta1, beta2) = group["lr"], group["weight_decay"], group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                momentum = state["exp_avg"]
                p.mul_(1 - lr * decay)
                p.add_(momentum.mul(beta1).add_(p.grad, alpha=1 - beta1).sign_(), alpha=-lr)
                momentum.mul_(beta2).add_(p.grad, alpha=1 - beta2)
        return loss


class MadgradWD(torch.optim.Optimizer):
    """MADGRAD (Defazio and Jelassi 2021, arXiv:2101.11075) with GPT-NeoX's decoupled weight decay: the
    weights are multiplied by 1 - (lr + eps) x weight_decay before the dual-averaging step; step k weighs
    its gradient by (lr + eps) sqrt(k + 1), the denominator is the cube root of the weighted sum of squared
    gradients plus eps, and momentum averages the weights towards the step's point. The step count is
    kept per parameter (`step`), where NeoX keeps one for the optimizer."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eps: float = 1e-6,
    ) -> None:
        if lr <= 0 or not 0 <= momentum < 1 or weight_decay < 0 or eps < 0:
            raise ValueError(
                f"madgrad_wd: expected lr > 0, momentum in [0, 1), weight_decay >= 0 and eps >= 0, "
                f"found lr {lr}, momentum {momentum}, weight_decay {weight_decay}, eps {eps}"
            )
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "eps": eps})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = _evaluate(closure)
        for group in self.param_groups:
            eps, momentum, decay = group["eps"], group["momentum"], group["weight_decay"]
            lr = group["lr"] + eps
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, state = p.grad, self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["grad_sum_sq"] = torch.zeros_like(p)
                    state["s"] = torch.zeros_like(p)
                    if momentum != 0:
                        state["x0"] = p.detach().clone()
                weight = lr * math.sqrt(int(state["step"].item()) + 1)
                grad_sum_sq, s = state["grad_sum_sq"], state["s"]
                if decay:
                    p.mul_(1 - lr * decay)
                # without momentum x0 follows from what is known, as MADGRAD does
                x0 = state["x0"] if momentum != 0 else p.addcdiv(s, grad_sum_sq.pow(1 / 3).add_(eps), value=1)
                grad_sum_sq.addcmul_(grad, grad, value=weight)
                rms = grad_sum_sq.pow(1 / 3).add_(eps)
                s.add_(grad, alpha=weight)
                z = x0.addcdiv(s, rms, value=-1)
                if momentum == 0:
                    p.copy_(z)
                else:
                    p.mul_(momentum).add_(z, alpha=1 - momentum)
                state["step"] += 1
        return loss


class SM3(torch.optim.Optimizer):
    """SM3-II (Anil et al. 2019, arXiv:1901.11150) as GPT-NeoX steps it: a tensor of shape (n1, ..., nk) keeps
    one accumulator per axis, of shapes (n1, 1, ...), ..., (1, ..., nk). Each step nu = m + g^2, m the least
    of the accumulators over each entry (with beta > 0: beta x m + (1 - beta) g^2); every accumulator becomes
    the greatest nu over its slice (with beta > 0, the greater of that and its old value), and the update
    g / sqrt(nu + eps) is mixed with the last one by `momentum`. Weight decay, which NeoX's SM3 does not
    apply, multiplies the weights by 1 - lr x weight_decay first.

    The accumulators are over whole tensors: a sharded parameter (a DTensor) is stepped on its whole gradient,
    which every rank gathers, so that every layout steps as one process does; each rank keeps the same
    accumulators (a small fraction of the parameter) and its own shard of the momentum."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 0.1,
        momentum: float = 0.0,
        beta: float = 0.0,
        eps: float = 1e-30,
        weight_decay: float = 0.0,
    ) -> None:
        if lr < 0 or not 0 <= momentum < 1 or not 0 <= beta < 1 or eps < 0 or weight_decay < 0:
            raise ValueError(
                f"sm3: expected lr >= 0, momentum and beta in [0, 1), eps >= 0 and weight_decay >= 0, "
                f"found lr {lr}, momentum {momentum}, beta {beta}, eps {eps}, "
                f"weight_decay {weight_decay}"
            )
        super().__init__(
            params, {"lr": lr, "momentum": momentum, "beta": beta, "eps": eps, "weight_decay": weight_decay}
        )

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = _evaluate(closure)
        for group in self.param_groups:
            lr, momentum, beta, eps, decay = (group[k] for k in ("lr", "momentum", "beta", "eps", "weight_decay"))
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, state = _whole(p.grad), self.state[p]
                if not state:
                    for axis, shape in enumerate(_accumulator_shapes(grad.shape)):
                        state[f"accumulator_{axis}"] = grad.new_zeros(shape)
                    if momentum > 0:
                        state["momentum_buffer"] = torch.zeros_like(p)
                accumulators = [state[f"accumulator_{axis}"] for axis in range(max(grad.ndim, 1))]
                nu = functools.reduce(torch.minimum, accumulators).clone()
                if beta > 0:  # SM3-II sums (beta 0); beta > 0 makes it a running average
                    nu.mul_(beta)
                nu.addcmul_(grad, grad, value=1 - beta)
                for axis, accumulator in enumerate(accumulators):
                    largest = _max_except(nu, axis)
                    accumulator.copy_(torch.maximum(accumulator, largest) if beta > 0 else largest)
                update = _shard_like(nu.add_(eps).rsqrt_().mul_(grad), p)
                if momentum > 0:  # made here too: a resumed run may add momentum
                    buffer = state.setdefault("momentum_buffer", torch.zeros_like(p))
                    buffer.mul_(momentum).add_(update, alpha=1 - momentum)
                    update = buffer
                if decay:
                    p.mul_(1 - lr * decay)
                p.sub_(update, alpha=lr)
        return loss


def _accumulator_shapes(shape: torch.Size) -> list[tuple[int, ...]]:
    """One accumulator per axis, broadcasting along the others; a scalar keeps one of its own shape."""
    if not shape:
        return [()]
    return [tuple(size if axis == other else 1 for other, size in enumerate(shape)) for axis in range(len(shape))]


def _max_except(tensor: torch.Tensor, axis: int) -> torch.Tensor:
    """The greatest value over every axis but `axis`, kept as size-1 axes."""
    others = [other for other in range(tensor.ndim) if other != axis]
    return tensor.amax(dim=others, keepdim=True) if others else tensor


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor a DTensor shards (gathered), or the tensor itself."""
    return tensor.full_tensor() if is_dtensor(tensor) else tensor


def _shard_like(whole: torch.Tensor, parameter: torch.Tensor) -> torch.Tensor:
    """`whole` cut as `parameter` is sharded (every rank holds the same whole tensor: no communication)."""
    if not is_dtensor(parameter):
        return whole
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(whole, parameter.device_mesh, parameter.placements, src_data_rank=None)
