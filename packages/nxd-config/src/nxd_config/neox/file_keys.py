"""GPT-NeoX's keys for what a run reads and writes: data, the tokenizer, checkpoints and logs."""

from __future__ import annotations

from typing import Any

from ..errors import show
from .translation import Arguments, Translation, choice, typed


def data_keys(a: Arguments, t: Translation) -> None:
    """The pretraining and SFT data (data_path or train/valid/test_data_paths, label paths), how it is
    read and cut; post-training files are `post_training_keys`'."""
    post_training = a["train_impl"] in ("dpo", "kto", "rm")
    if not post_training:
        _pretraining_paths(a, t)
    if (impl := choice(t, a, "data_impl", ("infer", "mmap", "cached"))) is not None:
        t.set("data.data_impl", impl, "data_impl")
    if (pack := choice(t, a, "pack_impl", ("packed", "pack_until_overflow", "unpacked"))) is not None:
        t.set("data.pack_impl", pack, "pack_impl")
    if (chopped := typed(t, a, "allow_chopped", bool, "true or false")) is not None:
        t.set("data.allow_chopped", chopped, "allow_chopped")
    t.set("data.num_workers", a["num_workers"], "num_workers")
    t.set("data.eod_mask_loss", a["eod_mask_loss"], "eod_mask_loss")
    warmup = typed(t, a, "mmap_warmup", bool, "true or false")
    t.set("data.skip_warmup", not warmup, "mmap_warmup")


def _pretraining_paths(a: Arguments, t: Translation) -> None:
    path, split = a["data_path"], a["split"]
    paths = {name: a[f"{name}_data_paths"] for name in ("train", "valid", "test")}
    weights = {name: a[f"{name}_data_weights"] for name in ("train", "valid", "test")}
    given = [name for name, value in paths.items() if value is not None]
    labelled = [key for key in (f"{name}_label_data_paths" for name in paths) if a[key] is not None]
    if path is not None and labelled:
        t.refuse(
            labelled[0],
            "expected train/valid/test_data_paths with label data paths (GPT-NeoX reads labels only "
            "for them), found data_path",
        )
    if path is not None and given:
        t.refuse(
            "data_path",
            f"expected data_path or train/valid/test_data_paths, found both (data_path and "
            f"{', '.join(f'{name}_data_paths' for name in given)})",
        )
    elif path is not None:
        t.set("data.data_prefix", path, "data_path")
        t.set("data.splits_string", str(split), "split")
    elif given:
        if len(given) != 3:
            missing = sorted(set(paths) - set(given))
            t.refuse(
                f"{missing[0]}_data_paths",
                f"expected train, valid and test data paths together (as GPT-NeoX does), found only {', '.join(given)}",
            )
        else:
            blends = {}
            for name, section in (("train", "train"), ("valid", "validation"), ("test", "test")):
                blend = _blend(t, name, paths[name], weights[name])
                if blend is not None:
                    blends[section] = blend
            t.set("data.data_prefix", blends, *(f"{name}_data_paths" for name in paths))
            _labels(a, t, paths)
    by_documents = typed(t, a, "weight_by_num_documents", bool, "true or false")
    alpha = typed(t, a, "weighted_sampler_alpha", (int, float), "a number")
    if by_documents and alpha is not None:
        if alpha < 0:
            t.refuse("weighted_sampler_alpha", f"expected a number from 0, found {alpha}")
        else:
            t.set("data.blend_by_documents", float(alpha), "weight_by_num_documents", "weighted_sampler_alpha")
        if listed := [f"{name}_data_weights" for name, value in weights.items() if value is not None]:
            t.notice(listed[0], "replaced by weights from document counts (weight_by_num_documents), as in NeoX")
    elif alpha is not None and alpha != 1.0:
        t.notice("weighted_sampler_alpha", "used only with weight_by_num_documents: true, which this run does not set")
    if path is None and not given and labelled:
        t.refuse(
            labelled[0],
            "expected train/valid/test_data_paths beside label data paths (a label file masks the "
            "loss of its data file's documents), found none",
        )
    elif path is None and not given:
        t.notice(
            "data_path",
            "no data_path or train/valid/test_data_paths: nxd trains on its built-in corpus "
            "(Python's standard library, with a BPE trained on it)",
        )


