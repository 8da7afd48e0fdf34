"""nxd-parallel: device mesh, tensor/sequence parallel, GQA KV replication, ZeRO-1 on FSDP2,
activation checkpointing, sharded initialisation and global norms, on torch.distributed only."""

from torch.distributed.tensor.parallel import loss_parallel

from .activation_checkpointing import apply_activation_checkpointing, modules_of_classes
from .context_parallel import ring_attention, split_sequence, zigzag_indices
from .data_parallel import apply_data_parallel, set_gradient_sync
from .dims import ParallelDims, ParallelMesh
from .errors import ParallelConfigError
from .kv_replication import replicated_heads
from .loss import token_cross_entropy
from .materialise import load_whole_weights, materialise
from .norms import clip_gradients, global_norm
from .pipeline import build_schedule, rank_stages, stage_ranges
from .tensor_parallel import STYLES, apply_tensor_parallel, check_plan

__version__ = "0.1.0"

__all__ = [
    "ParallelConfigError", "ParallelDims", "ParallelMesh", "STYLES", "apply_activation_checkpointing",
    "apply_data_parallel", "apply_tensor_parallel", "build_schedule", "check_plan", "clip_gradients", "global_norm",
    "load_whole_weights", "loss_parallel", "materialise", "modules_of_classes", "rank_stages", "replicated_heads",
    "ring_attention", "set_gradient_sync", "split_sequence", "stage_ranges", "token_cross_entropy", "zigzag_indices",
]  # fmt: skip
