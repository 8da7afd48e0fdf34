"""`nxd-train [train]`: plan the run (the first process of each node says every problem), then train it; each way a
run can stop becomes one line and its exit code, on the rank that knows why."""

from __future__ import annotations

import argparse
import errno
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from nxd_config import ConfigNotice, NxdConfig

from nxd_train.commands.support import (
    default_config_path,
    exit_if_distributed,
    load,
    names,
    notices_to_stderr,
    preflight_stopped,
)

if TYPE_CHECKING:
    from nxd_train.run.plan import RunPlan


def _save_base_shapes(config: NxdConfig, path: str, quiet: bool) -> int:
    """model.mup.save_base_shapes: write the base-shape file (the first process of each node) and exit 0 without
    training, as GPT-NeoX stops after saving."""
    from nxd_models import ModelConfigError

    from nxd_train.run.model_specs import write_base_shapes

    if quiet:
        return 0
    try:
        written = write_base_shapes(config)
    except (ModelConfigError, OSError) as error:
        print(f"{path}: {error}", file=sys.stderr)
        return 1
    print(f"nxd-train: muP base shapes written to {written} (model.mup.save_base_shapes); not training")
    return 0


def _coordinate_check(plan: RunPlan, widths: list[int] | None, path: str, quiet: bool) -> int:
    """model.mup.coord_check: mup's coordinate check in the working directory (the first process of each node), then
    exit 0 without training, as GPT-NeoX stops after plotting."""
    import torch
    from nxd_models import ModelConfigError

    from nxd_train.checks.preflight import accelerator_name
    from nxd_train.run.coord_check import coordinate_check

    if quiet:
        return 0
    try:
        written = coordinate_check(plan, widths, Path.cwd(), torch.device(accelerator_name()))
    except (ModelConfigError, OSError) as error:
        print(f"{path}: {error}", file=sys.stderr)
        return 1
    print(
        f"nxd-train: muP coordinate check written to {', '.join(str(p) for p in written)} (model.mup.coord_check); "
        "not training"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    from nxd_train.checks.launcher import readable_world

    paths, overrides, dialect = args.config or [default_config_path()], args.overrides, args.dialect
    world = readable_world(os.environ)
    quiet = world is not None and world.local_rank != 0  # the first process of each node speaks for it
    launch = (
        None
        if world is None
        else {"WORLD_SIZE": str(world.world_size), "LOCAL_WORLD_SIZE": str(world.local_world_size)}
    )
    config = load(paths, overrides, dialect, launch=launch, quiet=quiet)  # a QEfficient file reads the sizes
    if config is None:
        return 1
    path = names(paths)
    from nxd_train.checks.memory import memory_notice
    from nxd_train.checks.preflight import PreflightError, plan_run
    from nxd_train.cluster.environment import RanksDidNotMeet
    from nxd_train.run.corpus import default_cache_dir  # the training stack loads only when training

    if (mup := config.model.mup) is not None and mup.save_base_shapes:
        return _save_base_shapes(config, path, quiet)

    try:
        with notices_to_stderr(quiet):
            plan = plan_run(config, default_cache_dir())
            if not quiet and (notice := memory_notice(plan)):
                warnings.warn(notice, ConfigNotice, stacklevel=1)  # the launching process says it once
    except PreflightError as error:
        return preflight_stopped(path, error, quiet)
    if mup is not None and mup.coord_check:
        return _coordinate_check(plan, mup.coord_check_widths, path, quiet)
    from nxd_ckpt import CheckpointError
    from nxd_data import DataError
    from nxd_precision import NonFiniteStop
    from torch.distributed import DistError

    from nxd_train.cluster.interrupts import TrainingInterrupted
    from nxd_train.cluster.peers import collective_failure
    from nxd_train.logging.comet_logger import CometStartError
    from nxd_train.logging.log_dir import LogDirError, disk_full
    from nxd_train.logging.wandb_logger import WandbStartError
    from nxd_train.run.loop import UploadsFailed, train
    from nxd_train.run.reward_models import RewardModelError
    from nxd_train.run.rollouts import RolloutError

    try:
        train(plan)
    except LogDirError as error:  # every rank has it from rank 0
        return _stopped(f"{path}: {error}", 1)
    except (CheckpointError, WandbStartError, CometStartError) as error:  # found once loading or logging began
        print(f"{path}: {error}", file=sys.stderr)
        return 1
    except UploadsFailed as error:  # rank 0 alone, once the others have left
        print(f"{path}: training ended, but {error}", file=sys.stderr, flush=True)
        exit_if_distributed(1, group_wide=False)
        return 1
    except RanksDidNotMeet as error:  # each rank says what it saw: no process group exists to agree on one line
        print(f"{path}: {error}", file=sys.stderr, flush=True)
        return 1
    except DataError as error:  # met in a sample while training: only this rank knows, so it says so and leaves
        print(f"{path}: {_worker_message(error)}", file=sys.stderr, flush=True)
        exit_if_distributed(1, group_wide=False)
        return 1
    except (RolloutError, RewardModelError) as error:  # a reward failed or could not load, on this rank
        print(f"{path}: {error}", file=sys.stderr, flush=True)
        exit_if_distributed(1, group_wide=False)
        return 1
    except (NonFiniteStop, TrainingInterrupted) as error:  # every rank stops after the same step
        return _stopped(f"{path}: {error}", getattr(error, "exit_code", 1))
    except (RuntimeError, DistError) as error:
        if not collective_failure(error):
            raise
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"{path}: a collective between the ranks failed ({first}); every rank stops", file=sys.stderr, flush=True)
        exit_if_distributed(1, group_wide=False)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the first step
        print(f"{path}: interrupted before training began; nothing was saved", file=sys.stderr)
        return 130
    except OSError as error:  # a log or metrics file this rank writes
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(
            f"{path}: {disk_full(error, plan.log_dir or plan.logging.explicit_log_dir or Path.cwd())}",
            file=sys.stderr,
            flush=True,
        )
        exit_if_distributed(1, group_wide=False)
        return 1
    exit_if_distributed()
    return 0


def _stopped(message: str, code: int) -> int:
    """End a run every rank stopped early: the first rank says why and returns `code` (what the user or
    scheduler sees); the others leave quietly with 0, so a launcher watching them takes the stop for
    an orderly end rather than a crash to kill everything for."""
    import torch.distributed

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        print(message, file=sys.stderr)
        return code
    first = torch.distributed.get_rank() == 0
    if first:
        print(message, file=sys.stderr, flush=True)
    torch.distributed.barrier()
    exit_if_distributed(0 if not first else code)
    return code


def _worker_message(error: Exception) -> str:
    """An error's own message, also when a data-loader worker raised it (torch re-raises it with the
    worker's traceback as text: its last line holds the message)."""
    text = str(error)
    if "Original Traceback" not in text:
        return text
    return text.strip().splitlines()[-1].partition(": ")[2]