def _labels(a: Arguments, t: Translation, paths: dict[str, Any]) -> None:
    """*_label_data_paths: one label file per data path of the split, as data.label_prefixes."""
    labels: dict[str, str] = {}
    keys = []
    for name, data_paths in paths.items():
        key, given = f"{name}_label_data_paths", a[f"{name}_label_data_paths"]
        if given is None:
            continue
        keys.append(key)
        if (
            not isinstance(given, list)
            or not all(isinstance(p, str) for p in given)
            or not isinstance(data_paths, list)
            or len(given) != len(data_paths)
        ):
            t.refuse(
                key, f"expected one label prefix per {name}_data_paths entry ({show(data_paths)}), found {show(given)}"
            )
            continue
        for data, label in zip(data_paths, given, strict=True):
            if labels.get(data, label) != label:
                t.refuse(key, f"expected one label file for {data!r}, found {labels[data]!r} and {label!r}")
            labels[data] = label
    if labels:
        t.set("data.label_prefixes", labels, *keys)


def _blend(t: Translation, name: str, paths: Any, weights: Any) -> list[Any] | None:
    key = f"{name}_data_paths"
    if not isinstance(paths, list) or not paths:
        t.refuse(key, f"expected a list of data prefixes, found {show(paths)}")
        return None
    if weights is None:
        weights = [1.0] * len(paths)
    numbers = isinstance(weights, list) and all(isinstance(w, int | float) and not isinstance(w, bool) for w in weights)
    if not numbers or len(weights) != len(paths):
        t.refuse(f"{name}_data_weights", f"expected one number per path ({len(paths)}), found {show(weights)}")
        return None
    return [value for pair in zip(weights, paths, strict=True) for value in pair]


def tokenizer_keys(a: Arguments, t: Translation) -> None:
    """NeoX's tokenizers (megatron/tokenizer/tokenizer.py: build_tokenizer) as nxd's data.tokenizer."""
    kind = a["tokenizer_type"]
    vocab, merges = a["vocab_file"], a["merge_file"]
    lowered = kind.lower() if isinstance(kind, str) else kind
    keys = ("tokenizer_type", "vocab_file", "merge_file")
    if lowered == "gpt2bpetokenizer":
        if vocab is None and merges is None:
            return  # no tokenizer named: the data's own (pre-tokenised) ids and the model's vocabulary decide
        t.set(
            "data.tokenizer",
            {"library": "megatron", "type": "GPT2BPETokenizer", "vocab_file": vocab, "merge_file": merges},
            *keys,
        )
    elif lowered in ("hftokenizer", "hfgpt2tokenizer"):
        if vocab is None:
            t.refuse(
                "vocab_file",
                f"expected a local tokenizer (a tokenizer.json, or a directory with one) for {kind}, found none",
            )
            return
        t.set("data.tokenizer", {"library": "huggingface", "type": vocab}, *keys)
    elif lowered == "spmtokenizer":
        if not isinstance(vocab, str) or not vocab:
            t.refuse("vocab_file", f"expected a SentencePiece model file for SPMTokenizer, found {show(vocab)}")
            return
        t.set("data.tokenizer", {"library": "sentencepiece", "model": vocab}, *keys)
    elif lowered == "charleveltokenizer":
        if vocab is not None or merges is not None:
            t.notice("vocab_file" if vocab is not None else "merge_file", "not read by CharLevelTokenizer (as in NeoX)")
        t.set("data.tokenizer", {"library": "megatron", "type": "CharLevelTokenizer"}, *keys)
    elif lowered == "tiktokentokenizer":
        if not isinstance(vocab, str) or not vocab:
            t.refuse(
                "vocab_file",
                f"expected a tiktoken encoding name (such as cl100k_base) for TiktokenTokenizer, found {show(vocab)}",
            )
            return
        t.set("data.tokenizer", {"library": "megatron", "type": "TiktokenTokenizer", "vocab_file": vocab}, *keys)
    else:
        t.refuse(
            "tokenizer_type",
            f"expected GPT2BPETokenizer, HFTokenizer, HFGPT2Tokenizer, SPMTokenizer, "
            f"CharLevelTokenizer or TiktokenTokenizer, found {show(kind)}",
        )


