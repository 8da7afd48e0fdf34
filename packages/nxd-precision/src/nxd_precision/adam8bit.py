"""bitsandbytes' 8-bit Adam (Dettmers et al. 2022, arXiv:2110.02861), GPT-NeoX's use_bnb_optimizer, stepped by
bitsandbytes' own kernels on every layout.

bitsandbytes' optimizer classes step the tensor they are given; its 8-bit moments are quantized in blocks of
256 consecutive values, so a shard of a parameter would be quantized in other blocks than the whole one and
each layout would train differently. This optimizer calls the same kernels on shards made of whole blocks of the
whole tensor instead (`pip install nxd-precision[bnb]`)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch

from .dtensors import is_dtensor

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor, Placement

BLOCK = 256
"""Values per quantization block of bitsandbytes' blockwise kernels (one fp32 absolute maximum each)."""
_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "mps": "MPS", "hpu": "HPU"}
"""torch's dispatch keys of the device types bitsandbytes registers kernels for (its build decides which it has)."""


def adam8bit_support_problem(device: torch.device | str) -> str | None:
    """Why bitsandbytes' 8-bit Adam cannot step on `device` (not installed, or no kernel for that device type);
    None when it can."""
    try:
        _bitsandbytes()
    except ImportError:
        return (
            "model.optim.name: adam8bit expected the bitsandbytes package, found it not installed; install "
            "nxd-train[bnb] (pip install bitsandbytes)"
        )
    kind = torch.device(device).type
    key = _DISPATCH_KEYS.get(kind)
    try:
        kernel = key is not None and torch._C._dispatch_has_kernel_for_dispatch_key(
            "bitsandbytes::optimizer_update_8bit_blockwise", key
        )
    except RuntimeError:  # a bitsandbytes before 0.50, without the operator
        import bitsandbytes

        return (
            f"model.optim.name: adam8bit expected bitsandbytes 0.50 or later (its optimizer kernels for every "
            f"device), found {bitsandbytes.__version__}; pip install -U bitsandbytes"
        )
    if not kernel:
        return (
            f"model.optim.name: adam8bit expected a device bitsandbytes' installed build has 8-bit optimizer "
            f"kernels for (the CPU; CUDA and XPU in builds for them), found {kind}; use adamw on this "
            f"device"
        )
    return None


class _Codes:
    """8-bit codes carried through torch's load_state_dict, which casts every state tensor to its parameter's
    floating dtype (a float copy of the codes, 4 bytes a value, on the way) and leaves other objects as they are."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _hide_codes(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    state = {
        index: {
            key: _Codes(value) if torch.is_tensor(value) and value.dtype == torch.uint8 else value
            for key, value in values.items()
        }
        for index, values in state_dict["state"].items()
    }
    return {**state_dict, "state": state}


def _codes_back(optimizer: torch.optim.Optimizer) -> None:
    for parameter, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, _Codes):
                state[key] = value.tensor.to(device=parameter.device)


def _bitsandbytes() -> Any:
    """bitsandbytes' functional module; its warning about 4-bit CPU matmul kernels (not used here) is kept quiet."""
    quiet = logging.getLogger("bitsandbytes.backends.cpu.ops")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        import bitsandbytes.functional as functional
    finally:
        quiet.setLevel(level)
    return functional


