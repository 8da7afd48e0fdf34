"""Everything about a run that can be checked before any process is spawned.

`plan_run` turns the config into the plan the loop runs (`plan.RunPlan`: the model family, the
datasets, the layout, the precision policy, the cadence ...) and collects every problem into one
`PreflightError`, so a user sees the full list at once and no worker starts on a run that cannot
finish. This is the only module of a run that reads the config.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from nxd_align import LoraFamily
from nxd_config import ConfigNotice, NxdConfig, Status
from nxd_data import DataError
from nxd_models import ModelConfigError, ModelFamily
from nxd_parallel import LaunchWorld, Layout
from nxd_precision import (
    PrecisionConfigError,
    PrecisionPolicy,
    adam8bit_support_problem,
    bf16_support_problem,
    float8_support_problem,
    resolve_policy,
)

from nxd_train.checks.continuation import resume_changes, resume_of, resumed_schedule
from nxd_train.checks.data_keys import data_left_out
from nxd_train.checks.float8 import float8_problems, float8_spec
from nxd_train.checks.launcher import launcher_world, restarted
from nxd_train.checks.layout import layout_problems
from nxd_train.checks.online import online_plan
from nxd_train.checks.run_problems import (
    earlier_run_problems,
    files_in,
    model_size_problem,
    not_in_this_release,
    optimizer_problems,
    sample_index_problem,
)
from nxd_train.cluster.job import Job, job_of
from nxd_train.logging.log_dir import log_dir_problems, optional_path
from nxd_train.run.checkpointing import Resume, checkpoint_problems
from nxd_train.run.data import build_datasets
from nxd_train.run.data_splits import DataSplits
from nxd_train.run.identity import architecture, data_identity
from nxd_train.run.initial_weights import head_problem, initial_weights_problems
from nxd_train.run.model_specs import PLACEHOLDER_VOCABULARY, model_vocabulary, run_family, training_method
from nxd_train.run.objective_specs import (
    adapters_of,
    grpo_config,
    initial_weights,
    objective_of,
    preference_config,
    reference_of,
)
from nxd_train.run.plan import OnlineRL, PreflightError, RunPlan
from nxd_train.run.settings import layout_of, loop_settings, precision_policy
from nxd_train.run.tokenizers import run_tokenizer


def accelerator_name() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _notices(cfg: NxdConfig, policy: PrecisionPolicy) -> None:
    """Keys that are valid but change nothing in this run, said once before launch."""
    params = cfg.exp_manager.checkpoint_callback_params
    if cfg.exp_manager.create_checkpoint_callback and not (params.save_top_k or params.save_last):
        warnings.warn(
            "exp_manager.checkpoint_callback_params.save_top_k: 0 keeps no checkpoint and save_last is "
            "False, so this run writes none",
            ConfigNotice,
            stacklevel=3,
        )
    if params.use_master_weights_in_ckpt and policy.master_dtype is None:
        warnings.warn(
            f"exp_manager.checkpoint_callback_params.use_master_weights_in_ckpt: precision "
            f"{cfg.precision.type} keeps no master weights; checkpoints hold the model weights",
            ConfigNotice,
            stacklevel=3,
        )
    if neuron_keys := cfg.set_keys_with_status(Status.NEURON_ONLY):
        warnings.warn(f"acted on only on AWS Neuron devices: {', '.join(neuron_keys)}", ConfigNotice, stacklevel=3)
    ds = cfg.distributed_strategy
    if ds.tensor_model_parallel_size == 1:
        for key, value, default in (
            ("sequence_parallel", ds.sequence_parallel, False),
            ("kv_replicator", ds.kv_replicator, 1),
        ):
            if value != default:
                warnings.warn(
                    f"distributed_strategy.{key}: {value} acts across tensor-parallel ranks; with "
                    "tensor_model_parallel_size 1 it changes nothing",
                    ConfigNotice,
                    stacklevel=3,
                )
    if cfg.data.tokenizer is not None and not cfg.data.tokenizer.use_fast:
        warnings.warn(
            "data.tokenizer.use_fast: False asks for transformers' Python tokenizer; nxd reads the Rust "
            "(fast) one, built from the same files, which gives the same ids",
            ConfigNotice,
            stacklevel=3,
        )
    if ds.context_parallel_size == 1 and cfg.model.fusions.ring_attention:
        warnings.warn(
            "model.fusions.ring_attention: True acts across context-parallel ranks; with "
            "context_parallel_size 1 attention runs unsplit",
            ConfigNotice,
            stacklevel=3,
        )
    if (why := _capturable_off(cfg)) is not None:
        warnings.warn(
            f"model.optim.capturable: True matters to CUDA graph capture only; {why}, so the step runs "
            "uncaptured (the same updates)",
            ConfigNotice,
            stacklevel=3,
        )
    if ds.cpu_offload and accelerator_name() == "cpu":
        warnings.warn(
            "distributed_strategy.cpu_offload: on a CPU run the shards are in host memory already; it "
            "frees no device memory here",
            ConfigNotice,
            stacklevel=3,
        )


def _capturable_off(cfg: NxdConfig) -> str | None:
    """Why torch's capturable step (which needs the optimizer's tensors on CUDA) cannot run here, when
    model.optim.capturable asks for it: NxDT's examples set it for Neuron devices."""
    if not getattr(cfg.model.optim, "capturable", False):
        return None
    if (accelerator := accelerator_name()) != "cuda":
        return f"this run's tensors are on {accelerator}"
    return "distributed_strategy.cpu_offload steps on host tensors" if cfg.distributed_strategy.cpu_offload else None


