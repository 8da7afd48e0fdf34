"""The run's log directory: exp_manager.explicit_log_dir as is, else <exp_dir>/<name>/version_N, held by
one run at a time."""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import os
import re
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from nxd_ckpt import list_checkpoints
from nxd_data import save_atomically

if TYPE_CHECKING:
    from lightning_fabric import Fabric

DEFAULT_EXP_DIR = "nxd_logs"
CHECKPOINT_DIR = "checkpoints"
"""Checkpoints live in <log dir>/checkpoints."""
LOCK_FILE = ".nxd-run.lock"
"""The advisory lock a running run holds in its log directory (the file stays; the lock goes with the process)."""
LAUNCH_FILE = ".nxd-launch"
"""The launcher job (torchrun's run id, Slurm's job id) a versioned log directory belongs to, so that a round the
launcher restarts finds it."""
NAME_ROOM = 64
"""Characters a checkpoint's folder name adds to the run's name (--step=N-consumed_samples=M.partial)."""
COMPLETIONS_FILE = "completions.jsonl"
"""Where an online-RL run writes a few sampled completions and their rewards at each logging step."""
WRITTEN = (
    "config.yaml",
    "metrics.csv",
    "hparams.yaml",
    CHECKPOINT_DIR,
    "wandb_run_id",
    "comet_experiment_key",
    LAUNCH_FILE,
    "nxd_log_globalrank-*_localrank-*.txt",
    "reference_log_probs.safetensors",
    "trainer_state.json",
    "config.json",
    "model.safetensors",
    "adapter_config.json",
    "adapter_model.safetensors",
    COMPLETIONS_FILE,
)
"""Files a run writes in its log directory (with the json_log_file it is given): names another's folder must
not hold, and that must not be links. Trainer-style checkpoint-N folders are not among them: a name another
holds gets a version (nxd-ckpt's trainer_layout)."""
SHARED = ("tensorboard", "wandb", "comet")
"""Folders a run adds uniquely named files to, as other tools do (GPT-NeoX's tensorboard_dir may be one):
never refused as another's, but never links either."""


class LogDirError(Exception):
    """The log directory cannot be this run's: another run holds it, or it cannot be written."""


def optional_path(value: str | None) -> Path | None:
    """A config's folder key as a path (None stays None)."""
    return None if value is None else Path(value)


def _versions(exp_dir: Path | None, name: str) -> tuple[Path, list[int]]:
    base = Path(exp_dir or DEFAULT_EXP_DIR) / name
    found = [int(m.group(1)) for p in base.glob("version_*") if (m := re.fullmatch(r"version_(\d+)", p.name))]
    return base, sorted(found)


def resumable_log_dir(explicit_log_dir: Path | None, exp_dir: Path | None, name: str) -> Path:
    """Where resume_if_exists looks: explicit_log_dir, else the newest version holding a complete checkpoint
    (the newest version when none does)."""
    if explicit_log_dir:
        return Path(explicit_log_dir).resolve()
    base, versions = _versions(exp_dir, name)
    for version in reversed(versions):
        path = base / f"version_{version}"
        if any(info.complete for info in list_checkpoints(path / CHECKPOINT_DIR)):
            return path.resolve()
    return (base / f"version_{versions[-1] if versions else 0}").resolve()


def launched_log_dir(exp_dir: Path | None, name: str, job: str) -> Path | None:
    """The newest version under <exp_dir>/<name> that launcher job `job` took, or None."""
    base, versions = _versions(exp_dir, name)
    for version in reversed(versions):
        path = base / f"version_{version}"
        try:
            if (path / LAUNCH_FILE).read_text().strip() == job:
                return path.resolve()
        except OSError:
            continue
    return None


def record_launch(path: Path, job: str) -> None:
    """Record in log directory `path` the launcher job that holds it (replaced whole, never half written)."""
    save_atomically(path / LAUNCH_FILE, (job + "\n").encode())  # never through a link: it is renamed over


def disk_full(error: OSError, near: Path) -> str:
    """One line for a write that found the disk full: which file, the space left where it was written."""
    where = Path(error.filename) if error.filename else Path(near)
    existing = where if where.exists() else next((p for p in where.parents if p.exists()), Path("/"))
    free = shutil.disk_usage(existing).free
    return (
        f"{where}: the disk is full ({free / 2**20:,.1f} MiB free there, {error.strerror or error}); expected "
        "room for the run's logs and checkpoints: free space or give exp_manager.explicit_log_dir elsewhere; "
        "the checkpoints already complete are kept"
    )


