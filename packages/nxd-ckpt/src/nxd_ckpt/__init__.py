"""nxd-ckpt: sharded checkpoints on torch.distributed.checkpoint that resume exactly and reshard across
layouts, with completion markers, retention, async save and Hugging Face safetensors export/import."""

from importlib.metadata import version as _distribution_version

from .discovery import is_checkpoint_dir, latest_checkpoint, list_checkpoints
from .errors import CheckpointError, CheckpointWarning
from .hf import LORA_RECORD, MODEL_KEY, HFExport, export_hf, write_adapter_files
from .hf_import import check_hf_weights, load_hf_weights
from .marker import MARKER, CheckpointInfo, read_info
from .neox_import import check_neox_weights, find_neox_checkpoint, load_neox_weights, neox_iteration
from .retention import SavePolicy, template_fields
from .s3_upload import CheckpointUploader, S3Target
from .store import Checkpointer, continued_lineage, load_checkpoint, saved_keys
from .trainer_layout import nxd_checkpoint_of, prune_trainer_checkpoints, write_final, write_trainer_checkpoint

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
    "read_info",
    "nxd_checkpoint_of",
    "prune_trainer_checkpoints",
    "saved_keys",
    "template_fields",
    "write_adapter_files",
    "write_final",
    "write_trainer_checkpoint",
]
