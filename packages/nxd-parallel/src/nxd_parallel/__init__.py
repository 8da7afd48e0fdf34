"""nxd-parallel: device mesh, tensor/sequence/pipeline/context/expert parallel, ZeRO-1 on FSDP2, activation
checkpointing, sharded initialisation, global norms, step executors and host memory reuse for CPU steps, on
torch.distributed only."""

from importlib.metadata import version as _distribution_version

from torch.distributed.tensor.parallel import loss_parallel

from .activation_checkpointing import apply_activation_checkpointing
from .compile import compile_blocks
from .context_parallel import ring_attention, split_sequence, zigzag_indices
from .data_parallel import apply_data_parallel, set_gradient_sync
from .dims import ParallelDims, ParallelMesh
from .errors import ParallelConfigError
from .executor import DirectExecutor, LossFunction, PipelineExecutor, Totals, build_executor
from .expert_parallel import ExpertDispatch, apply_expert_parallel, moe_modules
from .host_memory import keep_freed_host_memory
from .kv_replication import replicated_heads
from .launch_world import LaunchWorld, LaunchWorldError, launch_world
from .materialise import copy_part, materialise
from .memory_plan import GIB, LayerWidths, RankMemory, Sizes, StateBytes, Workload, memory_plan
from .norms import clip_gradients, global_norm
from .parallelize import (
    Layout,
    ShardableModel,
    StagedModel,
    build_parallel_model,
    modules_of,
    pipeline_ranges,
    recompute_units,
    tensor_parallel_problems,
)
from .pipeline import build_schedule, rank_stages, stage_ranges
from .rendezvous import client_store, init_world
from .tensor_parallel import STYLES, apply_tensor_parallel, check_plan, enter_sequence_parallel

__version__ = _distribution_version("nxd-parallel")  # one source: the pyproject's version

__all__ = [
    "DirectExecutor", "ExpertDispatch", "GIB", "LaunchWorld", "LaunchWorldError", "LayerWidths", "Layout",
    "LossFunction", "ParallelConfigError", "ParallelDims", "ParallelMesh", "PipelineExecutor", "RankMemory",
    "STYLES", "ShardableModel", "Sizes", "StagedModel", "StateBytes", "Totals", "Workload",
    "apply_activation_checkpointing", "apply_data_parallel", "apply_expert_parallel", "apply_tensor_parallel",
    "build_executor", "build_parallel_model", "build_schedule", "check_plan", "client_store", "clip_gradients",
    "compile_blocks", "copy_part", "enter_sequence_parallel", "global_norm", "init_world", "keep_freed_host_memory",
    "launch_world", "loss_parallel", "materialise", "memory_plan", "modules_of", "moe_modules", "pipeline_ranges",
    "rank_stages", "recompute_units", "replicated_heads", "ring_attention", "set_gradient_sync", "split_sequence",
    "stage_ranges", "tensor_parallel_problems", "zigzag_indices"
]  # fmt: skip
