"""LoRA on a fused query/key/value module (nxd-models' QKVLinear, NxD's GQAQKVLinear).

peft adapts linear layers; a fused QKV module is one module with three projections (`weight_q`,
`weight_k`, `weight_v`) returning (query, key, value). `FusedQKVLora` gives each projection named in
`parts` its own adapter, exactly as peft does for separate q_proj / k_proj / v_proj layers (same
initialisation, dropout and alpha / r scaling), so an adapter exports to peft's layout for the Hugging
Face model and a fused model trains as its unfused twin does.
"""

from __future__ import annotations

import math

import torch
from torch import nn

PARTS = ("q", "k", "v")


def is_fused_qkv(module: nn.Module) -> bool:
    return all(isinstance(getattr(module, f"weight_{part}", None), torch.Tensor) for part in PARTS)


@torch.no_grad()
def init_adapter_half(weight: torch.Tensor, half: str) -> None:
    """peft's LoRA initialisation (init_lora_weights=True) of `half` ("lora_A" or "lora_B"):
    Kaiming-uniform A, zero B, so an adapted layer starts as its base layer."""
    if half == "lora_A":
        nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    else:
        nn.init.zeros_(weight)


class FusedQKVLora(nn.Module):
    """`base_layer` (a fused QKV module) plus, for each of `parts`, A (in -> r) and B (r -> that
    projection's rows) under `lora_A.<part>` / `lora_B.<part>`; the base stays frozen."""

    def __init__(self, base_layer: nn.Module, parts: tuple[str, ...], rank: int, alpha: float, dropout: float):
        super().__init__()
        self.base_layer, self.parts, self.scaling = base_layer, parts, alpha / rank
        device = base_layer.weight_q.device
        hidden = base_layer.weight_q.shape[1]
        self.lora_A = nn.ModuleDict({p: nn.Linear(hidden, rank, bias=False, device=device) for p in parts})
        self.lora_B = nn.ModuleDict(
            {p: nn.Linear(rank, getattr(base_layer, f"weight_{p}").shape[0], bias=False, device=device) for p in parts}
        )
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.disable_adapters = False
        for parameter in base_layer.parameters():
            parameter.requires_grad_(False)
        for part in parts:
            init_adapter_half(self.lora_A[part].weight, "lora_A")
            init_adapter_half(self.lora_B[part].weight, "lora_B")

    def enable_adapters(self, enabled: bool) -> None:
        """As peft's layers: with False the module computes its base projections only."""
        self.disable_adapters = not enabled

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        outputs = list(self.base_layer(hidden))
        if self.disable_adapters:
            return tuple(outputs)
        dropped = self.lora_dropout(hidden)
        for index, part in enumerate(PARTS):
            if part in self.parts:
                lora_a = self.lora_A[part]
                update = self.lora_B[part](lora_a(dropped.to(lora_a.weight.dtype))) * self.scaling
                outputs[index] = outputs[index] + update.to(outputs[index].dtype)
        return tuple(outputs)
