"""NovoGrad (Ginsburg et al., 2019) as NeMo implements it, with layer-wise update clipping (luc).

No maintained package on the public registry ships NeMo's variant (per-layer second moment, `luc`), so
nxd carries these few lines.
"""

from __future__ import annotations

import torch
from torch.optim import Optimizer


class Novograd(Optimizer):
    """NeMo's NovoGrad: a second moment per layer (one number per parameter tensor), optional layer-wise update
    clipping (`luc`)."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.95, 0.98),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        grad_averaging: bool = False,
        amsgrad: bool = False,
        luc: bool = False,
        luc_trust: float = 1e-3,
        luc_eps: float = 1e-8,
    ):
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            grad_averaging=grad_averaging,
            amsgrad=amsgrad,
            luc=luc,
            luc_trust=luc_trust,
            luc_eps=luc_eps,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros((), dtype=param.dtype, device=param.device)
                    if group["amsgrad"]:
                        state["max_exp_avg_sq"] = torch.zeros((), dtype=param.dtype, device=param.device)
                state["step"] += 1
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                norm = param.grad.norm().pow(2)
                if state["step"] == 1:
                    exp_avg_sq.copy_(norm)
                else:
                    exp_avg_sq.mul_(beta2).add_(norm, alpha=1.0 - beta2)
                second = exp_avg_sq
                if group["amsgrad"]:
                    torch.maximum(state["max_exp_avg_sq"], exp_avg_sq, out=state["max_exp_avg_sq"])
                    second = state["max_exp_avg_sq"]
                grad = param.grad / (second.sqrt() + group["eps"])
                if group["weight_decay"]:
                    grad = grad.add(param, alpha=group["weight_decay"])
                if group["grad_averaging"]:
                    grad = grad.mul(1 - beta1)
                exp_avg.mul_(beta1).add_(grad)
                step_size = group["lr"]
                if group["luc"]:
                    trust = group["luc_trust"] * param.norm() / (exp_avg.norm() + group["luc_eps"])
                    step_size = min(trust.item(), group["lr"])
                param.add_(exp_avg, alpha=-step_size)
        return loss