def checkpoints_keys(a: Arguments, t: Translation) -> None:
    """save, the save cadence (checkpoint_factor, checkpoint_scale, extra_save_iters) and
    keep_last_n_checkpoints; NeoX also saves when training ends."""
    save = a["save"]
    factor, scale, extra = a["checkpoint_factor"], a["checkpoint_scale"], a["extra_save_iters"]
    t.set("exp_manager.create_checkpoint_callback", save is not None, "save")
    if save is not None:
        t.set("exp_manager.explicit_log_dir", save, "save")
        if factor is None and extra is None:
            t.refuse(
                "save", "expected checkpoint_factor or extra_save_iters with save (GPT-NeoX's rule), found neither"
            )
    params = "exp_manager.checkpoint_callback_params"
    steps: set[int] = set()
    if scale not in ("linear", "log"):
        t.refuse("checkpoint_scale", f"expected linear or log, found {show(scale)}")
    elif factor is not None:
        if not isinstance(factor, int | float) or isinstance(factor, bool) or factor <= 0:
            t.refuse("checkpoint_factor", f"expected a positive number, found {show(factor)}")
        elif scale == "linear":
            if factor != int(factor):
                t.refuse("checkpoint_factor", f"expected a whole number with checkpoint_scale linear, found {factor}")
            else:
                t.set(f"{params}.every_n_train_steps", int(factor), "checkpoint_factor")
        elif factor <= 1:
            t.refuse("checkpoint_factor", f"expected more than 1 with checkpoint_scale log, found {factor}")
        elif not isinstance(a["train_iters"], int):
            t.refuse(
                "checkpoint_scale",
                "expected train_iters with checkpoint_scale log (its saves are the powers of "
                "checkpoint_factor up to train_iters), found none",
            )
        else:
            steps |= _powers(factor, a["train_iters"])
    if extra is not None:
        if not isinstance(extra, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in extra
        ):
            t.refuse("extra_save_iters", f"expected a list of iterations (whole numbers from 0), found {show(extra)}")
        else:
            if 0 in extra:
                t.notice("extra_save_iters", "iteration 0 (the initial weights, before any step) is not saved")
            steps |= {step for step in extra if step > 0}
    if steps:
        t.set(f"{params}.save_at_steps", sorted(steps), "checkpoint_factor", "extra_save_iters")
    keep = a["keep_last_n_checkpoints"]
    t.set(f"{params}.save_top_k", -1 if keep is None else keep, "keep_last_n_checkpoints")
    t.set(f"{params}.monitor", "step", "keep_last_n_checkpoints")
    t.set(f"{params}.mode", "max", "keep_last_n_checkpoints")
    t.set(f"{params}.save_last", save is not None, "save")
    s3_keys(a, t)


def s3_keys(a: Arguments, t: Translation) -> None:
    """s3_path and s3_chunk_size: each complete checkpoint uploaded."""
    path, chunk = typed(t, a, "s3_path", str, "s3://bucket[/prefix]"), a["s3_chunk_size"]
    if path is not None:
        t.set("exp_manager.s3_checkpoints.path", path, "s3_path")
        t.set("exp_manager.s3_checkpoints.chunk_size", chunk, "s3_chunk_size")
        if a["save"] is None:
            t.refuse("s3_path", "expected save with it (the checkpoints uploaded are the ones save writes), found none")
    elif a.given("s3_chunk_size"):
        t.notice("s3_chunk_size", "used only with s3_path, which this run does not set")


