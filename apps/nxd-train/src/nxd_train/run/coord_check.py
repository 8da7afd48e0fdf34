"""model.mup.coord_check: mup's coordinate check of the planned model (nxd-models' `coordinate_sizes`), with muP and
with the standard parametrisation, written as coord_check_up and coord_check_sp (.csv, and .png plots where
matplotlib is installed) in a folder, as GPT-NeoX writes its plots; nothing is written over."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from nxd_data import save_atomically
from nxd_models import COORD_STEPS, IGNORE_INDEX, build_causal_lm, coordinate_sizes, model_family, neox_widths, widened
from nxd_precision import build_optimizer
from torch import nn

from nxd_train.run.plan import RunPlan

PARAMETRISATIONS = ("up", "sp")
"""muP's and the standard parametrisation's records, under GPT-NeoX's file names."""


def coordinate_check(plan: RunPlan, widths: list[int] | None, folder: Path, device: torch.device) -> list[Path]:
    """Run the check on `device`, on the first COORD_STEPS micro-batches of the training data (repeated when it holds
    fewer), at `widths` (None: GPT-NeoX's), and write its files into `folder`; the paths written."""
    spec, data, update = plan.family.spec, plan.data, plan.update
    targets = [folder / f"coord_check_{label}.{kind}" for label in PARAMETRISATIONS for kind in ("csv", "png")]
    if present := [str(path) for path in targets if path.exists()]:
        raise FileExistsError(
            f"model.mup.coord_check: {', '.join(present)} already there; expected none, so that "
            "nothing is written over: move them or run from another folder"
        )
    micro = plan.batches.micro_batch_size
    collate = data.collate(None)
    batches = [
        {
            key: value.to(device)
            for key, value in collate(
                [data.train[index % len(data.train)] for index in range(step * micro, (step + 1) * micro)]
            ).items()
        }
        for step in range(COORD_STEPS)
    ]  # a short run's samples repeat
    widths = widths or neox_widths(spec.num_attention_heads)

    def optimizer(model: nn.Module) -> torch.optim.Optimizer:
        names = [name for name, p in model.named_parameters() if p.requires_grad]
        return build_optimizer(
            update.optimizer,
            model.parameters(),
            update.options,
            decay_norms_and_biases=update.decay_norms_and_biases,
            scales=model_family(model.config).optimizer_scales(names, update.optimizer),
        )

    written = []
    for label, mup in zip(PARAMETRISATIONS, (spec.mup, None), strict=True):

        def build(width: int, mup: Any = mup) -> nn.Module:
            return build_causal_lm(
                widened(replace(spec, mup=mup), width), device, seed=plan.launch.seed, attention=plan.family.attention
            )

        records = coordinate_sizes(build, widths, batches, _mean_loss, optimizer)
        written += _write(records, folder / f"coord_check_{label}", "muP" if mup else "standard parametrisation")
    return written


def _mean_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    losses = model(batch["input_ids"], batch.get("position_ids"), batch.get("document_ids"), labels=batch["labels"])
    return losses.sum() / (batch["labels"] != IGNORE_INDEX).sum()


def _write(records: list[dict[str, Any]], stem: Path, title: str) -> list[Path]:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=["width", "module", "t", "l1"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    save_atomically(stem.with_suffix(".csv"), text.getvalue().encode())
    written = [stem.with_suffix(".csv")]
    if (plot := _plot(records, title)) is not None:
        save_atomically(stem.with_suffix(".png"), plot)
        written.append(stem.with_suffix(".png"))
    return written


def _plot(records: list[dict[str, Any]], title: str) -> bytes | None:
    """mup's plot_coord_data: per step, each module's l1 against the width, log-log; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        return None
    steps = sorted({row["t"] for row in records})
    figure, axes = pyplot.subplots(1, len(steps), figsize=(5 * len(steps), 4), squeeze=False)
    for axis, step in zip(axes[0], steps, strict=True):
        lines: dict[str, list[tuple[int, float]]] = {}
        for row in records:
            if row["t"] == step:
                lines.setdefault(row["module"], []).append((row["width"], row["l1"]))
        for points in lines.values():
            axis.plot(*zip(*sorted(points), strict=True), marker="o", linewidth=0.8)
        axis.set(xlabel="width", ylabel="l1", title=f"t={step}")
        axis.set_xscale("log", base=2)
        axis.set_yscale("log", base=2)
    figure.suptitle(f"coordinate check: {title}")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80)
    pyplot.close(figure)
    return buffer.getvalue()
