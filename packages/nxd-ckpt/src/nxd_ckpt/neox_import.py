"""GPT-NeoX checkpoints as a run's starting weights: a folder GPT-NeoX (DeepSpeed) wrote, read for its model
weights, tensor-parallel parts merged, then each rank keeps the part of every tensor its layout holds.

The folder is a `load` folder whose `latest` file names the checkpoint (`global_stepN`), or that checkpoint's
own folder. With pipeline stages NeoX writes `layer_XX-model_YY-model_states.pt` (layer XX of its layer
sequence, tensor-parallel rank YY); without, `mp_rank_YY_model_states.pt` holds every layer under `module`
(`sequential.XX.name`). Where each of our tensors lies is the model's `NeoXLayout` (nxd-models). Files are
read with torch's weights-only loader, memory-mapped: a tensor's bytes are read when it is merged; the numpy
arrays DeepSpeed keeps beside the weights (random states) are the only other objects it lets through.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy
import numpy.dtypes
import torch
from torch.distributed.tensor import DTensor, distribute_tensor

try:
    from numpy._core import multiarray
except ImportError:  # numpy 1
    from numpy.core import multiarray

from .errors import CheckpointError
from .hf_import import box_of

LAYER_FILE = re.compile(r"layer_(\d+)-model_(\d+)-model_states\.pt$")
RANK_FILE = re.compile(r"mp_rank_(\d+)_model_states\.pt$")
NUMPY_GLOBALS = {
    "numpy.ndarray": numpy.ndarray,
    "numpy.dtype": numpy.dtype,
    **{
        f"numpy.{core}.multiarray.{name}": getattr(multiarray, name)
        for core in ("core", "_core")
        for name in ("_reconstruct", "scalar")
    },
}
"""The globals numpy's arrays, scalars and dtypes pickle as (numpy 1 and 2 module names), by exact name."""
NUMPY_DTYPE_CLASSES = [kind for kind in vars(numpy.dtypes).values() if isinstance(kind, type)]
"""The classes of numpy's dtypes, which the loader sees when it sets a dtype's state (a class, no code)."""
OLDER_NAMES = {"mlp.linear1.": "mlp.dense_h_to_4h.", "mlp.linear2.": "mlp.dense_4h_to_h."}
"""GPT-NeoX's MLP names before its MLP rework."""


@dataclass(frozen=True)
class NeoXCheckpoint:
    folder: Path
    """The checkpoint's own folder (global_stepN)."""
    ranks: int
    """NeoX's tensor-parallel size when it saved."""
    pipelined: bool
    """Layer files (a PipelineModule's) rather than one module file per rank."""


def find_neox_checkpoint(path: Path) -> NeoXCheckpoint | None:
    """The GPT-NeoX checkpoint `path` names (a load folder with `latest`, or a checkpoint folder), None when it
    holds none; CheckpointError when `latest` names a folder that is not there."""
    path = Path(path)
    if (path / "latest").is_file():
        tag = (path / "latest").read_text().strip()
        if not (path / tag).is_dir():
            raise CheckpointError(f"{path / 'latest'}: names {tag!r}, which is not a folder of {path}")
        path = path / tag
    if not path.is_dir():
        return None
    layer_ranks = {int(match.group(2)) for file in path.iterdir() if (match := LAYER_FILE.match(file.name))}
    rank_files = {int(match.group(1)) for file in path.iterdir() if (match := RANK_FILE.match(file.name))}
    if not layer_ranks and not rank_files:
        return None
    ranks = layer_ranks or rank_files
    if ranks != set(range(len(ranks))):
        raise CheckpointError(
            f"{path}: holds the tensor-parallel ranks {sorted(ranks)} of a GPT-NeoX checkpoint; "
            f"expected 0 to {max(ranks)}"
        )
    return NeoXCheckpoint(path, len(ranks), bool(layer_ranks))


