"""`nxd-train plot RUN_DIR [RUN_DIR ...] [-o FILE.png]`: a picture of one or several runs from their metrics.csv.

One panel per quantity against the optimizer step: the loss (validation loss beside it, dashed), the learning
rate, tokens per second, and each reward, accuracy or margin column a fine-tuning run logs (DPO's
rewards/chosen, a reward model's accuracy ...). Runs are overlaid, each in its own colour, named by their
folder. A run still going has a metrics.csv whose last line may be half written: complete rows are drawn, the
rest is said in one line. Matplotlib draws it (the nxd-train[plot] extra), with its file backend, so no display
is needed.
"""

from __future__ import annotations

import csv
import io
import math
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

PANELS = (("loss", ("loss", "val_loss")), ("learning rate", ("lr",)), ("tokens/s", ("tokens_per_s",)))
"""(title, columns): the panels every training run can fill, in order."""
EXTRA_WORDS = ("reward", "accuracy", "margin")
"""A column naming one of these (rewards/chosen, val_accuracy, rewards/margins ...) gets a panel of its own."""


class PlotError(Exception):
    """Input the plot cannot be drawn from (one line)."""


@dataclass
class Run:
    """A run's logged values: column -> (steps, values), rows with a value in that column only."""

    name: str
    series: dict[str, tuple[list[int], list[float]]]


def read_run(folder: Path, notes: list[str]) -> Run | None:
    """The run logged in `folder`'s metrics.csv; a line that cannot be read (a row still being written, a value
    that is no number) is left out with a note in `notes`. None, with a note, when no row has a step."""
    path = folder / "metrics.csv"
    try:
        exists = path.is_file()
    except OSError as error:
        raise PlotError(f"{folder}: cannot be read ({error.strerror})") from None
    if not exists:
        versions = sorted(p.parent.name for p in folder.glob("version_*/metrics.csv"))
        hint = f" (its runs: {', '.join(versions)})" if versions else ""
        raise PlotError(
            f"{folder}: no metrics.csv; expected a run's log directory, such as nxd_logs/NAME/version_N{hint}"
        )
    try:
        text = path.read_text()
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise PlotError(f"{path}: cannot be read as CSV ({error})") from None
    # a last line without its newline is still being written (its last value may be cut short): left out
    cut = len(rows) if text.endswith("\n") else len(rows) - 1
    if not rows or "step" not in rows[0]:
        notes.append(f"{path}: no rows yet{' (expected a header with a step column)' if rows else ''}; left out")
        return None
    header, series = rows[0], {}
    left_out = []
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != len(header) or number > cut:
            left_out.append(number)
            continue
        values = dict(zip(header, row, strict=True))
        try:
            step = int(float(values.pop("step")))
            parsed = {name: float(value) for name, value in values.items() if value != ""}
        except (ValueError, OverflowError):
            left_out.append(number)
            continue
        for name, value in parsed.items():
            if math.isfinite(value):
                steps, column = series.setdefault(name, ([], []))
                steps.append(step)
                column.append(value)
    if left_out:
        notes.append(
            f"{path}: line{'s' if len(left_out) > 1 else ''} {', '.join(map(str, left_out))} incomplete "
            "or not numbers (a run still writing it?); left out"
        )
    if not series:
        if not left_out:  # otherwise the note above said why
            notes.append(f"{path}: no complete row yet; left out")
        return None
    return Run(_name(folder), series)


def _name(folder: Path) -> str:
    """`tiny_llama/version_3` for a versioned log directory, else the folder's own name."""
    folder = folder.resolve()
    return f"{folder.parent.name}/{folder.name}" if folder.name.startswith("version_") else folder.name


def panels(runs: list[Run]) -> list[tuple[str, tuple[str, ...]]]:
    """The panels the runs can fill: the standard ones any run has a column of, then one per extra column."""
    columns = {name for run in runs for name in run.series}
    chosen = [(title, names) for title, names in PANELS if columns & set(names)]
    extra = sorted(name for name in columns if any(word in name for word in EXTRA_WORDS))
    return chosen + [(name, (name,)) for name in extra]


