"""Everything about a run that can be checked before any process is spawned.

`plan_run` turns the config into the plan the loop runs (`plan.RunPlan`: the model family, the
datasets, the layout, the precision policy, the cadence ...) and collects every problem into one
`PreflightError`, so a user sees the full list at once and no worker starts on a run that cannot
finish. This is the only module of a run that reads the config.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import warnings
from dataclasses import replace
from pathlib import Path

import torch
from nxd_align import LoraFamily
from nxd_config import ConfigNotice, NxdConfig, Status
from nxd_data import DataError
from nxd_models import GPTConfig, ModelConfigError, ModelFamily
from nxd_precision import (
    PrecisionConfigError,
    PrecisionPolicy,
    adam8bit_support_problem,
    bf16_support_problem,
    float8_support_problem,
    resolve_policy,
)

from nxd_train.checks.continuation import resume_changes, resume_of, resumed_schedule
from nxd_train.checks.data_keys import data_left_out, unavailable_data_keys
from nxd_train.checks.errors import PreflightError
from nxd_train.checks.float8 import float8_problems, float8_spec
from nxd_train.checks.launcher import job_of, launcher_world, restarted
from nxd_train.checks.layout import layout_problems
from nxd_train.checks.resume import architecture, data_identity
from nxd_train.logging.log_dir import (
    LOCK_FILE,
    changed_keys,
    earlier_config,
    earlier_records,
    log_dir_problems,
)
from nxd_train.run.checkpointing import (
    checkpoint_problems,
    head_problem,
    initial_weights_problems,
)
from nxd_train.run.data import build_datasets
from nxd_train.run.model_specs import PLACEHOLDER_VOCABULARY, model_vocabulary, run_family, training_method
from nxd_train.run.objective_specs import adapters_of, initial_weights, objective_of, preference_config, reference_of
from nxd_train.run.plan import RunPlan
from nxd_train.run.settings import layout_of, loop_settings, optional_path, precision_policy
from nxd_train.run.tokenizers import run_tokenizer


def _not_in_this_release(cfg: NxdConfig) -> list[str]:
    found = []
    if (alignment := cfg.model_alignment_strategy) is not None:
        if alignment.method is None and alignment.peft is None:
            found.append(
                "model_alignment_strategy: expected a method (sft, dpo, orpo, kto, reward_model) or peft, "
                "found an empty section; remove it to pretrain"
            )
        if alignment.reward_model is not None and alignment.peft is not None:
            found.append(
                "model_alignment_strategy.peft: not available with reward_model (the score head trains beside "
                "the adapters, which LoRA checkpoints do not hold yet); expected no peft block"
            )
        if (peft := alignment.peft) is not None and peft.save_lora_base and peft.merge_lora:
            found.append(
                "model_alignment_strategy.peft: save_lora_base and merge_lora both write the base weights "
                "of a checkpoint; expected at most one of them True"
            )
    return (
        found + _compile_problems(cfg) + unavailable_data_keys(cfg.data, fine_tuning=training_method(cfg) is not None)
    )


def _compile_problems(cfg: NxdConfig) -> list[str]:
    """The layouts compiled decoder blocks cannot take yet, by name: torch.compile over tensor-parallel
    blocks fails inside DTensor's backward (with recomputation or with a transformers model) or drops
    the embedding's gradient (a transformers model entering sequence parallelism)."""
    tp = cfg.distributed_strategy.tensor_model_parallel_size
    if not cfg.model.fusions.torch_compile or tp == 1:
        return []
    return [
        f"model.fusions.torch_compile: not available with tensor parallelism (distributed_strategy."
        f"tensor_model_parallel_size: {tp}); expected one of them off"
    ]


def _optimizer_problems(cfg: NxdConfig) -> list[str]:
    optim = cfg.model.optim
    found = []
    if optim.name == "adafactor" and optim.relative_step and optim.sched is not None:
        found.append(
            "model.optim.sched: adafactor with relative_step computes its own learning rate; "
            f"expected no sched, found {optim.sched.name}"
        )
    return found


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


SAMPLE_INDEX_BYTES = 20
"""Bytes per training sample of Megatron's indices (shuffle entry, sample start, and documents)."""
MAX_PARAMETERS = 10**13
MAX_LAYERS = 4096


