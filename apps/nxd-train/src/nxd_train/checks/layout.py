"""Whether a model family fits the layout a config asks for, checked on a meta-device build before
any process starts: the sizes tensor parallelism splits, the TP plan, the recompute names, the
pipeline stages and the context-parallel attention."""

from __future__ import annotations

from nxd_models import ModelConfigError, ModelFamily
from nxd_parallel import (
    Layout,
    ParallelConfigError,
    check_plan,
    pipeline_ranges,
    recompute_units,
    tensor_parallel_problems,
)


def layout_problems(family: ModelFamily, layout: Layout, tp: int, pp: int = 1, cp: int = 1) -> list[str]:
    """What would stop the model from being sharded over `tp` ranks, cut into `pp` x virtual pipeline
    stages, split over `cp` context ranks or recomputed as `layout` says."""
    problems = tensor_parallel_problems(family.sharded_sizes(), family.source_key, tp, layout.kv_replicator)
    model = family.build_on_meta()
    problems += check_plan(model, family.tp_plan())
    try:
        recompute_units(family, model, layout)
    except ModelConfigError as error:
        problems += error.problems
    if pp > 1:
        stage_problems = family.pipeline_stage_problems(model)
        problems += stage_problems
        try:
            if not stage_problems:  # the stage counts matter only for a model that can be cut
                pipeline_ranges(family, model, layout, pp)
        except ParallelConfigError as error:
            problems += error.problems
    if cp > 1:
        try:
            family.use_context_parallel(model, lambda *_: None)  # last: it points the attention elsewhere
        except ModelConfigError as error:
            problems += error.problems
    return problems