@dataclass
class _Planning:
    """What the stages of `plan_run` establish, each stage going on from what the earlier ones could."""

    cfg: NxdConfig
    cache_dir: Path
    data_required: bool
    here: bool
    problems: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)
    """Data problems that are notices only (a memory plan made where the data is not)."""
    world: LaunchWorld | None = None
    job: Job | None = None
    device: torch.device | None = None
    policy: PrecisionPolicy | None = None
    resume: Resume | None = None
    log_dir: Path | None = None
    seq_length: int | None = None
    data: DataSplits | None = None
    prompt_ids: tuple[int, ...] = ()
    decode: Callable[[list[int]], str] | None = None
    family: ModelFamily | LoraFamily | None = None
    layout: Layout | None = None
    identity: dict = field(default_factory=dict)
    online: OnlineRL | None = None


def _launch(p: _Planning) -> None:
    """The launcher's world and the job it belongs to (a restarted job reads its restart)."""
    p.world, problems = launcher_world(p.cfg, os.environ, here=p.here)
    p.problems += problems
    p.job = job_of(p.world, os.environ)
    p.cfg = restarted(p.cfg, p.job)


def _keys(p: _Planning) -> None:
    """What this release, the optimizer and the checkpoint keys refuse."""
    p.problems += not_in_this_release(p.cfg) + optimizer_problems(p.cfg) + checkpoint_problems(p.cfg)


def _log_directory(p: _Planning) -> None:
    """The log directory can be written, and holds nothing a new run would write over."""
    exp = p.cfg.exp_manager
    p.problems += log_dir_problems(
        optional_path(exp.explicit_log_dir),
        optional_path(exp.exp_dir),
        exp.name or p.cfg.name,
        "exp_manager.name" if exp.name and exp.name != p.cfg.name else "name",
        exp.create_checkpoint_callback and not exp.checkpoint_callback_params.filename,
    )
    continues = (exp.resume_from_checkpoint is not None and not p.cfg.model.weight_init_only) or exp.resume_if_exists
    if (
        exp.require_empty_log_dir
        and exp.explicit_log_dir
        and not continues
        and (held := files_in(Path(exp.explicit_log_dir)))
    ):
        p.problems.append(
            f"exp_manager.explicit_log_dir: {exp.explicit_log_dir} already holds {held}; expected an "
            "empty or new folder (exp_manager.require_empty_log_dir: True; a QEfficient file's "
            "training.overwrite_output_dir: false), so that nothing there is written over: name another "
            "folder, resume the run that is there, or allow writing beside what is there"
        )
    elif exp.explicit_log_dir and not continues and not exp.is_set("require_empty_log_dir") and p.data_required:
        p.problems += earlier_run_problems(Path(exp.explicit_log_dir), p.cfg)


def _loggers(p: _Planning) -> None:
    """Early stopping has validation to judge; each logger and S3 has its package and something to do."""
    exp, d = p.cfg.exp_manager, p.cfg.data
    no_validation = (d.dataset is not None and not (d.dataset.validation_split or d.dataset.split_ratio)) or (
        d.train_dir is not None and d.val_dir is None and not d.is_set("data_prefix")
    )
    if exp.create_early_stopping_callback and no_validation:
        p.problems.append(
            "exp_manager.create_early_stopping_callback: expected validation data to judge (data.val_dir, "
            "or data.dataset's validation_split or split_ratio), found none"
        )
    if exp.create_early_stopping_callback and p.cfg.trainer.limit_val_batches == 0:
        p.problems.append(
            "exp_manager.create_early_stopping_callback: expected validation to judge (trainer."
            "limit_val_batches above 0), found limit_val_batches 0"
        )
    for key, wanted, module, extra, package in (
        ("create_wandb_logger", exp.create_wandb_logger, "wandb", "wandb", "wandb"),
        ("create_comet_logger", exp.create_comet_logger, "comet_ml", "comet", "comet-ml"),
        ("s3_checkpoints.path", exp.s3_checkpoints.path is not None, "boto3", "s3", "boto3"),
    ):
        if wanted and importlib.util.find_spec(module) is None:
            p.problems.append(
                f"exp_manager.{key}: expected the {package} package, found it not installed; install "
                f"nxd-train[{extra}] (pip install {package})"
            )
    if exp.s3_checkpoints.path is not None and not exp.create_checkpoint_callback:
        p.problems.append(
            "exp_manager.s3_checkpoints.path: expected checkpoints to upload (exp_manager."
            "create_checkpoint_callback True), found checkpointing off"
        )