def _earlier_run_problems(folder: Path, cfg: NxdConfig) -> list[str]:
    """An earlier run's records in the explicit log directory of a run that does not resume it: refused, naming
    the keys that changed (a new run there would write over its config.yaml, metrics.csv and checkpoints)."""
    if not (records := earlier_records(folder)):
        return []
    if (previous := earlier_config(folder)) is not None:
        changes = list(itertools.islice(changed_keys(previous, cfg.model_dump(mode="json", by_alias=True)), 6))
        more = "; and more" if len(changes) > 5 else ""
        what = f"keys changed since: {'; '.join(changes[:5])}{more}" if changes else "the same config"
    else:
        what = "no config.yaml to compare"
    return [
        f"exp_manager.explicit_log_dir: {folder} holds an earlier run's {', '.join(records)} ({what}); this run "
        "does not resume it and would write over them: expected a new folder. Name another "
        "exp_manager.explicit_log_dir, continue that run (exp_manager.resume_if_exists=True), or write "
        "exp_manager.require_empty_log_dir=False to write over its records"
    ]


def _files_in(folder: Path) -> str:
    """What `folder` holds, in a few words ('' when it is missing or empty; the run lock file counts for
    nothing)."""
    if not folder.is_dir():
        return ""
    names = sorted(p.name for p in folder.iterdir() if p.name != LOCK_FILE)
    if not names:
        return ""
    more = ", ..." if len(names) > 3 else ""
    return f"{len(names)} entr{'y' if len(names) == 1 else 'ies'} ({', '.join(names[:3])}{more})"


def _sample_index_problem(cfg: NxdConfig, train_samples: int) -> str | None:
    """Why the Megatron sample index of `train_samples` samples cannot be built on this machine (more
    than half its memory), before anything is built; None for other data or when it fits."""
    if cfg.data.train_dir is not None or cfg.model_alignment_strategy is not None:
        return None  # records and Hugging Face data are read as they are, epoch after epoch
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    needed = train_samples * SAMPLE_INDEX_BYTES
    if needed <= memory // 2:
        return None
    return (
        f"trainer.max_steps: {cfg.trainer.max_steps:,} steps x data.global_batch_size {cfg.global_batch_size:,} = "
        f"{train_samples:,} samples; their index takes about {needed / 2**30:,.0f} GiB, expected at most half of "
        f"this machine's {memory / 2**30:,.0f} GiB memory (fewer steps or a smaller global batch)"
    )


def _model_size_problem(cfg: NxdConfig, family: ModelFamily | LoraFamily) -> str | None:
    """Why the model is beyond what nxd builds (counted from its sizes, before any module exists)."""
    spec = getattr(family, "base", family).spec
    if isinstance(spec, GPTConfig):
        layers, hidden, ffn, vocab = spec.num_layers, spec.hidden_size, spec.ffn_size, spec.padded_vocab_size
        attention = hidden * spec.head_dim * (2 * spec.num_attention_heads + 2 * spec.kv_heads)
        source = "model"
    else:
        layers, hidden, vocab = spec.num_hidden_layers, spec.hidden_size, spec.vocab_size
        ffn, attention, source = spec.intermediate_size, 4 * spec.hidden_size**2, "model.model_config"
    if layers > MAX_LAYERS:
        return (
            f"model.num_layers: expected at most {MAX_LAYERS} decoder layers (the largest published models have "
            f"under 200; building more takes minutes before the first step), found {layers:,}"
        )
    parameters = 2 * vocab * hidden + layers * (attention + 3 * hidden * ffn)
    if parameters > MAX_PARAMETERS:
        return (
            f"{source}: hidden_size {hidden:,}, {layers:,} layers, ffn {ffn:,} and vocabulary {vocab:,} make about "
            f"{parameters:.1e} parameters; expected at most {MAX_PARAMETERS:.0e} (a hundred times the largest "
            "published models)"
        )
    return None


