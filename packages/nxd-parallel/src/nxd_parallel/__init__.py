"""nxd-parallel: device mesh, tensor/sequence/pipeline/context/expert parallel, ZeRO-1 on FSDP2, activation
checkpointing, sharded initialisation, global norms, step executors and host memory reuse for CPU steps, on
torch.distributed only."""

from importlib.metadata import version as _distribution_version

from .context_parallel import ring_attention, split_sequence
from .dims import ParallelDims, ParallelMesh
from .errors import ParallelConfigError
from .executor import DirectExecutor, PipelineExecutor, build_executor
from .gradient_noise_scale import GradientNoiseScale
from .host_memory import keep_freed_host_memory
from .launch_world import LaunchWorld, LaunchWorldError, launch_world
from .memory_plan import GIB, LayerWidths, RankMemory, StateBytes, Workload, memory_plan
from .norms import clip_gradients, global_norm
from .parallelize import (
    Layout,
    StagedModel,
    build_parallel_model,
    modules_of,
    pipeline_ranges,
    recompute_units,
    tensor_parallel_problems,
)
from .rendezvous import client_store, init_world
from .stage_gathering import GatheredStages
from .tensor_statistics import tensor_norms, zero_percentages
from .tp_plans import check_plan

__version__ = _distribution_version("nxd-parallel")  # one source: the pyproject's version

__all__ = [
    "DirectExecutor",
    "GIB",
    "GatheredStages",
    "GradientNoiseScale",
    "LaunchWorld",
    "LaunchWorldError",
    "LayerWidths",
    "Layout",
    "ParallelConfigError",
    "ParallelDims",
    "ParallelMesh",
    "PipelineExecutor",
    "RankMemory",
    "StagedModel",
    "StateBytes",
    "Workload",
    "build_executor",
    "build_parallel_model",
    "check_plan",
    "client_store",
    "clip_gradients",
    "global_norm",
    "init_world",
    "keep_freed_host_memory",
    "launch_world",
    "memory_plan",
    "modules_of",
    "pipeline_ranges",
    "recompute_units",
    "ring_attention",
    "split_sequence",
    "tensor_norms",
    "tensor_parallel_problems",
    "zero_percentages",
]