def _precision(p: _Planning) -> None:
    """The precision policy, and what this device supports of it."""
    p.device = torch.device(accelerator_name())
    try:
        p.policy = precision_policy(p.cfg)
    except PrecisionConfigError as error:
        p.problems.append(str(error))
        return
    for problem in (
        bf16_support_problem(p.policy, p.device),
        p.policy.float8 and float8_support_problem(p.policy.float8, p.device),
        p.cfg.model.optim.name == "adam8bit" and adam8bit_support_problem(p.device),
    ):
        if problem:
            p.problems.append(problem)
    _notices(p.cfg, p.policy)


def _continuation(p: _Planning) -> None:
    """The checkpoint the run continues from, its log directory, and the schedule it continues with."""
    try:
        p.resume, p.log_dir = resume_of(p.cfg)
        p.cfg = resumed_schedule(p.cfg, p.resume)
    except PreflightError as error:
        p.problems += error.problems


def _data(p: _Planning) -> None:
    """The datasets, read (or, without data_required, noticed where they cannot be)."""
    cfg = p.cfg
    p.seq_length = cfg.seq_length
    (p.problems if p.data_required else p.unread).extend(
        data_left_out(cfg.data, fine_tuning=training_method(cfg) is not None)
    )
    train_samples = cfg.trainer.max_steps * cfg.global_batch_size if cfg.trainer.max_steps > 0 else None
    if train_samples is not None and (index_problem := sample_index_problem(cfg, train_samples)):
        p.problems.append(index_problem)
    elif not any(problem.startswith("data.") for problem in p.problems):  # else the data keys themselves are wrong
        try:
            alignment = cfg.model_alignment_strategy
            p.data = build_datasets(
                cfg.data,
                p.seq_length,
                p.cache_dir,
                train_samples=train_samples,
                seed=cfg.seed,
                sft=None if alignment is None else alignment.sft,
                preference=preference_config(cfg),
                grpo=grpo_config(cfg),
                vocabulary=model_vocabulary(cfg),
                trust_remote_code=cfg.model.trust_remote_code,
            )
        except DataError as error:
            (p.problems if p.data_required else p.unread).append(str(error))
        except ModelConfigError as error:
            p.problems += error.problems
    if p.data is not None and len(p.data.train) < cfg.global_batch_size:
        p.problems.append(
            f"data.global_batch_size: expected at most the {len(p.data.train)} samples of the training "
            f"split, found {cfg.global_batch_size}"
        )


def _tokenizer_uses(p: _Planning) -> None:
    """What else reads the run's tokenizer: a soft prompt's init_string, and char_level_ppl's characters."""
    cfg, trust = p.cfg, p.cfg.model.trust_remote_code
    if p.data is not None and (prompt := cfg.model.soft_prompt) is not None and prompt.init_string:
        try:
            (p.prompt_ids,) = run_tokenizer(cfg.data, p.cache_dir, trust).encode([prompt.init_string])
            if not p.prompt_ids:
                p.problems.append(
                    f"model.soft_prompt.init_string: expected text of at least one token, found {prompt.init_string!r}"
                )
        except DataError as error:
            p.problems.append(f"model.soft_prompt.init_string: needs the run's tokenizer: {error}")
    if p.data is not None and cfg.trainer.char_level_ppl:
        try:
            p.decode = run_tokenizer(cfg.data, p.cache_dir, trust).decode
        except DataError as error:
            p.problems.append(f"trainer.char_level_ppl: counts characters with the run's tokenizer: {error}")


