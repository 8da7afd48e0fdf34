"""exp_manager: the profiler and checkpoints."""

from __future__ import annotations

from collections.abc import Iterator

from ..schema import NxdConfig
from .findings import PP, TP, Finding, error


def profiler_memory_dir_needs_memory(c: NxdConfig) -> Iterator[Finding]:
    p, path = c.exp_manager.profiler, "exp_manager.profiler.memory_dir"
    if p.memory_dir is not None and not p.memory:
        yield error(
            path,
            "names where memory records go; expected exp_manager.profiler.memory True with it, found False",
            path,
            "exp_manager.profiler.memory",
        )


def checkpoints_ranked_by_a_loss_keep_the_lowest(c: NxdConfig) -> Iterator[Finding]:
    params, path = c.exp_manager.checkpoint_callback_params, "exp_manager.checkpoint_callback_params"
    if params.mode == "max" and params.monitor.endswith("loss") and params.save_top_k > 0:
        yield error(
            f"{path}.mode",
            f"expected min (or null) with monitor {params.monitor!r}: max keeps the "
            f"{params.save_top_k} worst checkpoints and deletes the better ones, found max",
            f"{path}.mode",
            f"{path}.monitor",
        )


def checkpoint_model_parallel_size(c: NxdConfig) -> Iterator[Finding]:
    given = c.exp_manager.checkpoint_callback_params.model_parallel_size
    ds = c.distributed_strategy
    derived = ds.tensor_model_parallel_size * ds.pipeline_model_parallel_size
    if given is not None and given != derived:
        path = "exp_manager.checkpoint_callback_params.model_parallel_size"
        yield error(path, f"expected tensor * pipeline parallel sizes ({derived}), found {given}", path, TP, PP)
