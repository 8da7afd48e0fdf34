"""`nxd-train generate` and `nxd-train eval`: load the config, stand the trained run up for inference on its
tensor-parallel processes, and say any problem in one line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from nxd_config import NxdConfig

from nxd_train.commands.support import exit_if_distributed, load, notices_to_stderr, preflight_stopped


def run_generate(args: argparse.Namespace) -> int:
    from nxd_train.inference.generation import run_generation, settings_notices, settings_problems

    def check(config: NxdConfig) -> list[str]:
        for notice in settings_notices(config.generate):
            print(f"notice: {notice}", file=sys.stderr)
        return settings_problems(config.generate)

    return _inference(
        args.files,
        args.overrides,
        args.dialect,
        check,
        lambda run, config: run_generation(run, config.generate, config.seed),
    )


def run_eval(args: argparse.Namespace) -> int:
    from nxd_train.inference.evaluation import evaluation_problems, run_evaluation, with_command_line

    def check(config: NxdConfig) -> list[str]:
        return evaluation_problems(config.eval)

    return _inference(
        args.files, args.overrides, args.dialect, check, run_evaluation, adjust=lambda c: with_command_line(c, args)
    )


def _inference(
    paths: Sequence[Path],
    overrides: Sequence[str],
    dialect: str | None,
    check: Callable[[NxdConfig], list[str]],
    work: Callable[..., int],
    adjust: Callable[[NxdConfig], NxdConfig] | None = None,
) -> int:
    from nxd_train.checks.launcher import readable_world

    world = readable_world(os.environ)
    quiet = world is not None and world.local_rank != 0
    launch = (
        None
        if world is None
        else {"WORLD_SIZE": str(world.world_size), "LOCAL_WORLD_SIZE": str(world.local_world_size)}
    )
    config = load(paths, overrides, dialect, launch=launch, quiet=quiet)
    if config is None:
        return 1
    path = ", ".join(str(p) for p in paths)
    try:
        config = adjust(config) if adjust is not None else config
    except ValueError as error:  # a command-line option out of range
        print(f"{path}: {error}", file=sys.stderr)
        return 1
    if problems := check(config):
        if not quiet:
            print(f"{path}: " + "\n  ".join(problems), file=sys.stderr)
        return 1
    from nxd_ckpt import CheckpointError
    from nxd_data import DataError
    from nxd_models import ModelConfigError
    from nxd_parallel import ParallelConfigError

    from nxd_train.checks.preflight import PreflightError
    from nxd_train.inference.loading import InferenceError, layout_note, load_run, say
    from nxd_train.run.corpus import default_cache_dir

    if not quiet and (note := layout_note(config)):
        print(f"notice: {note}", file=sys.stderr)
    try:
        with notices_to_stderr(quiet=True):  # the training run's notices were said when it trained
            run = load_run(config, default_cache_dir())
    except PreflightError as error:
        return preflight_stopped(path, error, quiet)
    except (InferenceError, CheckpointError, DataError, ModelConfigError, ParallelConfigError) as error:
        if not quiet:
            print(f"{path}: {error}", file=sys.stderr)
        exit_if_distributed(1, group_wide=False)
        return 1
    except KeyboardInterrupt:
        if not quiet:
            print(f"{path}: interrupted while loading the run; nothing was written", file=sys.stderr)
        return 130
    for reason in run.passed_over:
        say(run, f"notice: skipping a checkpoint: {reason}; using {run.weights.name}")
    say(run, f"weights from {run.weights}")
    try:
        code = work(run, config)
    except InferenceError as error:  # every rank met the same problem
        if run.first:
            print(f"{path}: {error}", file=sys.stderr, flush=True)
        code = 1
    except KeyboardInterrupt:
        if run.first:
            print(f"{path}: interrupted; nothing was written", file=sys.stderr, flush=True)
        code = 130
    exit_if_distributed(code)
    return code