class Adam8bit(torch.optim.Optimizer):
    """Adam with decoupled weight decay whose two moments are kept as 8-bit codes (bitsandbytes' signed and
    unsigned dynamic maps) in blocks of 256 values, each block scaled by its absolute maximum in fp32; a tensor
    of fewer than `min_8bit_size` values keeps fp32 moments, as bitsandbytes' Adam8bit does, and so do the
    parameters of a group with `fp32_state` (bitsandbytes' optim_bits 32 override). The step is bitsandbytes'
    kernel for the parameter's device.

    A block is 256 consecutive values of the whole tensor. Where the last axis is a multiple of 256, blocks lie
    within rows: a rank steps its shard where the shard is whole rows of whole blocks, keeping its share of the
    state (codes sharded as the parameter, block maxima as (..., last axis / 256)), as AdamW's state is divided;
    where a split of the last axis would cut blocks, that split is gathered first (the rows stay divided). A
    tensor whose rows are not whole blocks is stepped whole on every rank. Every layout steps as one process.

    The state keeps its own precision (fp32 block maxima and fp32 moments where they are fp32): a precision
    policy's optimizer-state dtype does not round it (`keeps_state_precision`)."""

    keeps_state_precision = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        min_8bit_size: int = 4096,
    ) -> None:
        if lr < 0 or eps <= 0 or weight_decay < 0 or min_8bit_size < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(
                f"adam8bit: expected lr, weight_decay and min_8bit_size >= 0, eps > 0 and betas in "
                f"[0, 1), found lr {lr}, betas {betas}, eps {eps}, weight_decay {weight_decay}, "
                f"min_8bit_size {min_8bit_size}"
            )
        super().__init__(
            params,
            {
                "lr": lr,
                "betas": tuple(betas),
                "eps": eps,
                "weight_decay": weight_decay,
                "min_8bit_size": min_8bit_size,
                "fp32_state": False,
            },
        )
        self._functional = _bitsandbytes()
        self._maps: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self.register_load_state_dict_pre_hook(_hide_codes)
        self.register_load_state_dict_post_hook(_codes_back)

    def _quantization_maps(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The signed (first moment) and unsigned (second moment) dynamic maps, made once per device."""
        if device not in self._maps:
            self._maps[device] = (
                self._functional.create_dynamic_map(signed=True).to(device),
                self._functional.create_dynamic_map(signed=False).to(device),
            )
        return self._maps[device]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._step_parameter(p, group)
        return loss

    def _step_parameter(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        state = self.state[p]
        if not state:
            _initial_state(state, p, eight_bit=p.numel() >= group["min_8bit_size"] and not group["fp32_state"])
        state["step"] += 1
        grad, value = p.grad, p
        if is_dtensor(p):  # in the state's layout: the parameter's, or with blocks' rows gathered
            placements = state["exp_avg"].placements
            value = p.redistribute(p.device_mesh, placements) if placements != p.placements else p
            if is_dtensor(grad) and grad.placements != placements:
                grad = grad.redistribute(p.device_mesh, placements)
        grad, target = _local(grad).contiguous(), _local(value)
        if not target.numel():  # an empty shard (fewer rows than ranks): nothing to step, and no kernel launched
            return
        contiguous = target if target.is_contiguous() else target.contiguous()
        moments = [_local(state[key]) for key in ("exp_avg", "exp_avg_sq")]
        step, (beta1, beta2) = int(state["step"].item()), group["betas"]
        lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
        if moments[0].dtype == torch.uint8:
            signed, unsigned = self._quantization_maps(contiguous.device)
            maxima = [_local(state[key]).view(-1) for key in ("absmax_exp_avg", "absmax_exp_avg_sq")]
            self._functional.optimizer_update_8bit_blockwise(
                "adam",
                grad,
                contiguous,
                *moments,
                beta1,
                beta2,
                0.0,
                0.0,
                eps,
                step,
                lr,
                signed,
                unsigned,
                *maxima,
                weight_decay=decay,
            )
        else:
            self._functional.optimizer_update_32bit(
                "adam", grad, contiguous, moments[0], beta1, eps, step, lr, moments[1], beta2, weight_decay=decay
            )
        if contiguous is not target:
            target.copy_(contiguous)
        if value is not p:  # every rank holding these rows stepped them alike: its shard needs no communication
            p.to_local().copy_(value.redistribute(p.device_mesh, p.placements).to_local())


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if is_dtensor(tensor) else tensor


def _block_placements(p: DTensor) -> list[Placement]:
    """The layout whose shards are whole rows of whole 256-value blocks: `p`'s, with the splits of the last axis
    gathered where they would cut blocks; everything gathered where rows are not whole blocks."""
    from torch.distributed.tensor import Replicate, Shard

    gathered = [Replicate()] * p.device_mesh.ndim
    if p.ndim == 0 or p.shape[-1] % BLOCK:
        return gathered
    last = p.ndim - 1
    on_last = [
        i
        for i, placement in enumerate(p.placements)
        if not placement.is_replicate() and getattr(placement, "dim", last) % p.ndim == last
    ]
    split = math.prod(p.device_mesh.shape[i] for i in on_last)
    if all(type(p.placements[i]) is Shard for i in on_last) and p.shape[-1] % (BLOCK * split) == 0:
        return list(p.placements)
    return [Replicate() if i in on_last else placement for i, placement in enumerate(p.placements)]


def _maxima_shape(shape: torch.Size) -> tuple[int, ...]:
    """One fp32 maximum per block: (..., last / 256) where blocks lie within rows, else one per 256 values."""
    if shape and shape[-1] % BLOCK == 0:
        return (*shape[:-1], shape[-1] // BLOCK)
    return (-(-shape.numel() // BLOCK),)


def _initial_state(state: dict[str, Any], p: torch.Tensor, *, eight_bit: bool) -> None:
    """Zero moments: fp32 ones sharded as `p`; 8-bit ones with their block maxima in `_block_placements`."""
    state["step"] = torch.tensor(0.0)
    if not eight_bit:
        state["exp_avg"], state["exp_avg_sq"] = (torch.zeros_like(p, dtype=torch.float32) for _ in range(2))
        return
    shape = _maxima_shape(p.shape)
    if not is_dtensor(p):
        for key in ("exp_avg", "exp_avg_sq"):
            state[key] = torch.zeros_like(p, dtype=torch.uint8)
            state[f"absmax_{key}"] = torch.zeros(shape, dtype=torch.float32, device=p.device)
        return
    from torch.distributed.tensor import DTensor

    placements = _block_placements(p)  # the parameter's own where its shards are whole blocks: no gather then
    codes = p.to_local() if tuple(placements) == p.placements else p.redistribute(p.device_mesh, placements).to_local()
    for key in ("exp_avg", "exp_avg_sq"):
        state[key] = DTensor.from_local(
            torch.zeros_like(codes, dtype=torch.uint8),
            p.device_mesh,
            placements,
            run_check=False,
            shape=p.shape,
            stride=p.stride(),
        )
        maxima = torch.zeros(_maxima_shape(codes.shape), dtype=torch.float32, device=codes.device)
        stride = torch.empty(shape, device="meta").stride()
        state[f"absmax_{key}"] = DTensor.from_local(
            maxima, p.device_mesh, placements, run_check=False, shape=torch.Size(shape), stride=stride
        )
