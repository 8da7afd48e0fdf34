"""nxd-ckpt: sharded checkpoints on torch.distributed.checkpoint that resume exactly and reshard across
layouts, with completion markers, retention, async save and Hugging Face safetensors export/import."""

from importlib import import_module
from importlib.metadata import version as _distribution_version
from typing import TYPE_CHECKING

from .discovery import is_checkpoint_dir, latest_checkpoint, list_checkpoints, newest_usable
from .errors import CheckpointError, CheckpointWarning
from .marker import MARKER, CheckpointInfo, read_info
from .retention import SavePolicy, template_fields
from .s3_upload import CheckpointUploader, S3Target

if TYPE_CHECKING:
    from .hf import LORA_RECORD, MODEL_KEY, HFExport, export_hf, write_adapter_files
    from .hf_import import check_hf_weights, load_hf_weights
    from .neox_import import check_neox_weights, find_neox_checkpoint, load_neox_weights, neox_iteration
    from .store import Checkpointer, continued_lineage, load_checkpoint, saved_keys
    from .trainer_layout import nxd_checkpoint_of, prune_trainer_checkpoints, write_final, write_trainer_checkpoint

_ON_DEMAND = {
    "hf": ("LORA_RECORD", "MODEL_KEY", "HFExport", "export_hf", "write_adapter_files"),
    "hf_import": ("check_hf_weights", "load_hf_weights"),
    "neox_import": ("check_neox_weights", "find_neox_checkpoint", "load_neox_weights", "neox_iteration"),
    "store": ("Checkpointer", "continued_lineage", "load_checkpoint", "saved_keys"),
    "trainer_layout": ("nxd_checkpoint_of", "prune_trainer_checkpoints", "write_final", "write_trainer_checkpoint"),
}
"""Names whose modules import torch.distributed.checkpoint or DTensor (and with them sympy): loaded when first used,
so that finding and reading checkpoints' markers (what a config check does) loads neither."""
_MODULE_OF = {name: module for module, names in _ON_DEMAND.items() for name in names}


def __getattr__(name: str) -> object:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_MODULE_OF[name]}", __name__), name)
    globals()[name] = value
    return value


__version__ = _distribution_version("nxd-ckpt")  # one source: the pyproject's version

__all__ = [
    "LORA_RECORD",
    "MARKER",
    "MODEL_KEY",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointWarning",
    "CheckpointUploader",
    "Checkpointer",
    "HFExport",
    "S3Target",
    "SavePolicy",
    "check_hf_weights",
    "check_neox_weights",
    "continued_lineage",
    "export_hf",
    "find_neox_checkpoint",
    "is_checkpoint_dir",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "load_hf_weights",
    "load_neox_weights",
    "neox_iteration",
    "newest_usable",
    "read_info",
    "nxd_checkpoint_of",
    "prune_trainer_checkpoints",
    "saved_keys",
    "template_fields",
    "write_adapter_files",
    "write_final",
    "write_trainer_checkpoint",
]
