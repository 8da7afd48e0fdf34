"""Any torch optimizer under a PrecisionPolicy: it steps on fp32 copies of low-precision parameters.

- With master weights (mixed_precision, mixed_precisionSR, manual master_weights) the fp32 copies
  persist: they are the weights; the bf16 parameters are rounded from them after every step
  (stochastically when the policy says so). Under ZeRO-1 the parameters are shards, so the masters
  and the optimizer state are sharded with them.
- Without master weights but with bf16 parameters (bf16SR, manual xla_use_bf16) the fp32 copies are
  made from the parameters for the step only (their memory is released in between): the update is
  computed in fp32 and applied to the bf16 parameters with stochastic rounding (or to nearest).
- With fp32 parameters it is the optimizer itself.

Gradients accumulate in the policy's accumulation dtype through the parameters' `grad_dtype`
(`prepare_parameters`), so autograd and FSDP2 accumulate them in it. Optimizer state is kept in the
policy's state dtype between steps (the step itself runs in fp32).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from .dtensors import is_dtensor
from .float8 import use_float8
from .policy import FP32, PrecisionPolicy
from .stochastic_rounding import stochastic_round


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if is_dtensor(tensor) else tensor


GROUP_SCALES = ("lr_scale", "weight_decay_scale")
"""The keys of a parameter group that belong to its parameters (muP's multipliers), not to the run's settings."""


class PrecisionOptimizer:
    """`build(tensors)` makes the optimizer over the tensors it steps on (the fp32 copies, or the
    parameters themselves); `step`, `zero_grad` and `param_groups` act as an optimizer's do, and
    `optimizer` is what an LR scheduler drives. Call `collect_gradients` before reading or clipping
    `gradient_tensors`."""

    def __init__(
        self,
        parameters: Iterable[torch.Tensor],
        policy: PrecisionPolicy,
        build: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
        generator: torch.Generator | None = None,
    ):
        self.parameters = [p for p in parameters if p.requires_grad]
        self.policy, self.generator = policy, generator
        self.copies_needed = any(p.dtype != FP32 for p in self.parameters)
        self.persistent = policy.master_dtype is not None
        if not self.copies_needed:
            self.copies = self.parameters
        else:
            self.copies = [p.detach().to(FP32).requires_grad_(True) for p in self.parameters]
        self.optimizer = build(self.copies)
        if self.copies_needed and not self.persistent:
            self._release()

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def gradient_tensors(self) -> list[torch.Tensor]:
        """The tensors whose `.grad` the step uses (the fp32 copies when there are some)."""
        return self.copies

    def collect_gradients(self) -> None:
        """Move gradients that reached the parameters (data-parallel reductions assign them) onto the
        fp32 copies."""
        if self.copies_needed:
            for parameter, copy in zip(self.parameters, self.copies, strict=True):
                _add_gradient(copy, parameter)

    @torch.no_grad()
    def step(self) -> None:
        self.collect_gradients()
        if not self.copies_needed:
            self.optimizer.step()
            return
        if not self.persistent:
            self._restore()
        for state in self._states():
            for key, value in state.items():
                if torch.is_tensor(value) and value.is_floating_point() and value.ndim:
                    state[key] = value.to(FP32)
        self.optimizer.step()
        for state in self._states() if not getattr(self.optimizer, "keeps_state_precision", False) else ():
            for key, value in state.items():
                if torch.is_tensor(value) and value.is_floating_point() and value.ndim:
                    state[key] = self._round(value, self.policy.optimizer_state_dtype)
        for parameter, copy in zip(self.parameters, self.copies, strict=True):
            target, source = _local(parameter), _local(copy)
            if target.dtype == torch.bfloat16 and self.policy.stochastic_rounding:
                source = stochastic_round(source, self.generator)
            target.copy_(source)  # to nearest converts in the copy, with no temporary
        if not self.persistent:
            self._release()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
        for parameter in self.parameters:
            parameter.grad = None

    def state_dict(self, names: Sequence[str], *, masters: bool = True) -> dict[str, Any]:
        """The optimizer's state keyed by parameter name (`names`, in the order of `parameters`) rather
        than by position, so a checkpoint of it reshards across layouts: per-parameter state, the
        parameter groups, and the fp32 master weights when they persist (and `masters`). The tensors
        are the live ones: after `create_state`, loading into them in place, then `load_state_dict`,
        restores the optimizer."""
        if len(names) != len(self.parameters):
            raise ValueError(f"{len(names)} names for {len(self.parameters)} trainable parameters")
        name_of = {id(copy): name for copy, name in zip(self.copies, names, strict=True)}
        # hyperparameters only: which parameters a group holds is this run's business (a pipeline stage
        # holds some of them, and every rank's checkpoint shares one copy of these values)
        groups = {
            str(index): {k: v for k, v in group.items() if k != "params"}
            for index, group in enumerate(self.optimizer.param_groups)
        }
        result: dict[str, Any] = {
            "state": {
                name_of[id(copy)]: dict(self.optimizer.state[copy])
                for copy in self.copies
                if copy in self.optimizer.state
            },
            "param_groups": groups,
        }
        if masters and self.persistent and self.copies_needed:
            result["masters"] = self.masters(names)
        return result

    def load_state_dict(self, state: dict[str, Any], names: Sequence[str]) -> None:
        """Restore what `state_dict(names)` returned (after its tensors were filled in place). The groups take the
        saved hyperparameters but keep their own scales (muP's lr_scale and weight_decay_scale): the saved groups are
        one rank's, and another pipeline stage groups its parameters otherwise; a stage with more groups than the
        saved ones takes the first's values for the rest (`apply_options` and `apply_schedule` then set each group's
        weight decay and learning rate from its scales)."""
        name_of = {id(copy): name for copy, name in zip(self.copies, names, strict=True)}
        position: dict[str, int] = {}
        saved, groups = state["param_groups"], []
        for index, live in enumerate(self.optimizer.param_groups):
            params = [position.setdefault(name_of[id(p)], len(position)) for p in live["params"]]
            own = {key: live[key] for key in GROUP_SCALES if key in live}
            groups.append({**saved.get(str(index), saved["0"]), **own, "params": params})
        self.optimizer.load_state_dict(
            {"state": {position[name]: values for name, values in state["state"].items()}, "param_groups": groups}
        )

    def masters(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """The persistent fp32 master weights by parameter name (the parameters themselves when they are fp32)."""
        return dict(zip(names, self.copies, strict=True))

    @torch.no_grad()
    def sync_parameters(self) -> None:
        """Round the master weights into the parameters (after the masters were loaded from a checkpoint)."""
        if self.copies_needed and self.persistent:
            for parameter, copy in zip(self.parameters, self.copies, strict=True):
                _local(parameter).copy_(_local(copy).to(parameter.dtype))

    @torch.no_grad()
    def create_state(self) -> None:
        """Before loading a checkpoint: run one step on zero gradients if the optimizer has no state yet
        (optimizers create it lazily), so `state_dict` has tensors to load into. The step may change
        the weights (weight decay), so call it only when a load overwrites them next."""
        if self.optimizer.state:
            return
        if self.copies_needed and not self.persistent:
            self._restore()
        for copy in self.copies:
            copy.grad = torch.zeros_like(copy)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.copies_needed and not self.persistent:
            self._release()

    def _states(self) -> Iterator[dict[str, Any]]:
        return (self.optimizer.state[copy] for copy in self.copies if copy in self.optimizer.state)

    def _round(self, value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if dtype == value.dtype:
            return value
        if dtype == torch.bfloat16 and self.policy.stochastic_rounding:
            rounded = stochastic_round(_local(value), self.generator)
            if is_dtensor(value):
                from torch.distributed.tensor import DTensor

                return DTensor.from_local(
                    rounded,
                    value.device_mesh,
                    value.placements,
                    run_check=False,
                    shape=value.shape,
                    stride=value.stride(),
                )
            return rounded
        return value.to(dtype)

    def _release(self) -> None:
        """Free the fp32 copies' memory between steps (their identity, which the state is keyed by, stays)."""
        for copy in self.copies:
            _local(copy).untyped_storage().resize_(0)

    def _restore(self) -> None:
        for parameter, copy in zip(self.parameters, self.copies, strict=True):
            local = _local(copy)
            local.untyped_storage().resize_(local.numel() * local.element_size())
            local.copy_(_local(parameter))


@torch.no_grad()
def prepare_parameters(module: torch.nn.Module, policy: PrecisionPolicy, *, cast: bool = True) -> None:
    """Hold `module`'s floating-point parameters in the policy's parameter dtype (in place, so tied
    parameters stay tied; buffers such as rotary frequencies keep theirs) and let autograd accumulate
    their gradients in its accumulation dtype. Call it before tensor parallelism (which replaces the
    parameters) with `cast`, and again after it with cast=False and before data parallelism, which
    reads the gradient dtype when it wraps the module. With `cast`, a float8 policy swaps the decoder layers'
    linear layers for torchao's (`use_float8`)."""
    for parameter in module.parameters():
        if cast and parameter.is_floating_point() and parameter.dtype != policy.param_dtype:
            parameter.data = parameter.data.to(policy.param_dtype)
    if cast and policy.float8 is not None:  # after the cast: torchao's gathered weight wraps the tensor as it is
        use_float8(module, policy.float8)
    for parameter in module.parameters():
        if parameter.is_floating_point() and parameter.dtype != policy.grad_accumulation_dtype:
            parameter.grad_dtype = policy.grad_accumulation_dtype


def _add_gradient(copy: torch.Tensor, parameter: torch.Tensor) -> None:
    """copy.grad += parameter.grad in fp32, then free the parameter's gradient."""
    if parameter.grad is None:
        return
    gradient = parameter.grad.to(FP32)
    parameter.grad = None
    copy.grad = gradient if copy.grad is None else copy.grad.add_(gradient)
