"""exp_manager's checkpoint and resume keys, turned into nxd-ckpt calls.

A checkpoint holds the model (or its fp32 master weights with use_master_weights_in_ckpt), the
optimizer state by parameter name (with the master weights), the LR scheduler, the step and consumed
samples, the sampler's stream, every rank's RNG states, and — in its completion marker — the resolved
config, the package versions, the layout and the Hugging Face mapping that `ckpt export-hf` applies.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import nxd_ckpt  # its DCP and DTensor parts (nxd_ckpt.load_checkpoint ...) load when a run first uses them
from nxd_ckpt import (
    MARKER,
    CheckpointError,
    CheckpointInfo,
    CheckpointWarning,
    SavePolicy,
    is_checkpoint_dir,
    newest_usable,
    read_info,
    template_fields,
)
from nxd_config import NxdConfig
from nxd_config.schema.exp_manager import interval_seconds
from nxd_models import ModelConfigError, ModelFamily

from nxd_train.logging.log_dir import CHECKPOINT_DIR

LOGGED = ("step", "consumed_samples", "epoch", "loss", "lr", "grad_norm", "val_loss")
"""Values a run logs, which monitor and the filename template may name."""
PACKAGES = (
    "nxd-config",
    "nxd-parallel",
    "nxd-precision",
    "nxd-models",
    "nxd-data",
    "nxd-align",
    "nxd-ckpt",
    "nxd-train",
    "torch",
)


def save_policy(cfg: NxdConfig) -> SavePolicy:
    params = cfg.exp_manager.checkpoint_callback_params
    return SavePolicy(
        every_n_train_steps=params.every_n_train_steps,
        save_at_steps=tuple(params.save_at_steps or ()),
        train_time_interval=interval_seconds(params.train_time_interval),
        save_top_k=params.save_top_k,
        monitor=params.monitor,
        mode=params.ranking,
        save_last=params.save_last,
        filename=params.filename or f"{cfg.exp_manager.name or cfg.name}--{{step}}-{{consumed_samples}}",
        enable_version_counter=params.enable_version_counter,
    )


def checkpoint_problems(cfg: NxdConfig) -> list[str]:
    """Checkpoint keys that name values this run never logs."""
    params, key = cfg.exp_manager.checkpoint_callback_params, "exp_manager.checkpoint_callback_params"
    if not cfg.exp_manager.create_checkpoint_callback:
        return []
    problems = []
    if params.monitor not in LOGGED:
        problems.append(f"{key}.monitor: expected one of {', '.join(LOGGED)}, found {params.monitor!r}")
    for name in template_fields(params.filename or ""):
        if name not in LOGGED:
            problems.append(f"{key}.filename: {{{name}}} is not a logged value; expected one of {', '.join(LOGGED)}")
    return problems


HEAD_RECORD = "head"
"""The completion marker's record of the model's output layer: causal_lm, or score (a reward model)."""


@dataclass(frozen=True)
class Resume:
    """Where a run starts from: a checkpoint to continue, or weights to start a new run from."""

    path: Path
    weights_only: bool
    hugging_face: bool = False
    """`path` is a Hugging Face model directory (safetensors + config.json), not an nxd checkpoint."""
    world_size: int | None = None
    """Processes of the run that saved it (their RNG states are restored only at the same number)."""
    neox: bool = False
    """`path` is a checkpoint GPT-NeoX wrote (its model weights are read; nothing else of it is)."""
    start_step: int = 0
    """The step a run continues at from these weights: a NeoX checkpoint's iteration, unless fine-tuning."""
    head: str = "causal_lm"
    """The output layer the weights hold: causal_lm, or score (a reward model's)."""

    @classmethod
    def of_checkpoint(cls, info: CheckpointInfo, weights_only: bool) -> Resume:
        """The nxd checkpoint `info` as a start, with what its marker records of the run."""
        return cls(
            info.path.resolve(),
            weights_only,
            world_size=info.extra.get("world_size"),
            head=info.extra.get(HEAD_RECORD, "causal_lm"),
        )

    @classmethod
    def of_hugging_face(cls, path: Path) -> Resume:
        """The Hugging Face model directory `path` as initial weights: a reward model's when config.json names a
        *ForSequenceClassification (a damaged config.json is named by the import)."""
        try:
            architectures = json.loads((path / "config.json").read_text()).get("architectures") or []
        except (OSError, ValueError, AttributeError):
            architectures = []
        score = any(str(name).endswith("ForSequenceClassification") for name in architectures)
        return cls(path.resolve(), True, hugging_face=True, head="score" if score else "causal_lm")


