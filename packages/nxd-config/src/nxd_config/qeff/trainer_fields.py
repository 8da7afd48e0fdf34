"""Keys a QEfficient file may carry that QEfficient's config classes lack: Trainer and TRL arguments written in
`training` or `dpo` (`learning_rate`, `optim`, `fp16`, DPO's `ref_model`), or anything else.

QEfficient's ConfigManager keeps such a key in `extra_params` (`_merge_dataclass_inplace`) and nothing reads it
again: its trainers build TrainingArguments / SFTConfig / DPOConfig from the keys its dataclasses hold. So a file
carrying one runs in QEfficient as if the key were absent, and so it does in nxd, with a notice that names the key,
says that QEfficient ignores it too, and names the key that does the job (or the closest spelling). The table of
every Trainer and TRL field is rewritten with QEfficient's key table (`python -m nxd_config.qeff.table --update`).
"""

from __future__ import annotations

import dataclasses
import difflib

from .keys import QEFF_KEYS

TRL_VERSION = "1.16.0"
"""The TRL release whose SFTConfig / DPOConfig fields (beyond TrainingArguments') are listed below."""
TRL_SFT_FIELDS = (
    "activation_offloading",
    "assistant_only_loss",
    "chat_template_path",
    "completion_only_loss",
    "dataset_kwargs",
    "dataset_num_proc",
    "dataset_text_field",
    "eos_token",
    "eval_packing",
    "loss_type",
    "max_length",
    "model_init_kwargs",
    "packing",
    "packing_strategy",
    "pad_to_multiple_of",
    "pad_token",
    "padding_free",
    "router_aux_loss_coef",
    "shuffle_dataset",
    "truncation_mode",
    "trust_remote_code",
)
TRL_DPO_FIELDS = (
    "activation_offloading",
    "beta",
    "dataset_num_proc",
    "disable_dropout",
    "discopop_tau",
    "f_alpha_divergence_coef",
    "f_divergence_type",
    "label_smoothing",
    "ld_alpha",
    "loss_type",
    "loss_weights",
    "max_length",
    "model_init_kwargs",
    "pad_to_multiple_of",
    "pad_token",
    "padding_free",
    "precompute_ref_batch_size",
    "precompute_ref_log_probs",
    "ref_model_mixup_alpha",
    "ref_model_sync_steps",
    "router_aux_loss_coef",
    "sync_ref_model",
    "truncation_mode",
    "trust_remote_code",
    "use_weighting",
)

_DTYPE = "training.torch_dtype (fp16, bf16 or fp32) sets the precision"
INSTEAD = {
    "learning_rate": "optimizers.lr sets the learning rate",
    "weight_decay": "optimizers.weight_decay sets it",
    "optim": "optimizers.optimizer_name chooses the optimizer",
    "lr_scheduler_type": "scheduler.scheduler_name chooses the schedule",
    "warmup_steps": "scheduler.warmup_steps sets it",
    "warmup_ratio": "scheduler.warmup_ratio sets it",
    "fp16": _DTYPE,
    "bf16": _DTYPE,
    "torch_dtype": _DTYPE,
    "dtype": _DTYPE,
    "data_seed": "dataset.data_seed seeds the data",
    "use_cache": "model.use_cache is the model's key",
    "ddp_backend": "training.ddp_config.ddp_backend is where QEfficient reads it",
    "ddp_timeout": "training.ddp_config.ddp_timeout is where QEfficient reads it",
    "ddp_find_unused_parameters": "training.ddp_config holds the DDP settings",
    "ddp_bucket_cap_mb": "training.ddp_config holds the DDP settings",
    "ddp_broadcast_buffers": "training.ddp_config holds the DDP settings",
    "max_length": "dataset.max_seq_length (dpo.max_length for DPO) sets the length",
    "max_seq_length": "dataset.max_seq_length sets the length",
    "split": "dataset.train_split and dataset.test_split choose the splits",
    "ref_model": "DPO's reference is the model before training, as in QEfficient without reference_model_name",
    "max_prompt_length": "dpo.max_prompt_length is the DPO section's key",
}
"""Fields QEfficient ignores -> the key of a QEfficient file that does their job."""
NXD_ONLY = {
    "adam_beta1": "model.optim.betas",
    "adam_beta2": "model.optim.betas",
    "adam_epsilon": "model.optim.eps",
    "max_grad_norm": "trainer.gradient_clip_val",
    "torch_compile_mode": "model.fusions.torch_compile",
    "eval_accumulation_steps": "trainer.limit_val_batches",
    "push_to_hub": "nxd-train ckpt export-hf",
    "fsdp": "distributed_strategy.zero1 (FSDP2 sharding)",
    "deepspeed": "distributed_strategy.zero1",
}
"""Fields no QEfficient key sets -> the nxd key (in an NxDT-dialect config) that does."""


