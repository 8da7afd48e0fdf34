"""What a run saves as it trains, set up once from its plan: the checkpointer in the log directory (a continued
run's lineage going on), what every checkpoint's marker records of the run, the files rank 0 writes into each
checkpoint folder (peft's adapter files), the Trainer-style folders and the S3 uploads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

import nxd_ckpt
import torch
from lightning_fabric import Fabric
from nxd_ckpt import (
    LORA_RECORD,
    Checkpointer,
    CheckpointInfo,
    CheckpointUploader,
    continued_lineage,
    write_adapter_files,
)
from nxd_parallel import ParallelDims

from nxd_train.logging.log_dir import CHECKPOINT_DIR
from nxd_train.logging.monitor import Monitor
from nxd_train.run.checkpointing import HEAD_RECORD, PACKAGES, Resume, export_of
from nxd_train.run.identity import IDENTITY
from nxd_train.run.plan import RunPlan
from nxd_train.run.trainer_outputs import TrainerOutputs


@dataclass
class Saving:
    checkpointer: Checkpointer
    record: dict[str, Any]
    """What every checkpoint's marker records of the run (layout, versions, config, Hugging Face mapping)."""
    attach: list[Callable[[Path], None]] = field(default_factory=list)
    """What rank 0 writes into each checkpoint folder beside the shards (peft adapter files)."""
    trainer_outputs: TrainerOutputs | None = None
    """Rank 0's Trainer-style folders (exp_manager.trainer_checkpoints)."""
    uploads: CheckpointUploader | None = None
    """Rank 0's uploads of complete checkpoints to S3 (exp_manager.s3_checkpoints)."""


def set_up_saving(
    plan: RunPlan,
    fabric: Fabric,
    dims: ParallelDims,
    log_dir: Path,
    steps: int,
    resume: Resume | None,
    group: torch.distributed.ProcessGroup | None,
    monitor: Monitor,
) -> Saving:
    """The saves of this run, in its log directory; a continued run's lineage goes on from the resumed one.
    Rank 0 hands each complete one to its Trainer-style folders and its S3 uploads."""
    main, attach, record = fabric.global_rank == 0, _adapter_writers(plan), _record(plan, fabric, dims)
    trainer_outputs = None
    if plan.logging.trainer_checkpoints and main:
        trainer_outputs = TrainerOutputs(
            log_dir,
            {
                "max_steps": steps,
                "logging_steps": plan.cadence.log_every_n_steps,
                "train_batch_size": plan.batches.micro_batch_size,
            },
            monitor.info,
        )
    uploads = None
    if plan.checkpoints.s3 is not None and main:
        uploads = CheckpointUploader(plan.checkpoints.s3, log_dir.name, monitor.info)

    def report_save(info: CheckpointInfo, seconds: float) -> None:
        monitor.info(f"checkpoint {info.path.name}: {sum(info.files.values()) / 2**20:.1f} MiB in {seconds:.2f} s")
        if trainer_outputs is not None:
            trainer_outputs.saved(info)
        if uploads is not None and info.path.is_dir():  # retention may have removed it at once (not in its top k)
            uploads.submit(info.path)

    continued = resume is not None and not resume.weights_only
    checkpointer = Checkpointer(
        log_dir / CHECKPOINT_DIR,
        plan.checkpoints.policy,
        asynchronous=plan.checkpoints.asynchronous,
        process_group=group,
        on_complete=report_save,
        attach=partial(_write_all, attach),
        lineage=continued_lineage(log_dir / CHECKPOINT_DIR, resume.path) if continued else None,
        resumed_from=None if resume is None else resume.path,
    )
    return Saving(checkpointer, record, attach, trainer_outputs, uploads)


def _adapter_writers(plan: RunPlan) -> list[Callable[[Path], None]]:
    """peft's adapter folder inside each checkpoint, when the config asks for its files."""
    adapters, lora = plan.adapters, plan.lora
    if lora is None or not (adapters.config_file or adapters.single_file):
        return []
    export = lora.adapter_export()

    def adapter_files(folder: Path) -> None:
        write_adapter_files(folder, export, weights_from=folder if adapters.single_file else None)

    return [adapter_files]


def _write_all(writers: list[Callable[[Path], None]], folder: Path) -> None:
    """Every writer's files into a checkpoint folder."""
    for write in writers:
        write(folder)


def _record(plan: RunPlan, fabric: Fabric, dims: ParallelDims) -> dict[str, Any]:
    """What every checkpoint's marker records of the run (layout, versions, config, Hugging Face mapping)."""
    export = export_of(plan.family, plan.data.tokenizer_files, plan.data.pad_id)
    record = {
        "world_size": fabric.world_size,
        "layout": dims.sizes(),
        "versions": versions(),
        "config": plan.resolved_config,
        IDENTITY: plan.identity,
        **export_record(export),
        HEAD_RECORD: plan.family.head,
    }
    if plan.lora is not None:
        record[LORA_RECORD] = plan.lora.adapter_export() | {"base": plan.adapters.base}
    return record


def export_record(export: nxd_ckpt.HFExport | str) -> dict[str, Any]:
    """What the completion marker says about Hugging Face export: the mapping, or why there is none."""
    return {"hf_export": export.to_json()} if isinstance(export, nxd_ckpt.HFExport) else {"hf_export_problem": export}


def versions() -> dict[str, str]:
    """The installed nxd packages' versions ("unknown" for one not installed as a distribution)."""
    found = {}
    for package in PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "unknown"
    return found