def resume_keys(a: Arguments, t: Translation) -> None:
    """load (an empty or missing folder starts fresh, as in NeoX), iteration, finetune, no_load_optim,
    no_load_rng and the schedule on resume (override_lr_scheduler, use_checkpoint_lr_scheduler)."""
    save, load, finetune = a["save"], a["load"], typed(t, a, "finetune", bool, "true or false")
    iteration = a["iteration"]
    if iteration is not None and (not isinstance(iteration, int) or isinstance(iteration, bool) or iteration < 0):
        t.refuse("iteration", f"expected a checkpoint's iteration (a whole number), found {show(iteration)}")
    elif iteration is not None and load is None:
        t.refuse("iteration", "expected load (the folder holding global_stepN) with it, found no load")
    elif iteration is not None:
        t.set("exp_manager.resume_from_checkpoint", f"{load}/global_step{iteration}", "load", "iteration")
    elif load is not None:
        if load == save:  # NeoX starts fresh from nothing
            t.set("exp_manager.resume_if_exists", True, "load")
            t.set("exp_manager.resume_ignore_no_checkpoint", True, "load")
        else:
            t.set("exp_manager.resume_from_checkpoint", load, "load")
            t.set("exp_manager.resume_from_checkpoint_optional", True, "load")
    if typed(t, a, "no_load_optim", bool, "true or false"):
        t.set("exp_manager.resume_optimizer", False, "no_load_optim")
    if typed(t, a, "no_load_rng", bool, "true or false"):
        t.set("exp_manager.resume_rng", False, "no_load_rng")
    override = typed(t, a, "override_lr_scheduler", bool, "true or false")
    from_checkpoint = typed(t, a, "use_checkpoint_lr_scheduler", bool, "true or false")
    schedule = "config" if override else "checkpoint" if from_checkpoint else "same"  # NeoX checks override first
    t.set("exp_manager.resume_schedule", schedule, "override_lr_scheduler", "use_checkpoint_lr_scheduler")
    if finetune:
        if load is None:
            t.refuse("finetune", "expected load (the weights to fine-tune) with finetune: true, found no load")
        t.set("model.weight_init_only", True, "finetune")


def _powers(factor: float, until: int) -> set[int]:
    """NeoX's log-scaled saves: int(factor ** k) for k = 0, 1 ... up to train_iters."""
    steps, power = set(), 1.0
    while power <= until:
        steps.add(int(power))
        power *= factor
    return steps


WANDB_HOST = "https://api.wandb.ai"


def logging_keys(a: Arguments, t: Translation) -> None:
    save, log_dir, board = a["save"], a["log_dir"], a["tensorboard_dir"]
    if log_dir is not None:
        if save is None:
            t.set("exp_manager.explicit_log_dir", log_dir, "log_dir")
        elif log_dir != save:
            t.notice("log_dir", f"nxd keeps text logs beside the checkpoints, in the run directory {save!r} (save)")
    if board is not None:
        t.set("exp_manager.create_tensorboard_logger", True, "tensorboard_dir")
        where = save or log_dir
        if board != where:
            t.notice(
                "tensorboard_dir",
                f"TensorBoard events are written in the run directory ({where!r}) rather than {board!r}"
                if where
                else "TensorBoard events are written in the run directory",
            )
    wandb = typed(t, a, "use_wandb", bool, "true or false")
    t.set("exp_manager.create_wandb_logger", bool(wandb), "use_wandb")
    for key, ours in (
        ("wandb_project", "project"),
        ("wandb_group", "group"),
        ("wandb_team", "entity"),
        ("wandb_host", "host"),
        ("wandb_run_name", "name"),
    ):
        value = typed(t, a, key, str, "a name")
        if value is None or (key, value) in (("wandb_host", WANDB_HOST), ("wandb_project", "neox")) and not wandb:
            continue  # unset, or a default: W&B's own host (or WANDB_BASE_URL), NeoX's project
        if not wandb:
            t.notice(key, "used only with use_wandb: true, which this run does not set")
        elif (key, value) != ("wandb_host", WANDB_HOST):
            t.set(f"exp_manager.wandb_logger_kwargs.{ours}", value, key)
    comet_keys(a, t)
    t.set("exp_manager.log_parameter_norm", a["log_param_norm"], "log_param_norm")
    t.set("exp_manager.log_gradient_norm", a["log_grad_norm"], "log_grad_norm")
    profiler_keys(a, t)
    statistics_keys(a, t)


