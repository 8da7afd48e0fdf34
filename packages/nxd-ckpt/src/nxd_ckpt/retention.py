"""When to save, what to call a checkpoint and which ones to keep: Lightning's ModelCheckpoint rules
(every_n_train_steps, train_time_interval, save_top_k by monitor/mode, save_last, the filename
template, the version counter) as plain functions of the values logged so far."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from .marker import CheckpointInfo

_FIELD = re.compile(r"\{([A-Za-z_][\w/.-]*)(:[^}]*)?\}")
LAST_LINK = "last"


@dataclass(frozen=True)
class SavePolicy:
    every_n_train_steps: int | None = None
    save_at_steps: tuple[int, ...] = ()
    """Steps (1-based) that end with a save whatever the intervals say."""
    train_time_interval: float | None = None
    """Seconds of training between saves."""
    save_top_k: int = 1
    monitor: str = "step"
    mode: str = "max"
    save_last: bool = False
    filename: str = "checkpoint--{step}-{consumed_samples}"
    enable_version_counter: bool = True

    @property
    def keeps_any(self) -> bool:
        return self.save_top_k != 0 or self.save_last

    def due(self, step: int, seconds_since_save: float) -> bool:
        """Whether optimizer step `step` (1-based) ends with a save."""
        if not self.keeps_any:
            return False
        if self.every_n_train_steps and step % self.every_n_train_steps == 0 or step in self.save_at_steps:
            return True
        return self.train_time_interval is not None and seconds_since_save >= self.train_time_interval

    @property
    def on_epoch_end(self) -> bool:
        """Lightning's default cadence: with no step or time interval, save at the end of each epoch."""
        return (
            self.keeps_any
            and not self.every_n_train_steps
            and not self.save_at_steps
            and self.train_time_interval is None
        )


def template_fields(template: str) -> list[str]:
    """The value names a filename template refers to."""
    return [match.group(1) for match in _FIELD.finditer(template)]


def checkpoint_name(template: str, values: dict[str, float], taken: set[str], version_counter: bool) -> str:
    """Lightning's format_checkpoint_name: '{step}' becomes 'step=12', a format spec applies to the
    value ('{loss:.2f}'), a value not logged yet is 0; with the version counter a taken name gets
    -v1, -v2 ..."""

    def fill(match: re.Match[str]) -> str:
        name, spec = match.group(1), match.group(2) or ""
        value = values.get(name, 0)
        return f"{name}={format(value, spec[1:]) if spec else value}"

    base = _FIELD.sub(fill, template).replace("/", "_")
    if not version_counter:
        return base
    name, version = base, 0
    while name in taken:
        version += 1
        name = f"{base}-v{version}"
    return name


def to_delete(complete: list[CheckpointInfo], policy: SavePolicy) -> list[CheckpointInfo]:
    """The complete checkpoints outside the best `save_top_k` by `monitor` (a missing or NaN value
    ranks last), sparing the newest when `save_last`. -1 keeps all."""
    if policy.save_top_k < 0 or not complete:
        return []
    worst = math.inf if policy.mode == "min" else -math.inf

    def score(info: CheckpointInfo) -> float:
        value = {"step": info.step, "consumed_samples": info.consumed_samples, **info.metrics}.get(policy.monitor)
        return worst if value is None or math.isnan(value) else float(value)

    newest_first = sorted(complete, key=lambda i: (i.step or 0, i.path.stat().st_mtime), reverse=True)
    ranked = sorted(newest_first, key=score, reverse=policy.mode == "max")  # stable: ties keep the newer
    keep = {info.path for info in ranked[: policy.save_top_k]}
    if policy.save_last:
        keep.add(newest_first[0].path)
    return [info for info in complete if info.path not in keep]


def point_last(root: Path, target: Path) -> None:
    """Make `root/last` a relative link to `target`, replacing an older link atomically."""
    temporary = root / f".{LAST_LINK}.{target.name}"
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(target.name, target_is_directory=True)
    temporary.replace(root / LAST_LINK)
