"""Saving and loading training state with torch.distributed.checkpoint (DCP).

Every rank writes its own shards (DTensor shards under tensor parallelism and ZeRO-1; one copy of
replicated values) into `<name>.partial`. When the save has finished on every rank, rank 0 writes
the completion marker and renames the directory to `<name>`, then applies retention — so a
checkpoint is deleted only after a newer one is complete, and a crash at any moment leaves every
complete checkpoint intact. DCP records global shapes, so a checkpoint loads at another layout.
"""

from __future__ import annotations

import shutil
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor

from .checksumming_writer import ChecksummingWriter
from .discovery import list_checkpoints
from .errors import CheckpointError, cause_of, gist, out_of_space
from .marker import CheckpointInfo, read_info, write_marker
from .retention import SavePolicy, checkpoint_name, point_last, to_delete
from .safe_read import SafeLoadPlanner, SafeReader, read_metadata

STAGING_SUFFIX = ".partial"
_SINGLE_PROCESS = ".*assuming the intent is to (save|load) in a single process"
REPLACED_SUFFIX = ".replaced"
LINEAGE = "lineage"
"""The marker's record (in `extra`) of the run, and the runs continuing it, that wrote a checkpoint."""


@dataclass
class _Save:
    staging: Path
    final: Path
    record: dict[str, Any]
    writer: ChecksummingWriter
    future: Future | None = None
    started: float = 0.0
    keep: bool = False
    state: Mapping[str, Any] | None = None
    """A background save's state (the live objects, no copy), sized only should the disk fill."""