def comet_keys(a: Arguments, t: Translation) -> None:
    """use_comet and the experiment's workspace, project, name, tags and other values."""
    comet = typed(t, a, "use_comet", bool, "true or false")
    t.set("exp_manager.create_comet_logger", bool(comet), "use_comet")
    for key, ours in (
        ("comet_workspace", "workspace"),
        ("comet_project", "project"),
        ("comet_experiment_name", "name"),
        ("comet_tags", "tags"),
        ("comet_others", "others"),
    ):
        if (value := a[key]) is None:
            continue
        if not comet:
            t.notice(key, "used only with use_comet: true, which this run does not set")
        else:
            t.set(f"exp_manager.comet_logger_kwargs.{ours}", value, key)


def statistics_keys(a: Arguments, t: Translation) -> None:
    """log_grad_pct_zeros, log_optimizer_states and log_gradient_noise_scale with its settings."""
    t.set("exp_manager.log_gradient_zeros", a["log_grad_pct_zeros"], "log_grad_pct_zeros")
    t.set("exp_manager.log_optimizer_states", a["log_optimizer_states"], "log_optimizer_states")
    noise = typed(t, a, "log_gradient_noise_scale", bool, "true or false")
    settings = {
        "gradient_noise_scale_n_batches": ("n_batches", 5),
        "gradient_noise_scale_cpu_offload": ("cpu_offload", False),
    }
    if noise:
        t.set("exp_manager.gradient_noise_scale.enabled", True, "log_gradient_noise_scale")
    for key, (ours, default) in settings.items():
        if noise:
            t.set(f"exp_manager.gradient_noise_scale.{ours}", a[key], key)
        elif a[key] != default:
            t.notice(key, "used only with log_gradient_noise_scale, which this run does not set")


def profiler_keys(a: Arguments, t: Translation) -> None:
    """profile and memory_profiling: nxd's profiler window over the same steps. NeoX counts iterations from 0
    (profile_step_start: 10 is the 11th step); nxd counts optimizer steps from 1."""
    profile = typed(t, a, "profile", bool, "true or false")
    memory = typed(t, a, "memory_profiling", bool, "true or false")
    window = [
        typed(t, a, key, int, "a whole number of iterations") for key in ("profile_step_start", "profile_step_stop")
    ]
    if not (profile or memory):
        for key, value, default in (
            ("profile_step_start", window[0], 10),
            ("profile_step_stop", window[1], 12),
            ("memory_profiling_path", a["memory_profiling_path"], None),
        ):
            if value != default:
                t.notice(key, "used only with profile or memory_profiling, which this run does not set")
        return
    if None not in window and window[1] < window[0]:
        t.refuse(
            "profile_step_stop",
            f"expected an iteration at or after profile_step_start ({window[0]}), found {window[1]}",
        )
        return
    t.set("exp_manager.profiler.enabled", bool(profile), "profile")
    t.set("exp_manager.profiler.memory", bool(memory), "memory_profiling")
    for key, ours, value in zip(
        ("profile_step_start", "profile_step_stop"), ("start_step", "stop_step"), window, strict=True
    ):
        if value is not None:
            t.set(f"exp_manager.profiler.{ours}", value + 1, key)
    if (path := typed(t, a, "memory_profiling_path", str, "a directory")) is not None:
        if memory:
            t.set("exp_manager.profiler.memory_dir", path, "memory_profiling_path")
        else:
            t.notice("memory_profiling_path", "used only with memory_profiling, which this run does not set")
