"""Which checkpoint a run continues from (the resume keys, or the log directory's newest complete one), its
schedule, and what the continuing run changes from the one that saved it."""

from __future__ import annotations

import warnings
from pathlib import Path

from nxd_ckpt import CheckpointError, CheckpointWarning, latest_checkpoint, read_info
from nxd_config import ConfigNotice, NxdConfig

from nxd_train.logging.log_dir import CHECKPOINT_DIR, optional_path, resumable_log_dir
from nxd_train.run.checkpointing import Resume, resume_choice
from nxd_train.run.identity import IDENTITY, compare
from nxd_train.run.plan import PreflightError


def resume_of(cfg: NxdConfig) -> tuple[Resume | None, Path | None]:
    """The checkpoint the resume keys select and the log directory a resumed run continues in, with
    notices for checkpoints passed over and resume keys that change nothing here. A run that starts
    from initial weights (weight_init_only) and is restarted with resume_if_exists continues from its
    newest complete checkpoint."""
    exp = cfg.exp_manager
    search = (
        resumable_log_dir(optional_path(exp.explicit_log_dir), optional_path(exp.exp_dir), exp.name or cfg.name)
        if exp.resume_if_exists
        else None
    )
    with warnings.catch_warnings(record=True) as skipped:
        warnings.simplefilter("always", CheckpointWarning)
        try:
            resume = resume_choice(cfg, search)
        except CheckpointError as error:
            raise PreflightError([str(error)]) from None
    for warning in skipped:
        warnings.warn(str(warning.message), ConfigNotice, stacklevel=3)
    if resume is None and exp.resume_if_exists:
        warnings.warn(
            f"exp_manager.resume_if_exists: no complete checkpoint under {search}; starting a new run "
            "(resume_ignore_no_checkpoint)",
            ConfigNotice,
            stacklevel=3,
        )
    if cfg.model.weight_init_only and resume is None:
        warnings.warn(
            "model.weight_init_only: no checkpoint is loaded, so it changes nothing", ConfigNotice, stacklevel=3
        )
    if resume is not None and resume.neox:
        for key, value, inert in (
            ("resume_rng", exp.resume_rng, False),
            ("resume_schedule", exp.resume_schedule, "checkpoint"),
        ):
            if value == inert:
                warnings.warn(
                    f"exp_manager.{key}: {value} changes nothing when starting from the GPT-NeoX checkpoint "
                    f"{resume.path}: only its weights are read; random states and the schedule come from "
                    "this run",
                    ConfigNotice,
                    stacklevel=3,
                )
    continues = resume is not None and exp.resume_if_exists and not exp.resume_from_checkpoint
    both = resume is not None and exp.resume_from_checkpoint and search is not None
    if both and (found := latest_checkpoint(search / CHECKPOINT_DIR)) is not None:
        # NeMo's precedence: the log directory's newest checkpoint wins over resume_from_checkpoint (a run
        # started from initial weights, a LoRA run on its base, continues from its own checkpoint)
        if not resume.weights_only and found.path.resolve() != resume.path:
            warnings.warn(
                f"exp_manager.resume_from_checkpoint: {resume.path} passed over: with resume_if_exists the "
                f"log directory's newest checkpoint, {found.path}, is where the run continues (NeMo's "
                "precedence)",
                ConfigNotice,
                stacklevel=3,
            )
        return Resume.of_checkpoint(found, weights_only=False), search
    return resume, search if continues else None


SCHEDULE_KEYS = ("lr", "sched")
"""model.optim keys that make the learning-rate schedule (exp_manager.resume_schedule)."""


def resumed_schedule(cfg: NxdConfig, resume: Resume | None) -> NxdConfig:
    """`cfg` with the learning rate and schedule exp_manager.resume_schedule picks when continuing from an
    nxd checkpoint: this config's, the one the checkpoint recorded, or this config's when they are the same."""
    choice = cfg.exp_manager.resume_schedule
    if choice == "config" or resume is None or resume.weights_only:
        return cfg
    optim = cfg.model.optim
    saved = read_info(resume.path).extra.get("config", {}).get("model", {}).get("optim", {})
    ours = optim.model_dump(mode="json", by_alias=True)
    differ = [key for key in SCHEDULE_KEYS if key in saved and saved[key] != ours.get(key)]
    if not differ:
        return cfg
    if choice == "same":
        found = "; ".join(f"model.optim.{key}: {ours.get(key)} here, {saved[key]} in the checkpoint" for key in differ)
        raise PreflightError(
            [
                f"exp_manager.resume_schedule: same: the learning-rate schedule differs from the one "
                f"{resume.path} recorded ({found}); expected the same, or resume_schedule config (this "
                "file's) or checkpoint (the checkpoint's); in a GPT-NeoX file override_lr_scheduler or "
                "use_checkpoint_lr_scheduler"
            ]
        )
    replaced = type(optim).model_validate({**ours, **{key: saved[key] for key in differ}})
    warnings.warn(
        f"exp_manager.resume_schedule: checkpoint: model.optim {', '.join(differ)} from {resume.path}",
        ConfigNotice,
        stacklevel=3,
    )
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"optim": replaced})})


def resume_changes(cfg: NxdConfig, resume: Resume | None, identity: dict, source_key: str) -> list[str]:
    """Settings changed since the checkpoint a run continues was saved: those that cannot continue it, as
    one problem; the hyperparameters it applies from the first resumed step, as one notice."""
    if resume is None or resume.weights_only:
        return []
    saved = read_info(resume.path).extra
    refused, applied = compare(
        saved.get("config", {}),
        saved.get(IDENTITY, {}),
        cfg.model_dump(mode="json", by_alias=True),
        identity,
        source_key,
    )
    if not cfg.exp_manager.resume_optimizer:  # a fresh optimizer: its name and settings may change
        refused = [line for line in refused if not line.startswith("model.optim.")]
        applied = []
    if applied:
        warnings.warn(
            f"resuming {resume.path} with changed settings, applied from its first step: {'; '.join(applied)}",
            ConfigNotice,
            stacklevel=3,
        )
    if not refused:
        return []
    return [
        f"{resume.path}: cannot continue this checkpoint with changed settings that shape its state or data "
        f"position: {'; '.join(refused)}; expected the settings it was saved with, or model.weight_init_only: "
        "True to start a new run from its weights"
    ]
