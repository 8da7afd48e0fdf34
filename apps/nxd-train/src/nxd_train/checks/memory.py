"""A run's memory plan before launch: `nxd-train plan`, and the check `nxd-train` makes at start.

The counting is nxd-parallel's `memory_plan` (shapes, layout, precision); this module wires a
RunPlan into it, finds the memory a rank has (given, a CUDA device's, or the host's shared by its
local ranks) and, when a layout does not fit, which single key changes would make it fit.
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch
from nxd_models import resident_memory
from nxd_parallel import GIB, LayerWidths, RankMemory, StateBytes, Workload, memory_plan, pipeline_ranges
from nxd_precision import bytes_per_value
from torch import nn

from nxd_train.checks.preflight import accelerator_name
from nxd_train.run.plan import RunPlan

LOSS_CHUNK = 1024
"""The loss chunk size a plan proposes (tokens)."""
COLUMNS = ("parameters", "gradients", "master_weights", "optimizer_state", "activations", "loss", "step", "runtime")
OFFLOADED = "offloaded"
"""The column of host memory CPU offload uses (not in the peak), shown when a plan offloads."""
HEADINGS = {OFFLOADED: "offloaded to host (not in peak)"}


def runtime_bytes(device: torch.device) -> int:
    """What a training process holds besides the plan's tensors: on the host, this process's resident
    memory now (the training stack is imported); on an accelerator nothing counts against it."""
    return resident_memory() if device.type == "cpu" else 0


def rank_memory(
    plan: RunPlan, *, runtime: int, loss_chunk_tokens: int | None = None, meta: nn.Module | None = None
) -> list[RankMemory]:
    """Each pipeline stage's per-rank memory for `plan` (with another loss chunk size when given), from
    `meta`, the family's meta build (made here when None). CPU offload moves the shards off an accelerator;
    on a CPU run they stay in the memory counted."""
    family, layout, launch, batches = plan.family, plan.layout, plan.launch, plan.batches
    sizes = launch.parallel
    dp = sizes.dp
    meta = family.build_on_meta() if meta is None else meta
    stages = pipeline_ranges(family, meta, layout, sizes.pp)
    update = plan.update
    state = StateBytes(**bytes_per_value(plan.policy, update.optimizer, update.options))
    work = Workload(
        micro_batch=batches.micro_batch_size,
        seq_length=plan.seq_length,
        microbatches=max(1, batches.global_batch_size // (batches.micro_batch_size * dp)),
        loss_chunk_tokens=loss_chunk_tokens or family.loss_chunk_tokens or 0,
    )
    return memory_plan(
        meta,
        family.tp_plan(),
        stages,
        LayerWidths(**family.layer_widths()),
        sizes=sizes,
        state=state,
        work=work,
        zero1=layout.zero1,
        zero3=layout.zero3,
        sequence_parallel=layout.sequence_parallel,
        kv_replicator=layout.kv_replicator,
        recompute=layout.recompute,
        recompute_modules=layout.recompute_modules,
        virtual_stages=layout.virtual_stages,
        runtime=runtime,
        cpu_offload=layout.cpu_offload and accelerator_name() != "cpu",
    )


def available_memory(plan: RunPlan, device: torch.device, given_gib: float | None = None) -> tuple[int, str]:
    """Bytes one rank may use, and where that figure comes from."""
    if given_gib is not None:
        return int(given_gib * GIB), "given"
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        return properties.total_memory, f"{properties.name}"
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    ranks = plan.launch.devices
    return total // ranks, f"host memory {total / GIB:.1f} GiB shared by {ranks} local rank{'s' * (ranks > 1)}"


def fitting_changes(plan: RunPlan, limit: int, *, runtime: int, meta: nn.Module) -> list[tuple[str, int]]:
    """Single key changes that bring the largest rank under `limit`: (the key and value, the new peak)."""
    layout, launch, batches = plan.layout, plan.launch, plan.batches
    sizes = launch.parallel
    dp = sizes.dp
    candidates: list[tuple[str, RunPlan, int | None]] = []
    if dp * sizes.cp > 1 and not layout.zero1:
        candidates.append(("distributed_strategy.zero1: True", replace(plan, layout=replace(layout, zero1=True)), None))
    if dp * sizes.cp > 1 and layout.zero1 and not layout.zero3:
        candidates.append(("distributed_strategy.zero3: True", replace(plan, layout=replace(layout, zero3=True)), None))
    if sizes.tp > 1 and not layout.sequence_parallel:
        candidates.append(
            (
                "distributed_strategy.sequence_parallel: True",
                replace(plan, layout=replace(layout, sequence_parallel=True)),
                None,
            )
        )
    if layout.recompute != "full":
        candidates.append(
            (
                "model.activations_checkpoint_granularity: full",
                replace(plan, layout=replace(layout, recompute="full")),
                None,
            )
        )
    if plan.family.loss_chunk_tokens == 0 and batches.micro_batch_size * plan.seq_length > LOSS_CHUNK:
        candidates.append((f"model.fusions.loss_chunk_tokens: {LOSS_CHUNK}", plan, LOSS_CHUNK))
    size = batches.micro_batch_size
    while size > 1:
        size //= 2
        candidates.append(
            (f"data.micro_batch_size: {size}", replace(plan, batches=replace(batches, micro_batch_size=size)), None)
        )
    fitting = []
    for change, changed, chunk in candidates:
        peak = max(rank.total for rank in rank_memory(changed, runtime=runtime, loss_chunk_tokens=chunk, meta=meta))
        if peak <= limit:
            fitting.append((change, peak))
            if change.startswith("data.micro_batch_size"):
                break  # the largest micro-batch that fits is the one to name
    return fitting


def memory_report(plan: RunPlan, given_gib: float | None = None) -> tuple[str, bool]:
    """The plan as a table of GiB per pipeline stage, the verdict and, when it does not fit, the changes
    that would; and whether it fits (on this machine's accelerator, or the host)."""
    device = torch.device(accelerator_name())
    runtime = runtime_bytes(device)
    meta = plan.family.build_on_meta()  # one meta build for the plan and every change it weighs
    ranks = rank_memory(plan, runtime=runtime, meta=meta)
    limit, source = available_memory(plan, device, given_gib)
    launch = plan.launch
    columns = COLUMNS + ((OFFLOADED,) if any(rank.offloaded for rank in ranks) else ())
    lines = [
        f"memory plan per rank: {launch.world_size} rank(s), tp {launch.parallel.tp}, pp {launch.parallel.pp}, "
        f"cp {launch.parallel.cp}; "
        f"precision {plan.policy.type}, optimizer {plan.update.optimizer}; micro-batch "
        f"{plan.batches.micro_batch_size} x {plan.seq_length} tokens",
        "| pipeline stage | "
        + " | ".join(HEADINGS.get(name, name.replace("_", " ")) for name in columns)
        + " | peak (GiB) |",
        "|---" * (len(columns) + 2) + "|",
    ]
    for rank in ranks:
        values = [getattr(rank, name) / GIB for name in columns]
        cells = " | ".join(f"{value:.2f}" for value in values)
        lines.append(f"| {rank.stage} | {cells} | {rank.total / GIB:.2f} |")
    peak = max(rank.total for rank in ranks)
    fits = peak <= limit
    verdict = "fits" if fits else "does not fit"
    lines.append(f"peak {peak / GIB:.2f} GiB per rank against {limit / GIB:.2f} GiB ({source}): {verdict}")
    if not fits:
        changes = fitting_changes(plan, limit, runtime=runtime, meta=meta)
        named = "; ".join(f"{change} ({value / GIB:.2f} GiB)" for change, value in changes)
        lines.append(
            f"would fit with: {named}"
            if changes
            else "no single change of zero1, sequence_parallel, full "
            "recompute, the loss chunk or the micro-batch makes it fit: use more tensor or pipeline-parallel "
            "ranks, or a smaller model"
        )
    return "\n".join(lines), fits


def memory_notice(plan: RunPlan) -> str | None:
    """What `nxd-train` says at start when the plan does not fit this machine (None when it fits)."""
    report, fits = memory_report(plan)
    if fits:
        return None
    verdict = report.splitlines()[-2:]
    return "memory plan: " + " ".join(verdict) + " (see `nxd-train plan CONFIG` for each part)"