class LogDirLock:
    """An exclusive advisory lock (flock) on the log directory's lock file, held while the process lives:
    the operating system releases it when the process ends, however it ends, so a crash never leaves a
    directory held. The file records the holder's pid and host for the refusal another run prints."""

    def __init__(self, directory: Path | None):
        self.directory = directory
        self._file = None

    def acquire(self) -> bool:
        """Take the lock; False when another process holds it."""
        descriptor = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o666)
        file = os.fdopen(descriptor, "a+")  # held open for the run's lifetime
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.close()
            return False
        file.seek(0)
        file.truncate()
        file.write(f"pid {os.getpid()} on host {socket.gethostname()}\n")
        file.flush()
        self._file = file
        return True

    def holder(self) -> str:
        try:
            return (self.directory / LOCK_FILE).read_text().strip() or "a process that has not said who it is"
        except OSError:
            return "another process"

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the descriptor releases the flock
            self._file = None


def hold_log_dir(
    explicit_log_dir: Path | None,
    exp_dir: Path | None,
    name: str,
    continued: Path | None = None,
    written: tuple[str, ...] = (),
) -> tuple[Path, LogDirLock]:
    """Create and lock this run's log directory: `continued` (a resumed run's) or explicit_log_dir, else the
    next version under <exp_dir>/<name> (skipping one a run starting at the same moment has taken).
    A LogDirError naming the directory and the holder when another run holds it, why it cannot be
    written, or the files of someone else's it holds under names the run writes (`written`: beyond WRITTEN)."""
    fixed = continued or explicit_log_dir
    while True:
        if fixed:
            path = Path(fixed)
            _check_foreign(path, _key(explicit_log_dir, continued), (*WRITTEN, *written), SHARED)
        else:
            base, versions = _versions(exp_dir, name)
            path = base / f"version_{max(versions, default=-1) + 1}"
        try:
            path.mkdir(parents=True, exist_ok=True)
            lock = LogDirLock(path.resolve())
            acquired = lock.acquire()
        except OSError as error:
            raise LogDirError(
                f"{_key(explicit_log_dir, continued)}: cannot write the log directory {path} "
                f"({error.strerror or error})"
            ) from None
        if acquired:
            return path.resolve(), lock
        if fixed:
            raise LogDirError(
                f"{_key(explicit_log_dir, continued)}: {path} is in use by another run ({lock.holder()});"
                " expected a log directory no running run holds: wait for that run to end, or give "
                "this one another exp_manager.explicit_log_dir"
            )
        lock.release()  # a run starting at the same moment took this version: take the next


def hold_on_rank_0(
    fabric: Fabric,
    explicit_log_dir: Path | None,
    exp_dir: Path | None,
    name: str,
    continued: Path | None,
    written: tuple[str, ...] = (),
    launch_tag: str | None = None,
) -> tuple[Path, LogDirLock]:
    """`hold_log_dir` on rank 0 (recording the launch's tag there, so that a restarted round finds the folder),
    told to every rank; a LogDirError on every rank when rank 0 could not hold it. The others hold no lock."""
    lock, held = LogDirLock(None), None
    if fabric.global_rank == 0:
        try:
            path, lock = hold_log_dir(explicit_log_dir, exp_dir, name, continued, written)
            if launch_tag is not None:
                record_launch(path, launch_tag)
            held = (str(path), None)
        except LogDirError as error:
            held = (None, str(error))
    path, problem = fabric.broadcast(held, src=0)
    if problem is not None:
        raise LogDirError(problem)
    return Path(path), lock


def _check_foreign(path: Path, key: str, written: tuple[str, ...], shared: tuple[str, ...]) -> None:
    """A LogDirError when `path` holds, under a name the run writes, a link (it would be written through) or,
    in a folder no nxd run made (no lock file, no nxd checkpoint), a file of someone else's (`shared` folders
    are checked for links only)."""
    try:
        if not path.is_dir():
            return
        entries = list(path.iterdir())
    except OSError as error:
        raise LogDirError(f"{key}: cannot read the log directory {path} ({error.strerror or error})") from None
    ours = sorted(entry for entry in entries if any(fnmatch.fnmatch(entry.name, name) for name in written))
    folders = [entry for entry in entries if entry.name in shared]
    if links := [entry for entry in (*ours, *folders, path / LOCK_FILE) if entry.is_symlink()]:
        raise LogDirError(
            f"{key}: {links[0]} is a symbolic link (to {os.readlink(links[0])}); expected a file nxd "
            "wrote there: nxd never writes through a link in its log directory, remove it"
        )
    if ours and not _made_by_nxd(path):
        names = ", ".join(entry.name for entry in ours[:6]) + (f" (and {len(ours) - 6} more)" if len(ours) > 6 else "")
        raise LogDirError(
            f"{key}: {path} holds {names}, which no nxd run wrote (it has no {LOCK_FILE} and no nxd "
            "checkpoint); nxd never overwrites another's files: expected an empty folder or one an nxd "
            "run wrote; give another folder, or move those files"
        )


RECORDS = ("config.yaml", "metrics.csv", CHECKPOINT_DIR, "wandb_run_id", "comet_experiment_key")
"""What a run leaves in its log directory that a new run there would write over (or, for the W&B run and Comet
experiment, continue)."""


