"""Checkpoints as transformers' Trainer lays them out, beside nxd's own, so the tools people load
Trainer output with load nxd's: `<output>/checkpoint-<step>/` holding the peft adapter folder
(`PeftModel.from_pretrained`) of a LoRA run or the model (`AutoModelForCausalLM`) otherwise, the
run's tokenizer files and `trainer_state.json` with the log history; and the final adapter or model
in `<output>` itself. Each `trainer_state.json` names the nxd checkpoint it was written from
(`nxd_checkpoint`), so a resume from `checkpoint-<step>` continues exactly, and a Trainer folder whose
nxd checkpoint retention removed goes with it. Folders nxd did not write are never touched.
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


def write_trainer_checkpoint(checkpoint: Path, output: Path, log_history: Sequence[dict[str, Any]],
                             state: dict[str, Any] | None = None) -> Path:  # fmt: skip
    """`output/checkpoint-<step>` of nxd checkpoint `checkpoint` (see the module docstring); `state` adds
    trainer_state.json fields (max_steps, logging_steps ...). Written under a temporary name and renamed."""
    info = read_info(Path(checkpoint))
    output = Path(output)
    final = output / f"checkpoint-{info.step}"
    if final.exists() and pointer_of(final) is None:
        raise CheckpointError(f"{final}: exists and was not written by nxd; expected to write the Trainer-style "
                              "checkpoint there")  # fmt: skip
    staging = output / f".checkpoint-{info.step}.{os.getpid()}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    export_hf(info.path, staging)
    _add_tokenizer(info.extra, staging)
    trainer_state = {"global_step": info.step, "epoch": _last(log_history, "epoch"), "log_history": list(log_history),
                     "best_metric": None, "best_model_checkpoint": None, "is_local_process_zero": True,
                     "is_world_process_zero": True, "total_flos": 0, **(state or {}),
                     POINTER: os.path.relpath(info.path, output)}  # fmt: skip
    (staging / STATE_FILE).write_text(json.dumps(trainer_state, indent=2, sort_keys=True))
    replaced = output / f".checkpoint-{info.step}.{os.getpid()}.replaced"
    if final.exists():
        final.rename(replaced)
    staging.rename(final)
    shutil.rmtree(replaced, ignore_errors=True)
    return final


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


def prune_trainer_checkpoints(output: Path) -> list[Path]:
    """Remove the Trainer-style folders nxd wrote whose nxd checkpoint is gone (retention removed it);
    returns them."""
    removed = []
    for folder in sorted(Path(output).glob("checkpoint-*")):
        pointer = pointer_of(folder)
        if pointer is not None and not (Path(output) / pointer).exists():
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