def _load(path: Path) -> dict[str, Any]:
    """A DeepSpeed file through torch's weights-only loader, letting numpy's arrays, scalars and dtypes
    through by their exact names (any other global, numpy's included, is refused: some of them run code)."""
    try:
        try:
            return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except pickle.UnpicklingError:
            names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
            if foreign := [name for name in names if name not in NUMPY_GLOBALS]:
                raise CheckpointError(
                    f"{path}: holds objects beyond tensors and numpy arrays ({', '.join(foreign)})"
                    "; nxd reads GPT-NeoX checkpoints with torch's weights-only loader"
                ) from None
            allowed = [(NUMPY_GLOBALS[name], name) for name in names] + NUMPY_DTYPE_CLASSES
            with torch.serialization.safe_globals(allowed):
                return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except CheckpointError:
        raise
    except Exception as error:  # noqa: BLE001 - a damaged or foreign file, whatever torch raises
        raise CheckpointError(f"{path}: not a checkpoint torch loads as weights ({error})") from None


def neox_iteration(checkpoint: NeoXCheckpoint) -> int:
    """The iteration GPT-NeoX saved `checkpoint` at: its `iteration` (older: `total_iters`), else the step in
    its folder's name (global_stepN)."""
    first = checkpoint.folder / "mp_rank_00_model_states.pt"
    if first.is_file():
        state = _load(first)
        for key in ("iteration", "total_iters"):
            if isinstance(state.get(key), int):
                return state[key]
    if match := re.fullmatch(r"global_step(\d+)", checkpoint.folder.name):
        return int(match.group(1))
    raise CheckpointError(
        f"{checkpoint.folder}: expected the iteration GPT-NeoX saved it at (`iteration` in "
        f"{first.name}, or a folder named global_stepN), found neither"
    )


class _Reader:
    """Each rank's tensors of a layer, each file opened once (memory-mapped)."""

    def __init__(self, checkpoint: NeoXCheckpoint):
        self.checkpoint = checkpoint
        self._open: dict[Path, dict[str, Any]] = {}

    def _file(self, path: Path) -> dict[str, Any]:
        if path not in self._open:
            if not path.is_file():
                raise CheckpointError(
                    f"{path}: missing; a GPT-NeoX checkpoint of {self.checkpoint.ranks} "
                    "tensor-parallel ranks has one for every layer and rank"
                )
            self._open[path] = _load(path)
        return self._open[path]

    def parts(self, layer: int, name: str) -> list[torch.Tensor]:
        """`name` of `layer` on every rank, under NeoX's current or older name."""
        found = []
        for rank in range(self.checkpoint.ranks):
            if self.checkpoint.pipelined:
                path = self.checkpoint.folder / f"layer_{layer:02d}-model_{rank:02d}-model_states.pt"
                tensors, key = self._file(path), name
            else:
                path = self.checkpoint.folder / f"mp_rank_{rank:02d}_model_states.pt"
                tensors, key = self._file(path).get("module", {}), f"sequential.{layer}.{name}"
            older = next((key.replace(new, old) for new, old in OLDER_NAMES.items() if new in key), None)
            if key not in tensors and older in tensors:
                key = older
            if key not in tensors:
                raise CheckpointError(
                    f"{path}: holds no {key}; expected the layer the model's config describes "
                    "(are num_layers, the norm and the biases the ones it was trained with?)"
                )
            found.append(tensors[key])
        return found


def _part(tensor: torch.Tensor, part: str, layout: Any, ranks: int) -> torch.Tensor:
    """One rank's share of our tensor within its query_key_value or linear1."""
    if part in ("up", "gate"):
        return tensor.chunk(2, dim=0)[0 if part == "up" else 1]
    heads, kv_heads, dim = layout.heads // ranks, layout.kv_heads // ranks, layout.head_dim
    index = "qkv".index(part)
    if layout.kv_heads == layout.heads:  # head by head: [q k v] of head 0, of head 1 ...
        return tensor.reshape(heads, 3, dim, *tensor.shape[1:])[:, index].reshape(heads * dim, *tensor.shape[1:])
    return tensor.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=0)[index]


def neox_tensor(reader: _Reader, key: str, layout: Any, *, shape_only: bool = False) -> torch.Tensor:
    """Our tensor `key`, whole, from every rank's part; `shape_only`: merged on the meta device, so that
    its shape is known without reading the parts' values."""
    source, ranks = layout.sources[key], reader.checkpoint.ranks
    parts = reader.parts(source.layer, source.name)
    if shape_only:
        parts = [torch.empty_like(part, device="meta") for part in parts]
    if source.part is not None:
        parts = [_part(part, source.part, layout, ranks) for part in parts]
    if source.join == "rows":
        return torch.cat(parts, dim=0)
    if source.join == "columns":
        return torch.cat(parts, dim=1)
    if source.join == "sum":
        return torch.stack(parts).sum(dim=0)
    return parts[0]


