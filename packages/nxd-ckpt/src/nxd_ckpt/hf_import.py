"""Hugging Face safetensors import, streamed: each rank reads only its own shards, tensor by tensor.

The files' headers are read first (names, shapes, dtypes; no tensor data) and checked against the
model's mapping, so a missing, extra or differently shaped tensor, or a damaged file, is one error
before any value is read. Then every target tensor of this rank (a plain tensor, or a DTensor whose
local part is a box of the whole: tensor-parallel rows or columns, ZeRO-1 rows) reads that box with
safetensors' lazy slicing; no rank ever holds a whole model, and a whole tensor only where it keeps
the whole (replicated, or a layout whose shard is not one box).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from .errors import CheckpointError
from .hf import HFExport


@dataclass(frozen=True)
class _Entry:
    file: Path
    key: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class _Part:
    """Our tensor held in an interleaved one: part `index` of `count`, `rows` rows per head."""

    entry: _Entry
    index: int
    count: int
    rows: int

    def boxes(self, start: int, length: int) -> list[tuple[int, int]]:
        """(row in the interleaved tensor, row count) runs holding our rows start ... start + length."""
        runs, row = [], start
        while row < start + length:
            head, within = divmod(row, self.rows)
            take = min(self.rows - within, start + length - row)
            runs.append((head * self.rows * self.count + self.index * self.rows + within, take))
            row += take
        return runs


def _headers(directory: Path) -> dict[str, _Entry]:
    """Every tensor of the directory's safetensors files (its file and shape), from the headers alone."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: expected Hugging Face *.safetensors files, found none")
    found: dict[str, _Entry] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 - not a dict
                    found[key] = _Entry(file, key, tuple(handle.get_slice(key).get_shape()))
        except (SafetensorError, OSError) as error:
            raise CheckpointError(
                f"{file}: not a readable safetensors file ({error}); expected one written "
                "whole by save_pretrained or safetensors' save_file"
            ) from None
    return found


def _matched(
    directory: Path, export: HFExport, shapes: Mapping[str, torch.Size]
) -> dict[str, _Entry | _Part | list[_Entry]]:
    """Our key -> its tensor in the files (a stacked key: its slices' tensors; an interleaved part: its place in
    the tensor holding it), every name and shape checked (vocabulary rows may be fewer)."""
    found = {
        key: entry
        for key, entry in _headers(directory).items()
        if not (export.buffers and key.endswith(export.buffers))
    }
    theirs_to_ours = {theirs: ours for ours, theirs in export.keys.items()}
    slices = {theirs: (ours, index) for ours, keys in export.stacked.items() for index, theirs in enumerate(keys)}
    theirs_to_ours.update({theirs: ours for theirs, (ours, _) in slices.items()})
    theirs_to_ours.update({theirs: ours[0] for theirs, (ours, _) in export.interleaved.items()})
    missing, extra = sorted(set(theirs_to_ours) - set(found)), sorted(set(found) - set(theirs_to_ours))
    if missing or extra:
        raise CheckpointError(
            f"{directory}: the weights do not match this model: "
            + "; ".join(
                part
                for part in (
                    f"missing {', '.join(missing[:4])}" if missing else "",
                    f"unexpected {', '.join(extra[:4])}" if extra else "",
                )
                if part
            )
        )
    matched: dict[str, _Entry | _Part | list[_Entry]] = {
        ours: [None] * len(keys) for ours, keys in export.stacked.items()
    }
    for theirs, entry in found.items():
        ours = theirs_to_ours[theirs]
        shape = tuple(shapes[ours])
        if theirs in export.interleaved:
            parts, rows = export.interleaved[theirs]
            whole = (shape[0] * len(parts), *shape[1:])
            if entry.shape != whole or any(tuple(shapes[part]) != shape for part in parts):
                raise CheckpointError(
                    f"{entry.file}: {theirs} is {list(entry.shape)}; this model's "
                    f"{', '.join(parts)} hold {list(whole)} together"
                )
            matched.update({part: _Part(entry, index, len(parts), rows) for index, part in enumerate(parts)})
            continue
        if theirs in slices:
            if entry.shape != shape[1:]:
                raise CheckpointError(
                    f"{entry.file}: {theirs} is {list(entry.shape)}; this model's {ours} holds "
                    f"{shape[0]} of {list(shape[1:])}"
                )
            matched[ours][slices[theirs][1]] = entry
            continue
        padded = ours in export.vocab_padded_keys and entry.shape[0] <= shape[0] and entry.shape[1:] == shape[1:]
        if entry.shape != shape and not padded:
            raise CheckpointError(
                f"{entry.file}: {theirs} is {list(entry.shape)}; this model's {ours} is {list(shape)}"
            )
        matched[ours] = entry
    for alias, source in export.tied.items():
        matched[alias] = matched[source]
    return matched