class Checkpointer:
    """Writes checkpoints of `state` under `root` as `policy` names and keeps them; at most one save is
    in flight (`asynchronous`: DCP writes from a background thread after copying the state to host
    memory). Call it on every rank; `process_group` should be a gloo group of all ranks used for
    nothing else, so a background save never interleaves with training collectives.

    Retention weighs only the checkpoints of `lineage` (recorded in each marker: the run that wrote
    them and the runs that continued it), never `resumed_from`, nor a save asked to be kept; what
    other runs or the user put under `root` is never deleted or replaced."""

    def __init__(
        self,
        root: Path,
        policy: SavePolicy,
        *,
        asynchronous: bool = False,
        process_group: dist.ProcessGroup | None = None,
        on_complete: Callable[[CheckpointInfo, float], None] | None = None,
        attach: Callable[[Path], None] | None = None,
        lineage: str | None = None,
        resumed_from: Path | None = None,
    ):
        self.root, self.policy, self.asynchronous = Path(root), policy, asynchronous
        self.lineage = lineage or new_lineage()
        self.resumed_from = None if resumed_from is None else Path(resumed_from).resolve()
        self.attach = attach
        """Called on rank 0 with a save's folder once its shards are written, before the marker: files
        it writes there belong to the checkpoint."""
        self.group = process_group
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.on_complete = on_complete
        self._pending: _Save | None = None
        self.saved_at = time.monotonic()
        """When the last save started (train_time_interval counts from it)."""

    def save(
        self,
        state: dict[str, Any],
        *,
        step: int,
        consumed_samples: int,
        metrics: Mapping[str, float],
        extra: Mapping[str, Any] | None = None,
        keep: bool = False,
    ) -> Path:
        """Save `state` (nested dicts of tensors, DTensors, Stateful objects and picklable values) after
        optimizer step `step`; returns the checkpoint's final path. Returns once the state is copied
        (asynchronous) or written (otherwise). `keep`: retention leaves this one (a run's last step)."""
        self.wait()
        values = {"step": step, "consumed_samples": consumed_samples, **metrics}
        final = self.root / self._broadcast(self._next_name(values) if self.rank == 0 else None)
        staging = final.with_name(final.name + STAGING_SUFFIX)
        record = dict(
            step=step,
            consumed_samples=consumed_samples,
            metrics=dict(metrics),
            extra={**(extra or {}), LINEAGE: self.lineage},
        )
        # one thread: extra DCP writer threads drop their errors
        writer = ChecksummingWriter(staging, self.rank, sync_files=True)
        pending = _Save(staging, final, record, writer, started=time.monotonic(), keep=keep)
        self.saved_at = pending.started
        if not dist.is_initialized():
            warnings.filterwarnings("ignore", message=_SINGLE_PROCESS, category=UserWarning)
        try:
            if self.asynchronous:
                pending.state = state
                pending.future = dcp.async_save(
                    state, storage_writer=writer, process_group=self.group, no_dist=not dist.is_initialized()
                )
                self._pending = pending
                return final
            dcp.save(state, storage_writer=writer, process_group=self.group, no_dist=not dist.is_initialized())
        except (CheckpointException, OSError, ValueError, TypeError) as error:
            self._abandon(pending)
            why = _why_failed(error, self.root, _state_bytes(state))  # the space free without the abandoned part
            raise CheckpointError(f"{final}: the save failed: {why}") from error
        self._finish(pending)
        return final

    @property
    def in_flight(self) -> bool:
        """Whether a background save is still being written."""
        return self._pending is not None and self._pending.future is not None and not self._pending.future.done()

    def poll(self) -> None:
        """Finish a background save that has completed (marker, rename, retention); never blocks."""
        if self._pending is not None and self._pending.future is not None and self._pending.future.done():
            self.wait()

    def wait(self) -> None:
        """Block until the save in flight, if any, is complete (the next save and process exit call it)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending.future.result()
        except (CheckpointException, Exception) as error:
            self._abandon(pending)
            why = _why_failed(error, self.root, None if pending.state is None else _state_bytes(pending.state))
            raise CheckpointError(f"{pending.final}: the background save failed: {why}") from error
        self._finish(pending)

    def _ours(self, info: CheckpointInfo) -> bool:
        return info.complete and info.extra.get(LINEAGE) == self.lineage

    def _abandon(self, pending: _Save) -> None:
        """Remove what a failed save wrote (every rank has stopped writing: DCP fails on all of them)."""
        if self.rank == 0:
            shutil.rmtree(pending.staging, ignore_errors=True)

    def _next_name(self, values: dict[str, float]) -> str:
        """The template's name; without the version counter a name of this lineage is replaced, but one
        another run or the user made still gets a version."""
        self.root.mkdir(parents=True, exist_ok=True)
        taken = {path.name for path in self.root.iterdir()}
        name = checkpoint_name(self.policy.filename, values, taken, self.policy.enable_version_counter)
        if name in taken and not self._ours(read_info(self.root / name)):
            name = checkpoint_name(self.policy.filename, values, taken, True)
        staging = self.root / (name + STAGING_SUFFIX)
        if staging.exists():  # left by a save that never finished: not a checkpoint
            shutil.rmtree(staging)
        return name

    def _broadcast(self, name: str | None) -> str:
        """Rank 0's choice of name, on every rank (also keeps ranks from writing before the stale
        staging directory is gone)."""
        if not dist.is_initialized():
            return name
        box = [name]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0) if self.group else 0, group=self.group)
        return box[0]

    def _finish(self, pending: _Save) -> None:
        """On rank 0, once every rank's shards are written: the marker, the rename, retention."""
        if self.rank != 0:
            return
        if self.attach is not None:
            self.attach(pending.staging)
        write_marker(pending.staging, **pending.record, digests=pending.writer.digests)
        replaced = pending.final.with_name(pending.final.name + REPLACED_SUFFIX)
        if pending.final.exists():  # the same name again without the version counter
            pending.final.rename(replaced)
        pending.staging.rename(pending.final)
        shutil.rmtree(replaced, ignore_errors=True)
        info = read_info(pending.final)
        spared = {self.resumed_from, *([pending.final.resolve()] if pending.keep else [])}
        weighed = [i for i in list_checkpoints(self.root) if i.complete and self._ours(i)]
        for old in to_delete(weighed, self.policy):
            if old.path.resolve() not in spared:
                shutil.rmtree(old.path)
        if self.policy.save_last:
            point_last(self.root, pending.final)
        if self.on_complete is not None:
            self.on_complete(info, time.monotonic() - pending.started)


def new_lineage() -> str:
    """A fresh run's identity, recorded in its checkpoints' markers."""
    return uuid.uuid4().hex[:16]


def continued_lineage(root: Path, resumed: Path) -> str | None:
    """The lineage a run resumed from `resumed` and saving under `root` continues: the checkpoint's own
    when it is the newest of its lineage there (a continuation); None for a roll-back to an earlier
    one, a checkpoint from elsewhere or one that records none (a new lineage, which leaves the older
    checkpoints alone)."""
    info = read_info(Path(resumed))
    lineage = info.extra.get(LINEAGE)
    if lineage is None or Path(resumed).resolve().parent != Path(root).resolve():
        return None
    steps = [i.step or 0 for i in list_checkpoints(Path(root)) if i.complete and i.extra.get(LINEAGE) == lineage]
    return lineage if (info.step or 0) >= max(steps, default=0) else None