def _model(p: _Planning) -> None:
    """The model family (a placeholder vocabulary where the data was not read), and its size."""
    try:
        vocabulary = PLACEHOLDER_VOCABULARY if p.data is None else p.data.vocab_size
        p.family = run_family(p.cfg, vocabulary, p.seq_length, tuple(p.prompt_ids))
    except ModelConfigError as error:
        p.problems += [problem for problem in error.problems if p.data is not None or "vocab_size" not in problem]
    if p.family is not None and (size_problem := model_size_problem(p.cfg, p.family)):
        p.problems.append(size_problem)
        p.family = None


def _float8(p: _Planning) -> None:
    """Which layers take float8 under the layout."""
    if (
        p.family is not None
        and p.policy is not None
        and p.policy.float8 is not None
        and not any(problem.startswith("precision.fp8") for problem in p.problems)
    ):
        ds = p.cfg.distributed_strategy
        p.policy = replace(p.policy, float8=float8_spec(p.family, p.policy.float8, ds.kv_replicator))
        p.problems += float8_problems(p.family, p.policy.float8, p.device, ds.tensor_model_parallel_size)


def _layout(p: _Planning) -> None:
    """The layout, and whether the model splits over it."""
    p.layout = layout_of(p.cfg, p.policy or resolve_policy("fp32"))
    if p.family is not None:
        ds = p.cfg.distributed_strategy
        p.problems += layout_problems(
            p.family, p.layout, ds.tensor_model_parallel_size, ds.pipeline_model_parallel_size, ds.context_parallel_size
        )


def _weights(p: _Planning) -> None:
    """The output layer and initial weights the run starts from fit the model."""
    if p.family is not None and (problem := head_problem(p.family, p.resume)):
        p.problems.append(problem)
    if p.family is not None and not p.problems:
        p.problems += initial_weights_problems(p.family, initial_weights(p.cfg, p.resume))


def _online(p: _Planning) -> None:
    """An online-RL run's rewards and reference (model_alignment_strategy.grpo)."""
    tokenizer = None if p.data is None else p.data.tokenizer_fingerprint
    p.online, problems = online_plan(p.cfg, p.resume, p.family, tokenizer)
    p.problems += problems


def _identity(p: _Planning) -> None:
    """What checkpoints record and resumes compare, and what this run changes from the checkpoint's."""
    cfg, resume = p.cfg, p.resume
    recorded = cfg.exp_manager.create_checkpoint_callback or (resume is not None and not resume.weights_only)
    if p.family is not None and p.data is not None and recorded:
        p.identity = {
            "architecture": architecture(p.family),
            "tokenizer": p.data.tokenizer_fingerprint,
            "data": data_identity(cfg.data.model_dump(mode="json", by_alias=True)),
        }
        p.problems += resume_changes(cfg, resume, p.identity, p.family.source_key)


STAGES: tuple[Callable[[_Planning], None], ...] = (
    _launch,
    _keys,
    _log_directory,
    _loggers,
    _precision,
    _continuation,
    _data,
    _tokenizer_uses,
    _model,
    _float8,
    _layout,
    _weights,
    _online,
    _identity,
)
"""`plan_run`'s stages, in order."""


def plan_run(cfg: NxdConfig, cache_dir: Path, *, data_required: bool = True, here: bool = True) -> RunPlan:
    """The checked plan of a run, or one PreflightError listing every problem: the release, optimizer,
    checkpoint and precision keys, the data, the model and the layout are all checked (`STAGES`), each stage
    going on from what the others could establish, so that one run shows everything to fix.

    Without `data_required` (a memory plan made where the data is not, which writes nothing: the log directory's
    earlier records are not looked at), data that cannot be read is a notice, and the plan has no data (a
    Megatron-style model then has a placeholder vocabulary). Without `here`
    (a job written for a cluster), the launch is not this process's."""
    p = _Planning(cfg, cache_dir, data_required, here)
    for stage in STAGES:
        stage(p)
    for problem in p.unread:
        warnings.warn(
            f"the data was not read ({problem}); planning with the model's vocabulary"
            + ("" if p.cfg.model_source == "hf" else f", or {PLACEHOLDER_VOCABULARY} tokens"),
            ConfigNotice,
            stacklevel=2,
        )
    if p.problems:
        raise PreflightError(list(dict.fromkeys(p.problems)))
    cfg, data = p.cfg, p.data
    return RunPlan(
        p.family,
        data,
        p.seq_length,
        layout=p.layout,
        policy=p.policy,
        objective=objective_of(cfg),
        adapters=adapters_of(cfg, p.resume),
        reference=None if data is None else reference_of(cfg, p.resume, p.family, data, p.policy),
        online=p.online,
        resume=p.resume,
        log_dir=p.log_dir,
        identity=p.identity,
        **loop_settings(cfg, p.policy, p.decode, p.world, p.job, capturable=_capturable_off(cfg) is None),
    )