def _made_by_nxd(path: Path) -> bool:
    """A folder an nxd run wrote: it holds nxd's lock file (which stays) or a complete nxd checkpoint."""
    return (path / LOCK_FILE).is_file() or any(info.complete for info in list_checkpoints(path / CHECKPOINT_DIR))


def earlier_records(folder: Path) -> list[str]:
    """The RECORDS an earlier nxd run left in `folder` (an empty checkpoints folder counts for nothing). Files in a
    folder no nxd run made are refused apart, as another's, when the run starts."""
    found = []
    try:
        if not folder.is_dir() or not _made_by_nxd(folder):
            return []
        for name in RECORDS:
            path = folder / name
            if path.is_file() or (path.is_dir() and any(path.iterdir())):
                found.append(name)
    except OSError:  # a folder this user cannot read: holding the log directory says so, by name
        return found
    return found


class _PlainYaml(yaml.SafeLoader):
    """YAML without aliases (nxd writes config.yaml without any), so that a planted alias bomb is never built."""

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "an alias in config.yaml", self.peek_event().start_mark)
        return super().compose_node(parent, index)


def earlier_config(folder: Path) -> dict | None:
    """The config.yaml an earlier run wrote in `folder`, or None when there is none that reads back (at most 1 MiB,
    no aliases)."""
    path = folder / "config.yaml"
    try:
        if path.stat().st_size > 2**20:
            return None
        found = yaml.load(path.read_text(encoding="utf-8"), Loader=_PlainYaml)  # noqa: S506 - a safe loader
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return found if isinstance(found, dict) else None


def changed_keys(previous: object, current: object, prefix: str = "") -> Iterator[str]:
    """The dotted keys whose values differ between two configs as config.yaml holds them (mappings compared key by
    key, anything else whole), each with both values (shortened)."""
    if isinstance(previous, dict) and isinstance(current, dict):
        for key in dict.fromkeys([*previous, *current]):
            yield from changed_keys(previous.get(key), current.get(key), f"{prefix}{key}.")
    elif previous != current:
        yield f"{prefix.rstrip('.')} ({_short(previous)} there, {_short(current)} now)"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _key(explicit_log_dir: Path | None, continued: Path | None) -> str:
    if continued is not None and continued != explicit_log_dir:
        return "exp_manager.resume_if_exists"
    return "exp_manager.explicit_log_dir" if explicit_log_dir else "exp_manager.exp_dir"


def log_dir_problems(
    explicit_log_dir: Path | None, exp_dir: Path | None, name: str, name_key: str, names_checkpoints: bool = True
) -> list[str]:
    """Why a run could not write its log directory, found before launch: a name that leaves exp_dir or is
    too long for the file system's folder names (`names_checkpoints`: the checkpoints' too), or a location
    that cannot be written."""
    if not explicit_log_dir and (name in ("", ".", "..") or "/" in name or "\0" in name):
        return [
            f"{name_key}: expected a folder name (no '/' and not '..'; the log directory is "
            f"<exp_dir>/<name>/version_N), found {name!r}"
        ]
    problems = []
    target = Path(explicit_log_dir) if explicit_log_dir else Path(exp_dir or DEFAULT_EXP_DIR) / name
    existing = _nearest_existing(target)
    limit = _name_max(existing)
    long = [part for part in target.parts if len(os.fsencode(part)) > limit]
    if len(os.fsencode(name)) > limit:
        problems.append(
            f"{name_key}: {len(name)} characters are more than a folder name may have on this file "
            f"system ({limit} bytes)"
        )
    elif names_checkpoints and len(os.fsencode(name)) + NAME_ROOM > limit:
        problems.append(
            f"{name_key}: {len(name)} characters leave no room in a checkpoint's folder name (at most "
            f"{limit} bytes on this file system, {NAME_ROOM} of them for the step and samples); expected "
            f"at most {limit - NAME_ROOM}"
        )
    elif long:
        key = "exp_manager.explicit_log_dir" if explicit_log_dir else "exp_manager.exp_dir"
        problems.append(
            f"{key}: the folder name {long[0][:40]!r}... is longer than this file system allows ({limit} bytes)"
        )
    if existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK):
        key = "exp_manager.explicit_log_dir" if explicit_log_dir else "exp_manager.exp_dir"
        why = "a read-only file system" if _read_only(existing) else "a folder this user cannot write"
        problems.append(f"{key}: cannot create the log directory {target}: {existing} is on {why}")
    elif existing.exists() and not existing.is_dir():
        key = "exp_manager.explicit_log_dir" if explicit_log_dir else "exp_manager.exp_dir"
        problems.append(f"{key}: expected a folder for the log directory {target}, found a file at {existing}")
    return problems


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not os.path.exists(path) and path != path.parent:  # False for a name too long, where Path raises
        path = path.parent
    return path


def _name_max(path: Path) -> int:
    try:
        return os.pathconf(path if path.is_dir() else path.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError as error:
        return error.errno == errno.EROFS