def plan_run(cfg: NxdConfig, cache_dir: Path, *, data_required: bool = True, here: bool = True) -> RunPlan:
    """The checked plan of a run, or one PreflightError listing every problem: the release, optimizer,
    checkpoint and precision keys, the data, the model and the layout are all checked, each stage
    going on from what the others could establish, so that one run shows everything to fix.

    Without `data_required` (a memory plan made where the data is not, which writes nothing: the log directory's
    earlier records are not looked at), data that cannot be read is a notice, and the plan has no data (a
    Megatron-style model then has a placeholder vocabulary). Without `here`
    (a job written for a cluster), the launch is not this process's."""
    world, problems = launcher_world(cfg, os.environ, here=here)
    job = job_of(world, os.environ)
    cfg = restarted(cfg, job)
    problems += _not_in_this_release(cfg) + _optimizer_problems(cfg) + checkpoint_problems(cfg)
    exp = cfg.exp_manager
    problems += log_dir_problems(
        optional_path(exp.explicit_log_dir),
        optional_path(exp.exp_dir),
        exp.name or cfg.name,
        "exp_manager.name" if exp.name and exp.name != cfg.name else "name",
        exp.create_checkpoint_callback and not exp.checkpoint_callback_params.filename,
    )
    continues = (exp.resume_from_checkpoint is not None and not cfg.model.weight_init_only) or exp.resume_if_exists
    if (
        exp.require_empty_log_dir
        and exp.explicit_log_dir
        and not continues
        and (held := _files_in(Path(exp.explicit_log_dir)))
    ):
        problems.append(
            f"exp_manager.explicit_log_dir: {exp.explicit_log_dir} already holds {held}; expected an "
            "empty or new folder (exp_manager.require_empty_log_dir: True; a QEfficient file's "
            "training.overwrite_output_dir: false), so that nothing there is written over: name another "
            "folder, resume the run that is there, or allow writing beside what is there"
        )
    elif exp.explicit_log_dir and not continues and not exp.is_set("require_empty_log_dir") and data_required:
        problems += _earlier_run_problems(Path(exp.explicit_log_dir), cfg)
    d = cfg.data
    no_validation = (d.dataset is not None and not (d.dataset.validation_split or d.dataset.split_ratio)) or (
        d.train_dir is not None and d.val_dir is None and not d.is_set("data_prefix")
    )
    if exp.create_early_stopping_callback and no_validation:
        problems.append(
            "exp_manager.create_early_stopping_callback: expected validation data to judge (data.val_dir, "
            "or data.dataset's validation_split or split_ratio), found none"
        )
    if exp.create_early_stopping_callback and cfg.trainer.limit_val_batches == 0:
        problems.append(
            "exp_manager.create_early_stopping_callback: expected validation to judge (trainer."
            "limit_val_batches above 0), found limit_val_batches 0"
        )
    for key, wanted, module, extra, package in (
        ("create_wandb_logger", exp.create_wandb_logger, "wandb", "wandb", "wandb"),
        ("create_comet_logger", exp.create_comet_logger, "comet_ml", "comet", "comet-ml"),
        ("s3_checkpoints.path", exp.s3_checkpoints.path is not None, "boto3", "s3", "boto3"),
    ):
        if wanted and importlib.util.find_spec(module) is None:
            problems.append(
                f"exp_manager.{key}: expected the {package} package, found it not installed; install "
                f"nxd-train[{extra}] (pip install {package})"
            )
    if exp.s3_checkpoints.path is not None and not exp.create_checkpoint_callback:
        problems.append(
            "exp_manager.s3_checkpoints.path: expected checkpoints to upload (exp_manager."
            "create_checkpoint_callback True), found checkpointing off"
        )
    policy, device = None, torch.device(accelerator_name())
    try:
        policy = precision_policy(cfg)
    except PrecisionConfigError as error:
        problems.append(str(error))
    else:
        for problem in (
            bf16_support_problem(policy, device),
            policy.float8 and float8_support_problem(policy.float8, device),
            cfg.model.optim.name == "adam8bit" and adam8bit_support_problem(device),
        ):
            if problem:
                problems.append(problem)
        _notices(cfg, policy)
    resume = log_dir = None
    try:
        resume, log_dir = resume_of(cfg)
        cfg = resumed_schedule(cfg, resume)
    except PreflightError as error:
        problems += error.problems
    seq_length, unread = cfg.seq_length, []
    (problems if data_required else unread).extend(
        data_left_out(cfg.data, fine_tuning=training_method(cfg) is not None)
    )
    train_samples = cfg.trainer.max_steps * cfg.global_batch_size if cfg.trainer.max_steps > 0 else None
    data = None
    if train_samples is not None and (index_problem := _sample_index_problem(cfg, train_samples)):
        problems.append(index_problem)
    elif not any(problem.startswith("data.") for problem in problems):  # else the data keys themselves are wrong
        try:
            alignment = cfg.model_alignment_strategy
            data = build_datasets(
                cfg.data,
                seq_length,
                cache_dir,
                train_samples=train_samples,
                seed=cfg.seed,
                sft=None if alignment is None else alignment.sft,
                preference=preference_config(cfg),
                vocabulary=model_vocabulary(cfg),
                trust_remote_code=cfg.model.trust_remote_code,
            )
        except DataError as error:
            (problems if data_required else unread).append(str(error))
        except ModelConfigError as error:
            problems += error.problems
    if data is not None and len(data.train) < cfg.global_batch_size:
        problems.append(
            f"data.global_batch_size: expected at most the {len(data.train)} samples of the training "
            f"split, found {cfg.global_batch_size}"
        )
    family, prompt_ids = None, ()
    if data is not None and (prompt := cfg.model.soft_prompt) is not None and prompt.init_string:
        try:
            (prompt_ids,) = run_tokenizer(cfg.data, cache_dir, cfg.model.trust_remote_code).encode([prompt.init_string])
            if not prompt_ids:
                problems.append(
                    f"model.soft_prompt.init_string: expected text of at least one token, found {prompt.init_string!r}"
                )
        except DataError as error:
            problems.append(f"model.soft_prompt.init_string: needs the run's tokenizer: {error}")
    decode = None
    if data is not None and cfg.trainer.char_level_ppl:
        try:
            decode = run_tokenizer(cfg.data, cache_dir, cfg.model.trust_remote_code).decode
        except DataError as error:
            problems.append(f"trainer.char_level_ppl: counts characters with the run's tokenizer: {error}")
    try:
        family = run_family(
            cfg, PLACEHOLDER_VOCABULARY if data is None else data.vocab_size, seq_length, tuple(prompt_ids)
        )
    except ModelConfigError as error:
        problems += [problem for problem in error.problems if data is not None or "vocab_size" not in problem]
    if family is not None and (size_problem := _model_size_problem(cfg, family)):
        problems.append(size_problem)
        family = None
    if (
        family is not None
        and policy is not None
        and policy.float8 is not None
        and not any(problem.startswith("precision.fp8") for problem in problems)
    ):
        ds = cfg.distributed_strategy
        policy = replace(policy, float8=float8_spec(family, policy.float8, ds.kv_replicator))
        problems += float8_problems(family, policy.float8, device, ds.tensor_model_parallel_size)
    layout = layout_of(cfg, policy or resolve_policy("fp32"))
    if family is not None:
        ds = cfg.distributed_strategy
        problems += layout_problems(
            family, layout, ds.tensor_model_parallel_size, ds.pipeline_model_parallel_size, ds.context_parallel_size
        )
    if family is not None and (problem := head_problem(family, resume)):
        problems.append(problem)
    if family is not None and not problems:
        problems += initial_weights_problems(family, initial_weights(cfg, resume))
    identity = {}
    recorded = cfg.exp_manager.create_checkpoint_callback or (resume is not None and not resume.weights_only)
    if family is not None and data is not None and recorded:  # what checkpoints record and resumes compare
        identity = {
            "architecture": architecture(family),
            "tokenizer": data.tokenizer_fingerprint,
            "data": data_identity(cfg.data.model_dump(mode="json", by_alias=True)),
        }
        problems += resume_changes(cfg, resume, identity, family.source_key)
    for problem in unread:
        warnings.warn(
            f"the data was not read ({problem}); planning with the model's vocabulary"
            + ("" if cfg.model_source == "hf" else f", or {PLACEHOLDER_VOCABULARY} tokens"),
            ConfigNotice,
            stacklevel=2,
        )
    if problems:
        raise PreflightError(list(dict.fromkeys(problems)))
    return RunPlan(
        family,
        data,
        seq_length,
        layout=layout,
        policy=policy,
        objective=objective_of(cfg),
        adapters=adapters_of(cfg, resume),
        reference=None if data is None else reference_of(cfg, resume, family, data, policy),
        resume=resume,
        log_dir=log_dir,
        identity=identity,
        **loop_settings(cfg, policy, decode, world, job, capturable=_capturable_off(cfg) is None),
    )
