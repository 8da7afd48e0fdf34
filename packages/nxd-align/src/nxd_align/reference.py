"""DPO's reference log-probs: each pair's summed response log-probs under the reference model, as a
table in dataset order, and what keeps that table honest across resumes.

The table is computed once, before the first step, from the initial weights (under LoRA, the base
with its adapters off), then read by dataset index: any sampler order, any layout and any resume see
the same values, and they are never recomputed from trained weights. It is stored with a digest of
what determines it (initial model, data, tokenizer, precision), so a table made for another run is
recognised and never used.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch.utils.data import Dataset

from .objectives import Batch
from .preference import sequence_log_probs

REFERENCE_KEY = "reference_log_probs"
"""The batch entry holding each row's reference log-prob (what `DPOObjective` reads)."""
TABLE_FILE = "reference_log_probs.safetensors"


class ReferenceError(ValueError):
    """A stored reference table that cannot serve this run: unreadable, or made for another."""


class RowLogProbs:
    """A loss function for nxd-parallel's executors that trains nothing: its metric `log_probs` holds
    every row's summed log-prob at the rows of its micro-batch within `batches` (all of a call's
    micro-batches hold the same number of rows), so the executor's totals are the call's rows in
    order. On pipeline ranks without the last stage the metric is absent."""

    def __init__(self, batches: list[Batch]):
        self.batches = batches

    def __call__(self, token_losses: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        position = next(i for i, known in enumerate(self.batches) if known is batch)
        total, _ = sequence_log_probs(token_losses, batch["labels"])
        rows = total.shape[0]
        values = torch.zeros(len(self.batches) * rows, dtype=torch.float64, device=total.device)
        values[position * rows : (position + 1) * rows] = total.double()
        return torch.zeros((), dtype=torch.float64, device=total.device), {"log_probs": values}


class WithReference(Dataset):
    """`dataset` whose samples also carry their rows' reference log-probs, from `table` (samples x
    rows per sample: a pair's chosen and rejected; one for a lone row, given as a scalar) by dataset
    index."""

    def __init__(self, dataset: Dataset, table: torch.Tensor):
        if table.dim() != 2 or table.shape[0] != len(dataset):
            raise ReferenceError(f"reference table: expected {len(dataset)} samples x rows, found {tuple(table.shape)}")
        self.dataset, self.table = dataset, table

    def __len__(self) -> int:
        return len(self.dataset)

    def _values(self, values: torch.Tensor) -> torch.Tensor:
        return values[0] if len(values) == 1 else values

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.dataset[index] | {REFERENCE_KEY: self._values(self.table[int(index)])}

    def padding(self) -> dict[str, torch.Tensor]:
        """A sample that adds nothing to the loss, with zero reference values."""
        return self.dataset.padding() | {
            REFERENCE_KEY: self._values(torch.zeros(self.table.shape[1], dtype=self.table.dtype))
        }


def reference_digest(parts: dict[str, object]) -> str:
    """SHA-256 of what decides a reference table (JSON-able `parts`: the model, its initial weights,
    the precision, each split's data fingerprint ...)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def save_reference(path: Path, tables: dict[str, torch.Tensor], digest: str) -> None:
    """The tables (split name -> samples x rows) with their digest, written under a temporary name and
    renamed, so an interrupted write never leaves a partial table."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file(
        {split: table.detach().cpu().contiguous() for split, table in tables.items()},
        partial,
        metadata={"digest": digest},
    )
    os.replace(partial, path)


def load_reference(path: Path, digest: str) -> dict[str, torch.Tensor]:
    """The tables stored at `path`; ReferenceError when the file is unreadable or its digest is not
    `digest` (made for another model, data, tokenizer or precision)."""
    try:
        with safe_open(path, "pt") as stored:
            names = stored.keys()  # safe_open is not iterable
            metadata, tables = stored.metadata() or {}, {split: stored.get_tensor(split) for split in names}
    except (OSError, SafetensorError, ValueError) as error:
        raise ReferenceError(
            f"{path}: expected a reference table (safetensors), found an unreadable file ({error})"
        ) from None
    found = metadata.get("digest")
    if found != digest:
        raise ReferenceError(
            f"{path}: reference log-probs made for another model, data, tokenizer or precision "
            f"(digest {str(found)[:12]}, this run's {digest[:12]})"
        )
    return tables