def check_neox_weights(path: Path, layout: Any, shapes: Mapping[str, torch.Size]) -> None:
    """A CheckpointError naming the file and tensor when the GPT-NeoX checkpoint at `path` does not hold the
    model's tensors in its shapes (the vocabulary may be padded differently); reads names and shapes only."""
    checkpoint = find_neox_checkpoint(Path(path))
    if checkpoint is None:
        raise CheckpointError(
            f"{path}: expected a GPT-NeoX checkpoint (a folder with `latest`, or one with "
            "*model_states.pt files), found none"
        )
    _check_ranks(checkpoint, layout)
    reader = _Reader(checkpoint)
    for key, shape in shapes.items():
        if key not in layout.sources:
            continue
        found = neox_tensor(reader, key, layout, shape_only=True)
        _check_shape(checkpoint, key, tuple(found.shape), tuple(shape), key in layout.vocab_padded_keys)


def _check_ranks(checkpoint: NeoXCheckpoint, layout: Any) -> None:
    if layout.heads % checkpoint.ranks or layout.kv_heads % checkpoint.ranks:
        raise CheckpointError(
            f"{checkpoint.folder}: saved over {checkpoint.ranks} tensor-parallel ranks, which do "
            f"not divide the model's {layout.heads} query and {layout.kv_heads} key/value heads "
            "(is num_attention_heads the one it was trained with?)"
        )


def _check_shape(
    checkpoint: NeoXCheckpoint, key: str, found: tuple[int, ...], shape: tuple[int, ...], vocabulary: bool
) -> None:
    if found == shape or (vocabulary and found[1:] == shape[1:]) or (found == () and shape == (1,)):
        return
    raise CheckpointError(
        f"{checkpoint.folder}: {key} is {list(found)} in the GPT-NeoX checkpoint; this model's is {list(shape)}"
    )


@torch.no_grad()
def load_neox_weights(
    path: Path, layout: Any, shapes: Mapping[str, torch.Size], targets: Mapping[str, torch.Tensor]
) -> None:
    """Fill `targets` (our key -> a live tensor of this rank: whole, or a DTensor shard) from the GPT-NeoX
    checkpoint at `path` through the model's `layout`: each tensor merged whole, then cut to this rank's part;
    vocabulary rows beyond NeoX's are zero, and NeoX's extra padding rows are dropped."""
    checkpoint = find_neox_checkpoint(Path(path))
    if checkpoint is None:
        raise CheckpointError(f"{path}: expected a GPT-NeoX checkpoint, found none")
    _check_ranks(checkpoint, layout)
    reader = _Reader(checkpoint)
    if unknown := sorted(set(targets) - set(layout.sources)):
        raise CheckpointError(f"{path}: a GPT-NeoX checkpoint holds nothing for this model's {', '.join(unknown[:4])}")
    for key, target in targets.items():
        whole = neox_tensor(reader, key, layout)
        shape = tuple(shapes[key])
        _check_shape(checkpoint, key, tuple(whole.shape), shape, key in layout.vocab_padded_keys)
        whole = whole.reshape(shape) if whole.dim() == 0 else _fit_rows(whole, shape)
        whole = whole.to(target.dtype)
        box = box_of(target)
        if box is None:  # not one box: distribute the whole tensor and keep this rank's part
            local = distribute_tensor(
                whole.to(target.device), target.device_mesh, target.placements, src_data_rank=None
            ).to_local()
        else:
            offset, size = box
            local = whole[tuple(slice(start, start + length) for start, length in zip(offset, size, strict=True))]
        (target.to_local() if isinstance(target, DTensor) else target).copy_(local)


def _fit_rows(tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """`tensor` with as many rows as `shape`: padding rows dropped, or zero rows added."""
    rows = shape[0]
    if tensor.shape[0] >= rows:
        return tensor[:rows]
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])