def _why_failed(error: BaseException, root: Path, needed: int | None) -> str:
    """Why a save failed: a full disk said as such (torch's writer reports it as a position mismatch in its
    zip container), with the space free and this rank's share of the state (`needed` bytes); else the error."""
    free = shutil.disk_usage(root).free
    full = out_of_space(error)
    if full is None and (needed is None or free >= needed):
        return gist(error)
    said = f"{full.strerror}; " if full is not None and full.strerror else ""
    share = "" if needed is None else f", this rank's share of the checkpoint needs about {needed / 2**20:,.1f} MiB"
    return (
        f"the disk is full ({said}{free / 2**20:,.1f} MiB free at {root}{share}); the earlier checkpoints are "
        "kept: expected room for one more checkpoint (free space, or keep fewer: save_top_k)"
    )


def _state_bytes(state: Mapping[str, Any]) -> int:
    return sum(_local_bytes(value) for value in _leaves(state).values())


def _local_bytes(value: Any) -> int:
    if isinstance(value, DTensor):
        value = value.to_local()
    return value.numel() * value.element_size() if torch.is_tensor(value) else 0


def _leaves(state: Mapping[str, Any]) -> dict[str, Any]:
    """DCP's flattened view of a nested state: dotted keys to leaves (Stateful objects expanded)."""
    expanded = {
        key: value.state_dict() if isinstance(value, Stateful) and not isinstance(value, Mapping) else value
        for key, value in state.items()
    }
    return flatten_state_dict(expanded)[0]


def saved_keys(path: Path) -> dict[str, tuple[int, ...] | None]:
    """Every key a checkpoint holds: a tensor's global shape, or None for another value."""
    metadata = read_metadata(path)
    return {
        key: tuple(item.size) if isinstance(item, TensorStorageMetadata) else None
        for key, item in metadata.state_dict_metadata.items()
    }


def check_compatible(path: Path, state: Mapping[str, Any]) -> None:
    """A CheckpointError naming the keys `state` needs that the checkpoint lacks or holds in another shape."""
    saved = saved_keys(path)
    missing, shapes = [], []
    for key, value in _leaves(state).items():
        if key not in saved:
            missing.append(key)
        elif torch.is_tensor(value) and saved[key] is not None and tuple(value.shape) != saved[key]:
            shapes.append(f"{key} is {list(saved[key])} there, {list(value.shape)} here")
    problems = []
    if shapes:
        problems.append(
            f"it was saved from another model shape: {'; '.join(shapes[:4])}"
            + (f" (and {len(shapes) - 4} more)" if len(shapes) > 4 else "")
        )
    if missing:
        problems.append(
            f"it lacks {', '.join(missing[:4])}" + (f" (and {len(missing) - 4} more)" if len(missing) > 4 else "")
        )
    if problems:
        raise CheckpointError(f"{path}: cannot load this checkpoint into this run: " + "; ".join(problems))


def load_checkpoint(
    path: Path, state: dict[str, Any], *, process_group: dist.ProcessGroup | None = None
) -> CheckpointInfo:
    """Load `state` in place (its keys only; tensors are resharded to this run's layout) from the
    complete checkpoint `path`; a half-written, damaged (sizes, and every file's digest, each rank
    reading its share of the files) or incompatible one is a CheckpointError, raised on every rank."""
    info = read_info(Path(path)).verified()
    _verify_contents(info, process_group)
    try:
        check_compatible(info.path, state)
        if not dist.is_initialized():
            warnings.filterwarnings("ignore", message=_SINGLE_PROCESS, category=UserWarning)
        dcp.load(
            state,
            storage_reader=SafeReader(info.path),
            planner=SafeLoadPlanner(source=info.path),
            process_group=process_group,
            no_dist=not dist.is_initialized(),
        )
    except CheckpointError:
        raise
    except (CheckpointException, Exception) as error:  # noqa: BLE001 - any unreadable piece is a message, never a traceback
        refused = cause_of(error)
        raise (CheckpointError(f"{info.path}: cannot be read: {gist(error)}") if refused is None else refused) from None
    return info


def _verify_contents(info: CheckpointInfo, process_group: dist.ProcessGroup | None) -> None:
    """Every file's digest against the marker, file i checked by rank i mod world; all ranks agree."""
    names = sorted(info.checksums)
    distributed = dist.is_initialized()
    rank, world = (dist.get_rank(process_group), dist.get_world_size(process_group)) if distributed else (0, 1)
    mine = CheckpointInfo(info.path, True, files={}, checksums={n: info.checksums[n] for n in names[rank::world]})
    problems = [mine.damage(contents=True)]
    if world > 1:
        gathered: list[str | None] = [None] * world
        dist.all_gather_object(gathered, problems[0], group=process_group)
        problems = gathered
    if found := [problem for problem in problems if problem]:
        raise CheckpointError(f"{info.path}: damaged checkpoint: {found[0]}")