def check_hf_weights(directory: Path, export: HFExport, shapes: Mapping[str, torch.Size]) -> None:
    """A CheckpointError naming the file and tensor when the Hugging Face directory does not hold exactly
    the model's tensors in its shapes, or a file is damaged; reads the headers only (before launch)."""
    _matched(Path(directory), export, shapes)


def box_of(target: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(offset, size) per dimension of the part of the whole tensor `target` holds; None when that part is
    not one box (a placement other than plain Shard or Replicate)."""
    if not isinstance(target, DTensor):
        return (0,) * target.dim(), tuple(target.shape)
    if not all(type(placement) in (Shard, Replicate) for placement in target.placements):
        return None
    size, offset = compute_local_shape_and_global_offset(target.shape, target.device_mesh, target.placements)
    return tuple(offset), tuple(size)


def _read(
    entry: _Entry | _Part | list[_Entry], offset: tuple[int, ...], size: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    """The box of `entry`'s tensor at `offset` of `size`, in `dtype`; rows beyond the file's (a padded
    vocabulary) are zero. A stacked tensor reads the box's slices from their own tensors, an interleaved part
    its rows head by head."""
    if isinstance(entry, _Part):
        runs = entry.boxes(offset[0], size[0])
        if not runs:
            return torch.zeros(size, dtype=dtype)
        return torch.cat([_read_one(entry.entry, (row, *offset[1:]), (count, *size[1:]), dtype) for row, count in runs])
    if isinstance(entry, list):
        parts = entry[offset[0] : offset[0] + size[0]]
        return torch.stack([_read_one(part, offset[1:], size[1:], dtype) for part in parts])
    return _read_one(entry, offset, size, dtype)


def _read_one(entry: _Entry, offset: tuple[int, ...], size: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    rows = min(offset[0] + size[0], entry.shape[0]) - offset[0] if size else 0
    if size and rows <= 0:
        return torch.zeros(size, dtype=dtype)
    try:
        with safe_open(str(entry.file), framework="pt") as handle:
            if not size:
                return handle.get_tensor(entry.key).to(dtype)
            ends = [start + length for start, length in zip(offset, size, strict=True)]
            index = (slice(offset[0], offset[0] + rows), *map(slice, offset[1:], ends[1:]))
            value = handle.get_slice(entry.key)[index].to(dtype)
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"{entry.file}: cannot read {entry.key} ({error})") from None
    if rows < size[0]:
        value = torch.cat([value, value.new_zeros(size[0] - rows, *size[1:])])
    return value


@torch.no_grad()
def load_hf_weights(
    directory: Path, export: HFExport, shapes: Mapping[str, torch.Size], targets: Mapping[str, torch.Tensor]
) -> None:
    """Fill `targets` (our key -> a live tensor of this rank: whole, or a DTensor shard) from the Hugging
    Face directory `directory` through the model's mapping `export`, each reading only its part.

    `shapes` are our whole model's shapes; the directory must hold exactly the tensors of the mapping
    (the vocabulary may be unpadded; tied keys are filled from their source). Anything else is a
    CheckpointError naming the file and tensor, raised before any value is copied."""
    directory = Path(directory)
    matched = _matched(directory, export, shapes)
    if unknown := sorted(set(targets) - set(matched)):
        raise CheckpointError(f"{directory}: holds nothing for this model's {', '.join(unknown[:4])}")
    for ours, target in targets.items():
        box = box_of(target)
        if box is None:  # not one box: read the whole tensor and keep this rank's part
            whole = _read(matched[ours], (0,) * target.dim(), tuple(target.shape), target.dtype)
            target.to_local().copy_(
                distribute_tensor(
                    whole.to(target.device), target.device_mesh, target.placements, src_data_rank=None
                ).to_local()
            )
        else:
            value = _read(matched[ours], *box, target.dtype)
            (target.to_local() if isinstance(target, DTensor) else target).copy_(value)
