"""Checkpoints as transformers' Trainer lays them out, beside nxd's own, so the tools people load
Trainer output with load nxd's: `<output>/checkpoint-<step>/` holding the peft adapter folder
(`PeftModel.from_pretrained`) of a LoRA run or the model (`AutoModelForCausalLM`) otherwise, the
run's tokenizer files and `trainer_state.json` with the log history; and the final adapter or model
in `<output>` itself. Each `trainer_state.json` names the nxd checkpoint it was written from
(`nxd_checkpoint`), so a resume from `checkpoint-<step>` continues exactly, and a Trainer folder whose
nxd checkpoint its run's retention removed goes with it. Folders another run or the user made are never
touched: a name they hold gets a version (`checkpoint-<step>-v1`).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import CheckpointError
from .hf import HFExport, _copy_tokenizer, export_hf
from .marker import read_info

STATE_FILE = "trainer_state.json"
POINTER = "nxd_checkpoint"
"""trainer_state.json's key naming the nxd checkpoint (relative to the output folder)."""


def write_trainer_checkpoint(
    checkpoint: Path, output: Path, log_history: Sequence[dict[str, Any]], state: dict[str, Any] | None = None
) -> Path:
    """`output/checkpoint-<step>` of nxd checkpoint `checkpoint` (see the module docstring); `state` adds
    trainer_state.json fields (max_steps, logging_steps ...). Written under a temporary name and renamed."""
    info = read_info(Path(checkpoint))
    output = Path(output)
    final = _free_name(output, info.step, os.path.relpath(info.path, output))
    staging = output / f".checkpoint-{info.step}.{os.getpid()}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    export_hf(info.path, staging)
    _add_tokenizer(info.extra, staging)
    trainer_state = {
        "global_step": info.step,
        "epoch": _last(log_history, "epoch"),
        "log_history": list(log_history),
        "best_metric": None,
        "best_model_checkpoint": None,
        "is_local_process_zero": True,
        "is_world_process_zero": True,
        "total_flos": 0,
        **(state or {}),
        POINTER: os.path.relpath(info.path, output),
    }
    (staging / STATE_FILE).write_text(json.dumps(trainer_state, indent=2, sort_keys=True))
    replaced = output / f".checkpoint-{info.step}.{os.getpid()}.replaced"
    if final.exists():
        final.rename(replaced)
    staging.rename(final)
    shutil.rmtree(replaced, ignore_errors=True)
    return final


def _free_name(output: Path, step: int, pointer: str) -> Path:
    """checkpoint-<step>, or checkpoint-<step>-v1, -v2 ... when another run or the user holds that name (a
    folder of this checkpoint's is replaced)."""
    for version in range(10_000):
        final = output / (f"checkpoint-{step}" + (f"-v{version}" if version else ""))
        if not final.exists() or pointer_of(final) == pointer:
            return final
    raise CheckpointError(f"{output}: every checkpoint-{step} name is taken")


def write_final(checkpoint: Path, output: Path) -> None:
    """The final adapter (or model) and tokenizer files of `checkpoint` in `output` itself, each file written
    under a temporary name and renamed (what else is in `output` stays)."""
    output = Path(output)
    staging = output / f".final.{os.getpid()}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    info = read_info(Path(checkpoint))
    export_hf(info.path, staging)
    _add_tokenizer(info.extra, staging)
    for file in staging.iterdir():
        file.replace(output / file.name)
    shutil.rmtree(staging, ignore_errors=True)


def prune_trainer_checkpoints(folders: Sequence[Path]) -> list[Path]:
    """Remove those of `folders` (Trainer-style folders a run wrote) whose nxd checkpoint is gone (its
    retention removed it); returns them. Folders of other runs are never passed, so never touched."""
    removed = []
    for folder in folders:
        pointer = pointer_of(folder)
        if pointer is not None and not (Path(folder).parent / pointer).exists():
            shutil.rmtree(folder)
            removed.append(folder)
    return removed


def pointer_of(folder: Path) -> str | None:
    """The nxd checkpoint a Trainer-style folder names (relative to its output folder), None when nxd did
    not write it."""
    state = Path(folder) / STATE_FILE
    try:
        pointer = json.loads(state.read_text()).get(POINTER)
    except (OSError, ValueError, AttributeError):
        return None
    return pointer if isinstance(pointer, str) else None


def nxd_checkpoint_of(folder: Path) -> Path | None:
    """The nxd checkpoint behind a Trainer-style `checkpoint-<step>` folder nxd wrote, else None."""
    pointer = pointer_of(folder)
    return None if pointer is None else (Path(folder).parent / pointer).resolve()


def _add_tokenizer(extra: dict[str, Any], folder: Path) -> None:
    if "hf_export" in extra and not any(folder.glob("tokenizer*")):
        _copy_tokenizer(HFExport.from_json(extra["hf_export"]).tokenizer_files, folder)


def _last(history: Sequence[dict[str, Any]], name: str) -> Any:
    return next((row[name] for row in reversed(history) if name in row), None)
