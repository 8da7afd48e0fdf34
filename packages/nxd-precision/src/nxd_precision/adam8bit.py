"""bitsandbytes' 8-bit Adam (Dettmers et al. 2022, arXiv:2110.02861), GPT-NeoX's use_bnb_optimizer, stepped by
bitsandbytes' own kernels on every layout.

bitsandbytes' optimizer classes step the tensor they are given; its 8-bit moments are quantized in blocks of
256 consecutive values, so a shard of a parameter would be quantized in other blocks than the whole one and
each layout would train differently. This optimizer calls the same kernels on the whole parameter instead
(`pip install nxd-precision[bnb]`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

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
        return ("model.optim.name: adam8bit expected the bitsandbytes package, found it not installed; install "
                "nxd-train[bnb] (pip install bitsandbytes)")  # fmt: skip
    kind = torch.device(device).type
    key = _DISPATCH_KEYS.get(kind)
    operator = "bitsandbytes::optimizer_update_8bit_blockwise"
    if key is None or not torch._C._dispatch_has_kernel_for_dispatch_key(operator, key):
        return (f"model.optim.name: adam8bit expected a device bitsandbytes' installed build has 8-bit optimizer "
                f"kernels for (the CPU; CUDA and XPU in builds for them), found {kind}; use adamw on this "
                f"device")  # fmt: skip
    return None


def _eight_bit_codes_back(optimizer: torch.optim.Optimizer) -> None:
    """torch's load_state_dict casts state to its parameter's floating dtype; the 8-bit codes (whole numbers
    0..255, exact in any float) become uint8 again."""
    for state in optimizer.state.values():
        if "absmax_exp_avg" in state:
            for moment in ("exp_avg", "exp_avg_sq"):
                state[moment] = state[moment].to(torch.uint8)


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

    The blocks run over the whole tensor: a sharded parameter (a DTensor) is stepped on its whole value and
    gradient, which every rank gathers, so every layout steps as one process does; each rank keeps the whole
    8-bit state (2 bytes and 2/256 fp32 per value, not divided by ZeRO) and writes back its shard."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, min_8bit_size: int = 4096) -> None:  # fmt: skip
        if lr < 0 or eps <= 0 or weight_decay < 0 or min_8bit_size < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"adam8bit: expected lr, weight_decay and min_8bit_size >= 0, eps > 0 and betas in "
                             f"[0, 1), found lr {lr}, betas {betas}, eps {eps}, weight_decay {weight_decay}, "
                             f"min_8bit_size {min_8bit_size}")  # fmt: skip
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                                  "min_8bit_size": min_8bit_size, "fp32_state": False})  # fmt: skip
        self._functional = _bitsandbytes()
        self._maps: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self.register_load_state_dict_post_hook(_eight_bit_codes_back)

    def _quantization_maps(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The signed (first moment) and unsigned (second moment) dynamic maps, made once per device."""
        if device not in self._maps:
            self._maps[device] = (self._functional.create_dynamic_map(signed=True).to(device),
                                  self._functional.create_dynamic_map(signed=False).to(device))  # fmt: skip
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
        grad = (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).contiguous()
        whole = p.full_tensor().contiguous() if isinstance(p, DTensor) else p  # parameters are contiguous
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            eight_bit = whole.numel() >= group["min_8bit_size"] and not group["fp32_state"]
            moment = torch.uint8 if eight_bit else torch.float32
            state["exp_avg"] = torch.zeros(whole.shape, dtype=moment, device=whole.device)
            state["exp_avg_sq"] = torch.zeros(whole.shape, dtype=moment, device=whole.device)
            if eight_bit:
                blocks = -(-whole.numel() // BLOCK)
                state["absmax_exp_avg"] = torch.zeros(blocks, dtype=torch.float32, device=whole.device)
                state["absmax_exp_avg_sq"] = torch.zeros(blocks, dtype=torch.float32, device=whole.device)
        state["step"] += 1
        step, (beta1, beta2) = int(state["step"].item()), group["betas"]
        lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
        if state["exp_avg"].dtype == torch.uint8:
            signed, unsigned = self._quantization_maps(whole.device)
            self._functional.optimizer_update_8bit_blockwise(
                "adam", grad, whole, state["exp_avg"], state["exp_avg_sq"], beta1, beta2, 0.0, 0.0, eps, step, lr,
                signed, unsigned, state["absmax_exp_avg"], state["absmax_exp_avg_sq"], weight_decay=decay)
        else:
            self._functional.optimizer_update_32bit(
                "adam", grad, whole, state["exp_avg"], beta1, eps, step, lr, state["exp_avg_sq"], beta2,
                weight_decay=decay)  # fmt: skip
        if isinstance(p, DTensor):  # every rank stepped the same whole tensor: its shard needs no communication
            p.to_local().copy_(distribute_tensor(whole, p.device_mesh, p.placements, src_data_rank=None).to_local())
