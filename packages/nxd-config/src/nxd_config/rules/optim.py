"""The update: an optimizer, its schedule, an end to training, and the precision keys it steps with."""

from __future__ import annotations

from collections.abc import Iterator

from ..schema import NxdConfig
from ..schema.precision import LOSS_SCALING, MANUAL_KNOBS
from .findings import TP, Finding, error, notice


def optimizer_required(c: NxdConfig) -> Iterator[Finding]:
    if c.model.optim is None:
        yield error("model.optim", "expected an optimizer such as {name: adamw, lr: 3.0e-4}, found nothing")


def deepspeed_schedule_needs_a_rate(c: NxdConfig) -> Iterator[Finding]:
    optim = c.model.optim
    sched = None if optim is None else optim.sched
    if sched is not None and sched.name == "DeepSpeedSchedule" and sched.type != "WarmupCosineLR" and optim.lr == 0:
        yield error(
            "model.optim.lr",
            f"{sched.type} sets its rates as multiples of this one; expected more than 0, found 0",
            "model.optim.lr",
            "model.optim.sched",
        )


def one_cycle_stairs_are_not_read(c: NxdConfig) -> Iterator[Finding]:
    sched = None if c.model.optim is None else c.model.optim.sched
    if sched is None or sched.name != "DeepSpeedSchedule":
        return
    for name in ("cycle_first_stair_count", "cycle_second_stair_count"):
        if sched.is_set(name):
            path = f"model.optim.sched.{name}"
            yield notice(
                path,
                "accepted, changes nothing: DeepSpeed's OneCycle never reads it, so its cycle (and "
                "nxd's) is continuous",
                path,
            )


def training_has_an_end(c: NxdConfig) -> Iterator[Finding]:
    if c.trainer.max_steps <= 0 and c.trainer.max_epochs <= 0:
        yield error(
            "trainer.max_steps",
            f"expected trainer.max_steps or trainer.max_epochs to be positive, found "
            f"{c.trainer.max_steps} and {c.trainer.max_epochs} (training would never end)",
            "trainer.max_steps",
            "trainer.max_epochs",
        )


def manual_knobs_need_manual(c: NxdConfig) -> Iterator[Finding]:
    p = c.precision
    if p.type == "manual":
        return
    for name, default in MANUAL_KNOBS.items():
        if getattr(p, name) != default:
            yield notice(
                f"precision.{name}",
                f"ignored: only read when precision.type is 'manual', found type {p.type!r} (which sets this itself)",
                f"precision.{name}",
                "precision.type",
            )


def loss_scaling_needs_fp16(c: NxdConfig) -> Iterator[Finding]:
    p = c.precision
    if p.type in ("fp16", "fp16_autocast"):
        return
    for name, default in LOSS_SCALING.items():
        if getattr(p, name) != default:
            yield error(
                f"precision.{name}",
                f"expected precision.type fp16 or fp16_autocast with loss scaling (it "
                f"scales fp16 "
                f"gradients), found type {p.type!r}",
                f"precision.{name}",
                "precision.type",
            )


def float8_all_gather(c: NxdConfig) -> Iterator[Finding]:
    fp8, key = c.precision.fp8, "precision.fp8.all_gather"
    if fp8 is None or not fp8.all_gather:
        return
    if not c.distributed_strategy.zero1:
        yield error(
            key,
            "weights are gathered only where ZeRO shards them (replicated data parallelism keeps them "
            "whole); expected distributed_strategy.zero1 True with it, found False",
            key,
            "distributed_strategy.zero1",
        )
    if (tp := c.distributed_strategy.tensor_model_parallel_size) > 1:
        yield error(
            key,
            f"with tensor parallelism torchao scales each rank's part of a weight by that part's own "
            f"maximum (the gather reduces it over the data-parallel ranks only), so the layers would compute "
            f"on other float8 weights than in one process; expected {TP} 1 with it, found {tp}",
            key,
            TP,
        )
    if fp8.recipe != "tensorwise":
        yield error(
            key,
            f"torchao gathers float8 weights for tensorwise scaling only; expected precision.fp8.recipe "
            f"tensorwise with it, found {fp8.recipe}",
            key,
            "precision.fp8.recipe",
        )