def missing_columns(runs: list[Run], chosen: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    """One line per run that has none of a panel's columns (runs with different columns)."""
    lines = []
    for run in runs:
        lacking = [title for title, names in chosen if not set(names) & set(run.series)]
        if lacking and len(runs) > 1:
            lines.append(f"{run.name}: no {', '.join(lacking)} column(s); those panels show the other runs")
    return lines


def draw(runs: list[Run], out: Path) -> None:
    """The runs' panels as one PNG at `out`, written under a temporary name and linked to `out` when complete (a
    link fails where a file exists, so none is written over, even one made meanwhile)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    chosen = panels(runs)
    columns = 2 if len(chosen) > 1 else 1
    rows = math.ceil(len(chosen) / columns)
    figure, axes = pyplot.subplots(rows, columns, figsize=(6.4 * columns, 3.6 * rows), squeeze=False)
    colours = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
    for axis, (title, names) in zip(axes.flat, chosen, strict=False):
        for index, run in enumerate(runs):
            for name in names:
                if name in run.series:
                    steps, values = run.series[name]
                    label = run.name if name == names[0] else f"{run.name} ({name})"
                    axis.plot(
                        steps,
                        values,
                        color=colours[index % len(colours)],
                        label=label,
                        linestyle="-" if name == names[0] else "--",
                        marker="." if len(steps) < 30 else None,
                    )
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
        if title == "learning rate":
            axis.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        axis.legend(fontsize="small")
    for axis in list(axes.flat)[len(chosen) :]:
        axis.set_visible(False)
    figure.tight_layout()
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=110)
    pyplot.close(figure)
    partial = out.with_name(f".{out.name}.{secrets.token_hex(6)}")
    try:
        partial.write_bytes(image.getvalue())
        os.link(partial, out)
    finally:
        partial.unlink(missing_ok=True)


def plot_command(folders: list[Path], out: Path) -> int:
    """Draw the runs in `folders` into `out` (never over a file that exists); one line for each problem."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("nxd-train plot: needs matplotlib; install it with pip install 'nxd-train[plot]'", file=sys.stderr)
        return 1
    if out.exists():
        print(f"nxd-train plot: {out} exists; expected a new file name (-o FILE.png)", file=sys.stderr)
        return 1
    if out.suffix.lower() != ".png":
        print(f"nxd-train plot: -o {out}: expected a .png file", file=sys.stderr)
        return 1
    if not out.parent.is_dir():
        print(f"nxd-train plot: -o {out}: no folder {out.parent}", file=sys.stderr)
        return 1
    notes: list[str] = []
    try:
        runs = [run for folder in folders if (run := read_run(folder, notes)) is not None]
    except PlotError as error:
        print(f"nxd-train plot: {error}", file=sys.stderr)
        return 1
    notes += missing_columns(runs, panels(runs))
    for note in notes:
        print(f"nxd-train plot: {note}", file=sys.stderr)
    if not runs:
        print("nxd-train plot: no run has a complete row to draw", file=sys.stderr)
        return 1
    if not panels(runs):
        print(
            f"nxd-train plot: no column to draw; expected loss, val_loss, lr, tokens_per_s or a reward, accuracy "
            f"or margin column, found {', '.join(sorted({name for run in runs for name in run.series}))}",
            file=sys.stderr,
        )
        return 1
    try:
        draw(runs, out)
    except FileExistsError:
        print(f"nxd-train plot: {out} exists; expected a new file name (-o FILE.png)", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"nxd-train plot: {out}: cannot be written ({error.strerror})", file=sys.stderr)
        return 1
    print(f"nxd-train plot: {len(runs)} run(s) drawn in {out}")
    return 0
