"""`nxd-train eval`: EleutherAI's lm-evaluation-harness over a trained run (`lm_eval_model.NxdLM`), as GPT-NeoX's
eval.py runs it. Every tensor-parallel process runs every request (the model is one replica); the first prints
lm-eval's table and writes the results where NeoX's eval.py writes them."""

from __future__ import annotations

import argparse
import functools
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from nxd_config import NxdConfig
from nxd_config.schema.inference import EvalConfig
from nxd_data import save_atomically
from pydantic import ValidationError

from nxd_train.inference.loading import InferenceError, LoadedRun, say

EXTRA = "pip install 'nxd-train[eval]' (uv sync --extra eval in a checkout)"


def with_command_line(cfg: NxdConfig, args: argparse.Namespace) -> NxdConfig:
    """`cfg` with eval's command-line options over its eval section; ValueError naming an option out of range."""
    update: dict[str, Any] = {}
    if args.tasks is not None:
        update["tasks"] = tuple(task.strip() for task in args.tasks.split(",") if task.strip())
    if args.log_samples:
        update["log_samples"] = True
    for name in ("limit", "num_fewshot", "include_path"):
        if getattr(args, name) is not None:
            update[name] = getattr(args, name)
    if not update:
        return cfg
    try:
        settings = EvalConfig.model_validate({**cfg.eval.model_dump(), **update})
    except ValidationError as error:
        first = error.errors()[0]
        option = "--" + str(first["loc"][0]).replace("_", "-")
        raise ValueError(f"{option}: {first['msg'].lower()}, found {first['input']!r}") from None
    return cfg.model_copy(update={"eval": settings})


def evaluation_problems(settings: EvalConfig) -> list[str]:
    """What stops an evaluation before any model is loaded: lm-eval missing, no tasks, unknown tasks."""
    try:
        import lm_eval.tasks  # noqa: F401
    except ImportError:
        return [f"nxd-train eval runs EleutherAI's lm-evaluation-harness, which is not installed: {EXTRA}"]
    if not settings.tasks:
        return ["eval.tasks: expected at least one lm-eval task (--tasks T1,T2, or GPT-NeoX's eval_tasks), found none"]
    if settings.include_path is not None and not Path(settings.include_path).is_dir():
        return [f"eval.include_path: expected a folder of task YAML files, found no folder at {settings.include_path}"]
    if settings.limit is not None and settings.limit >= 1 and settings.limit != int(settings.limit):
        return [f"eval.limit: expected a whole number of documents or a fraction below 1, found {settings.limit}"]
    folder = Path(f"{settings.results_prefix}_results").resolve().parent
    if not folder.is_dir():
        return [f"eval.results_prefix: expected a prefix in an existing folder, found no folder {folder}"]
    if settings.include_path is not None and (broken := unreadable_task_files(settings.include_path)):
        return [f"eval.include_path: {file}; lm-eval would pass over this task file without a word" for file in broken]
    manager = task_manager(settings.include_path)
    unknown = [task for task in settings.tasks if task not in manager.all_tasks]
    if unknown:
        import difflib

        hints = [
            f"{task!r}"
            + (
                f" (did you mean {close[0]!r}?)"
                if (close := difflib.get_close_matches(task, manager.all_tasks, n=1))
                else ""
            )
            for task in unknown
        ]
        return [
            f"eval.tasks: {', '.join(hints)} is not an lm-eval task; expected names `lm-eval ls tasks` lists"
            + ("" if settings.include_path else ", or a folder of one's own with --include-path")
        ]
    return []


def unreadable_task_files(folder: str) -> list[str]:
    """Each task YAML under `folder` that is not well-formed YAML, as 'FILE:LINE:COLUMN: expected ..., found ...'.
    Composed only (tags such as lm-eval's !function are not built, so nothing in the folder runs)."""
    import yaml

    found = []
    for path in sorted(Path(folder).rglob("*.yaml")):  # what lm-eval's TaskManager indexes
        try:
            list(yaml.compose_all(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader))
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
            problem = getattr(error, "problem", None) or str(error).strip().splitlines()[0]
            found.append(f"{where}: expected valid YAML, found {problem}")
        except (OSError, UnicodeDecodeError) as error:
            found.append(f"{path}: expected a readable UTF-8 task file, found {error}")
    return found


@functools.cache
def task_manager(include_path: str | None) -> Any:
    """lm-eval's index of its tasks (and of `include_path`'s), built once: it reads every task YAML it has."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path)


def run_evaluation(run: LoadedRun, cfg: NxdConfig) -> int:
    """Evaluate the run on cfg.eval's tasks; 0 when done."""
    from lm_eval import simple_evaluate
    from lm_eval.utils import handle_non_serializable, make_table

    settings = cfg.eval
    limit = None if settings.limit is None else (settings.limit if settings.limit < 1 else int(settings.limit))
    from nxd_train.inference.lm_eval_model import NxdLM

    try:
        results = simple_evaluate(
            model=NxdLM(run, settings.batch_size, cfg.seed),
            tasks=list(settings.tasks),
            num_fewshot=settings.num_fewshot,
            limit=limit,
            task_manager=task_manager(settings.include_path),
            random_seed=cfg.seed,
            numpy_random_seed=cfg.seed,
            torch_random_seed=cfg.seed,
            fewshot_random_seed=cfg.seed,
            log_samples=settings.log_samples,
        )
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as error:  # a task's YAML, its dataset, or a request nxd cannot score: lm-eval's own message
        raise InferenceError(f"lm-eval stopped: {type(error).__name__}: {error}") from None
    if not run.first:
        return 0
    print(make_table(results))
    if "groups" in results:
        print(make_table(results, "groups"))
    name = f"eval_results_{datetime.now().strftime('%m-%d-%Y-%H-%M-%S')}.json"
    path = Path(f"{settings.results_prefix}_{name}" if settings.results_prefix else name)
    save_atomically(path, json.dumps(results, indent=4, default=handle_non_serializable).encode())
    say(run, f"nxd-train eval: results in {path}")
    return 0