def is_hf_directory(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def resume_choice(cfg: NxdConfig, log_dir: Path | None) -> Resume | None:
    """The checkpoint the resume keys select, or None; a CheckpointError when the one asked for is
    missing, incomplete or damaged. `log_dir` is the directory resume_if_exists searches; a GPT-NeoX
    checkpoint there (its `latest`) is the start when it holds no nxd checkpoint yet. resume_from_checkpoint
    may name a run's log directory too (its newest complete checkpoint, as GPT-NeoX's load names a save
    folder), or a Trainer-style checkpoint-<step> folder nxd wrote; with resume_from_checkpoint_optional a
    folder holding no checkpoint starts a new run."""
    exp, weights_only = cfg.exp_manager, cfg.model.weight_init_only
    if exp.resume_from_checkpoint:
        path = Path(exp.resume_from_checkpoint)
        path = nxd_ckpt.nxd_checkpoint_of(path) or path  # a Trainer-style folder nxd wrote: its checkpoint
        if is_hf_directory(path):
            if not weights_only:
                raise CheckpointError(
                    f"exp_manager.resume_from_checkpoint: {path} is a Hugging Face model "
                    "(weights only); expected model.weight_init_only: True to start from it"
                )
            return Resume.of_hugging_face(path)
        optional = exp.resume_from_checkpoint_optional
        if optional and (not path.is_dir() or not any(path.iterdir())):
            return _new_run(path, "is empty" if path.is_dir() else "is missing")
        if (neox := _neox(path, weights_only)) is not None:
            return neox
        if not path.is_dir():
            raise CheckpointError(
                f"exp_manager.resume_from_checkpoint: expected an nxd checkpoint directory or a "
                f"Hugging Face model directory, found no directory at {path}"
            )
        if (path / CHECKPOINT_DIR).is_dir() and not read_info(path).complete:  # a run's log directory: its newest
            info, passed_over = newest_usable(path / CHECKPOINT_DIR)
            held = f"none usable: {'; '.join(passed_over)}" if passed_over else "no complete checkpoint"
            if info is None and optional:
                return _new_run(path, f"holds {held}")
            if info is None:
                raise CheckpointError(
                    f"exp_manager.resume_from_checkpoint: {path} is a run directory whose "
                    f"{CHECKPOINT_DIR} folder holds {held}"
                )
            _say_passed_over(passed_over, info)
        elif not is_checkpoint_dir(path):
            if optional:
                return _new_run(
                    path, "holds no checkpoint (no nxd completion marker, GPT-NeoX latest or checkpoints folder)"
                )
            found = (
                "an empty folder"
                if not any(path.iterdir())
                else (
                    "a log directory without a checkpoints folder"
                    if (path / "config.yaml").is_file()
                    else "a folder holding none of them"
                )
            )
            raise CheckpointError(
                f"exp_manager.resume_from_checkpoint: expected an nxd checkpoint (a folder with "
                f"{MARKER}), a run's log directory with a {CHECKPOINT_DIR} folder, a Hugging Face "
                f"model directory or a GPT-NeoX checkpoint, found {found} at {path}"
            )
        else:
            info = read_info(path).verified(contents=True)
    elif not exp.resume_if_exists:
        return None
    else:
        info, passed_over = newest_usable(log_dir / CHECKPOINT_DIR) if log_dir is not None else (None, [])
        if info is not None or exp.resume_ignore_no_checkpoint:  # else the refusal below names them
            _say_passed_over(passed_over, info)
        if info is None and log_dir is not None and (neox := _neox(log_dir, weights_only)) is not None:
            return neox
        if info is None:
            if exp.resume_ignore_no_checkpoint:
                return None
            where = log_dir / CHECKPOINT_DIR if log_dir is not None else "the log directory"
            found = (
                f"none usable: {'; '.join(passed_over)} (nxd-train ckpt verify {where} checks each)"
                if passed_over
                else "none"
            )
            raise CheckpointError(
                f"exp_manager.resume_if_exists: expected a complete, undamaged checkpoint in "
                f"{where}, found {found}; set exp_manager.resume_ignore_no_checkpoint: True (on the "
                "command line +exp_manager.resume_ignore_no_checkpoint=True where the file lacks "
                "the key) to start a new run instead"
            )
    return Resume.of_checkpoint(info, weights_only)


def _say_passed_over(passed_over: list[str], info: CheckpointInfo | None) -> None:
    """The newer checkpoints passed over, as latest_checkpoint says them."""
    fallback = f"using {info.path.name}" if info is not None else "no complete checkpoint remains"
    for reason in passed_over:
        warnings.warn(f"skipping a checkpoint: {reason}; {fallback}", CheckpointWarning, stacklevel=3)


def _new_run(path: Path, why: str) -> None:
    """No checkpoint to start from at `path` (resume_from_checkpoint_optional): a new run, said once."""
    warnings.warn(
        f"exp_manager.resume_from_checkpoint: {path} {why}; starting a new run (resume_from_checkpoint_optional)",
        CheckpointWarning,
        stacklevel=3,
    )


def _neox(path: Path, weights_only: bool) -> Resume | None:
    """The GPT-NeoX checkpoint at `path` as a start: its weights, and unless only they are asked for
    (finetune), the step after its iteration; None when `path` holds none."""
    found = nxd_ckpt.find_neox_checkpoint(path)
    if found is None:
        return None
    start = 0 if weights_only else nxd_ckpt.neox_iteration(found)
    return Resume(found.folder.resolve(), True, neox=True, start_step=start)


def export_of(
    family: ModelFamily,
    tokenizer_files: dict[str, str] | None = None,
    pad_id: int | None = None,
    *,
    reading: bool = False,
) -> nxd_ckpt.HFExport | str:
    """The model's Hugging Face mapping (with the tokenizer files an export copies and, for a reward
    model, the id its rows are padded with), or why it has none. A soft prompt has no Hugging Face counterpart:
    `reading` weights it starts fresh; an export would drop it, so there is none."""
    if not reading and getattr(family.spec, "soft_prompt_tokens", 0):
        return (
            "no Hugging Face architecture holds a soft prompt (model.soft_prompt): an export would leave out what "
            "the run trained"
        )
    try:
        return replace(nxd_ckpt.HFExport.of(family.hf_mapping(pad_id)), tokenizer_files=dict(tokenizer_files or {}))
    except ModelConfigError as error:
        return str(error)