def unknown_key_notice(name: str) -> str:
    """The notice for `section.key` (or a section) that no QEfficient config class holds."""
    return (
        f"not a QEfficient key: QEfficient keeps it in extra_params and never reads it, and nxd ignores it too "
        f"({_instead(name)})"
    )


def _instead(name: str) -> str:
    """What does the job of `name`: a QEfficient key, else an nxd key, else the closest spelling in its section."""
    leaf = name.rpartition(".")[2]
    if leaf in INSTEAD:
        return INSTEAD[leaf]
    if leaf in NXD_ONLY:
        return f"no QEfficient key sets it; in an nxd config, {NXD_ONLY[leaf]}"
    section = name.rpartition(".")[0]
    same = {key.rpartition(".")[2]: key for key in QEFF_KEYS if key.rpartition(".")[0] == section}
    close = difflib.get_close_matches(leaf, list(same), n=1, cutoff=0.8)
    return f"did you mean {same[close[0]]!r}?" if close else "no QEfficient key has a name close to it"


def trainer_fields() -> list[tuple[str, str]]:
    """(section.key, where it comes from) of every TrainingArguments field of the installed transformers and every
    SFTConfig / DPOConfig field of TRL_VERSION, as a QEfficient file would write it."""
    from transformers import TrainingArguments

    rows = [
        (f"training.{field.name}", "TrainingArguments") for field in dataclasses.fields(TrainingArguments) if field.init
    ]
    rows += [(f"training.{name}", f"TRL {TRL_VERSION} SFTConfig") for name in TRL_SFT_FIELDS]
    rows += [(f"dpo.{name}", f"TRL {TRL_VERSION} DPOConfig") for name in TRL_DPO_FIELDS]
    return rows


def field_table() -> str:
    """Every Trainer and TRL field as a QEfficient file's key: QEfficient's own key (the key table says what nxd
    does with it), or one QEfficient ignores (a notice, naming the key that does the job)."""
    rows, own = [], 0
    for name, origin in trainer_fields():
        ddp = f"training.ddp_config.{name.removeprefix('training.')}" if name.startswith("training.ddp_") else ""
        if known := QEFF_KEYS.get(name) or QEFF_KEYS.get(ddp):
            nxd, instead = f"QEfficient's key `{known.name}` ({known.status})", ""
        elif any(key.startswith(f"{name}.") for key in QEFF_KEYS):
            nxd, instead = f"QEfficient's block `{name}`", ""
        else:
            nxd, instead = "notice: ignored, as in QEfficient", _instead(name)
        own += not instead
        rows.append(f"| `{name}` | {origin} | {nxd} | {instead} |")
    head = [
        f"{len(rows)} Trainer and TRL fields a QEfficient file may write: {own} are QEfficient's own keys, "
        f"{len(rows) - own} are kept in extra_params and ignored (a notice each).",
        "",
        "| key | from | nxd | instead |",
        "|---|---|---|---|",
    ]
    return "\n".join(head + rows) + "\n"
