"""Reading a checkpoint someone else made without running its code.

A DCP checkpoint is pickle twice over: its `.metadata` file, and every non-tensor value of the state
(a step, an optimizer's hyperparameters, nxd's random states), which torch's default planner reads back
with `torch.load(weights_only=False)`. A crafted file can run anything at either place, and re-sealing
the marker's digests is within a sender's reach, so digests cannot stand in for this. Here the metadata
is unpickled admitting only the exact classes DCP's metadata holds, and the values with torch's
weights-only loader; anything else is a CheckpointError naming the file and what it asked for.
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from .errors import CheckpointError

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
METADATA_CLASSES = frozenset(
    {
        (_DCP_METADATA, name)
        for name in (
            "Metadata",
            "ChunkStorageMetadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "TensorProperties",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        )
    }
    | {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("collections", "OrderedDict"),
    }
    | {
        (module, name)
        for module in ("pathlib", "pathlib._local")
        for name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")
    }
    | {("torch", name) for name, value in vars(torch).items() if isinstance(value, torch.dtype)}
)
"""(module, name) of every global a DCP `.metadata` file may name: DCP's own records, shapes and dtypes."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in METADATA_CLASSES:
            raise CheckpointError(
                f"{self.path}: asks to load the Python object {module}.{name}, which DCP's metadata "
                "never holds; a crafted or foreign file is not read (it could run code)"
            )
        return super().find_class(module, name)


def read_metadata(path: Path) -> Metadata:
    """The `.metadata` of the DCP checkpoint in `path`, unpickled admitting DCP's own classes only."""
    return SafeReader(path).read_metadata()


class SafeReader(FileSystemReader):
    """torch's FileSystemReader, but its metadata is read by the restricted unpickler."""

    def __init__(self, path: str | Path):
        super().__init__(str(path))

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self._get_metadata_path(kwargs.get("rank")))
        try:
            with self.fs.create_stream(path, "rb") as file:
                metadata = _MetadataUnpickler(file, path).load()
        except (CheckpointError, FileNotFoundError):  # DCP looks for the ranks' own metadata files next
            raise
        except Exception as error:  # noqa: BLE001 - a damaged file, whatever the unpickler raises
            raise CheckpointError(f"{path}: not a checkpoint's metadata ({type(error).__name__}: {error})") from None
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path}: expected DCP's Metadata, found a {type(metadata).__name__}")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _WeightsOnlyValues:
    """A load planner's non-tensor values read by torch's weights-only loader (ints, floats, strings,
    bytes, lists, tuples, dicts and tensors; never an arbitrary object) from the checkpoint `source`."""

    def __init__(self, *args: Any, source: Path, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.source = source

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            loaded = torch.load(value, weights_only=True)
        except Exception as error:  # noqa: BLE001 - UnpicklingError for a foreign object, others for damage
            raise CheckpointError(
                f"{self.source}: its value {fqn} is not plain data torch's weights-only loader reads "
                f"({_refused(error)}); a crafted or foreign file is not read"
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


class SafeLoadPlanner(_WeightsOnlyValues, DefaultLoadPlanner):
    """DCP's default load planner with weights-only values."""


class SafeKeysLoadPlanner(_WeightsOnlyValues, _EmptyStateDictLoadPlanner):
    """DCP's planner that loads `keys` into an empty state (as its format tools do), weights-only values."""


def _refused(error: BaseException) -> str:
    """What torch's weights-only loader refused, without its advice to load the file unsafely."""
    if found := re.search(r"Unsupported global: GLOBAL (\S+)", str(error)):
        return f"it names the Python object {found.group(1)}"
    return type(error).__name__
