"""`model_alignment_strategy`: SFT, DPO or ORPO fine-tuning, each optionally with LoRA (`peft`).

A method is chosen by writing its block: `sft:` alone (even empty) selects SFT with defaults.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from ._base import Section, frozen_list, key

ALIGN = "nxd-align"
DATA = "nxd-data"

Truncation = Literal["keep_start", "keep_end"]


class SFTConfig(Section):
    packing: bool = key(
        False, "Pack records into rows of seq_length (best fit; each record attends only to itself and keeps its "
        "prompt masking) instead of padding one record per row.", by=DATA,
    )


class DPOConfig(Section):
    kl_beta: float = key(0.01, "Beta of the DPO loss (strength of the pull towards the reference).", by=ALIGN, gt=0.0)
    loss_type: Literal["sigmoid"] = key("sigmoid", "DPO loss variant.", by=ALIGN)
    max_prompt_length: int | None = key(
        None, "Longest prompt kept in prompt + response (required). Older spelling: max_dpo_prompt_length.",
        by=DATA, ge=1,
    )
    precompute_ref_log_probs: bool = key(
        True, "Compute the reference model's log-probs once before training (False is not supported).", by=ALIGN
    )
    truncation_mode: Truncation = key(
        "keep_start", "Which end of an over-long prompt + response is kept.", by=DATA
    )


class ORPOConfig(Section):
    beta: float = key(0.01, "Weight of the odds-ratio term of the ORPO loss.", by=ALIGN, gt=0.0)
    max_prompt_length: int | None = key(
        None, "Longest prompt kept in prompt + response (required).", by=DATA, ge=1
    )
    truncation_mode: Truncation = key(
        "keep_start", "Which end of an over-long prompt + response is kept.", by=DATA
    )


class PeftConfig(Section):
    lora_rank: int = key(16, "LoRA rank r.", by=ALIGN, ge=1)
    lora_alpha: int = key(32, "LoRA scaling numerator (updates are scaled by alpha / r).", by=ALIGN, ge=1)
    lora_dropout: float = key(0.05, "Dropout on the LoRA input.", by=ALIGN, ge=0.0, lt=1.0)
    lora_bias: Literal["none", "all", "lora_only"] = key("none", "Which biases are trained.", by=ALIGN)
    lora_verbose: bool = key(False, "Log the adapted modules and trainable parameter counts.", by=ALIGN)
    target_modules: frozen_list(str) = key(
        ("qkv_proj",), "Modules that get adapters (e.g. qkv_proj, o_proj, gate_up_proj, down_proj).", by=ALIGN
    )
    load_lora_from_ckpt: bool = key(
        False, "Load the adapter together with the base model from the checkpoint.", by="nxd-ckpt"
    )
    save_lora_base: bool = key(False, "Also save the frozen base model in checkpoints.", by="nxd-ckpt")
    merge_lora: bool = key(False, "Merge the adapter into the base weights when saving.", by="nxd-ckpt")
    save_lora_config_adapter: bool = key(
        True, "Save the LoRA config next to the adapter weights.", by="nxd-ckpt"
    )
    merge_sharded_lora: bool = key(
        False, "Gather tensor-parallel adapter shards into one adapter when saving.", by="nxd-ckpt"
    )


class AlignmentConfig(Section):
    sft: SFTConfig | None = key(
        None, "Supervised fine-tuning: the loss on the outputs of input/output records, or on the assistant turns "
        "of messages records (rendered with the tokenizer's chat template), in data.train_dir.", by=ALIGN,
    )
    dpo: DPOConfig | None = key(None, "Direct preference optimisation.", by=ALIGN)
    orpo: ORPOConfig | None = key(None, "Odds-ratio preference optimisation.", by=ALIGN)
    peft: PeftConfig | None = key(None, "LoRA adapters; combines with any method.", by=ALIGN)

    @model_validator(mode="before")
    @classmethod
    def _present_means_enabled(cls, data: Any) -> Any:
        """`dpo:` with nothing under it selects DPO with its defaults, as in NxDT."""
        if isinstance(data, dict):
            return {name: ({} if value is None else value) for name, value in data.items()}
        return data

    @property
    def method(self) -> str | None:
        """The chosen method: 'sft', 'dpo', 'orpo', or None (only LoRA, or nothing)."""
        for name in ("sft", "dpo", "orpo"):
            if getattr(self, name) is not None:
                return name
        return None
