"""GPT-NeoX's training keys: parallel layout, precision, the optimizer and NeoX's learning-rate schedule, the loop's
length and cadence, DeepSpeed's batch arithmetic and ZeRO stage."""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any

from ..errors import show
from ..hostfile import Host, HostfileError, read_hostfile, select_hosts
from .elasticity import ElasticityError, elastic_batch
from .translation import Arguments, Translation, choice, mapping, typed

ADAM_PARAMS = {"lr", "betas", "eps", "amsgrad", "adam_w_mode", "bias_correction"}

SGD_PARAMS = {"lr", "momentum", "dampening", "nesterov"}
LION_PARAMS = {"lr", "betas"}
MADGRAD_PARAMS = {"lr", "momentum", "eps"}
SM3_PARAMS = {"lr", "momentum", "beta", "eps"}
BNB_ADAM_PARAMS = {"lr", "betas", "eps", "min_8bit_size"}
"""What GPT-NeoX hands bitsandbytes' Adam8bit that nxd reads (NeoX passes params through: another is refused)."""

OFFLOAD = ("cpu_offload", "offload_optimizer", "offload_param", "cpu_offload_params")
ZERO_TUNING = (
    "allgather_partitions",
    "allgather_bucket_size",
    "overlap_comm",
    "reduce_scatter",
    "reduce_bucket_size",
    "contiguous_gradients",
    "round_robin_gradients",
    "sub_group_size",
    "elastic_checkpoint",
    "load_from_fp32_weights",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
)


def parallel_keys(a: Arguments, t: Translation) -> None:
    pp = max(1, typed(t, a, "pipe_parallel_size", int, "a whole number") or 0)
    tp = max(1, typed(t, a, "model_parallel_size", int, "a whole number") or 0)
    t.set("distributed_strategy.pipeline_model_parallel_size", pp, "pipe_parallel_size")
    t.set("distributed_strategy.tensor_model_parallel_size", tp, "model_parallel_size")
    t.set("distributed_strategy.sequence_parallel", a["sequence_parallel"], "sequence_parallel")
    devices, nodes = a["num_gpus"], a["num_nodes"]
    hosts = _hosts(a, t, nodes, devices)
    if devices is None:  # NeoX takes every GPU of each host: the hostfile's slots, or the fewest the layout needs
        devices = len(hosts[0].slots) if hosts else tp * pp
    t.set("trainer.devices", devices, "num_gpus", *(["hostfile"] if hosts else []))
    t.set(
        "trainer.num_nodes",
        len(hosts) if hosts else 1 if nodes == -1 else nodes,
        "num_nodes",
        *(["hostfile"] if hosts else []),
    )
    method, layers = a["pipe_partition_method"], a["num_layers"]
    if not isinstance(method, str) or not (method.startswith("type:") or method in ("uniform", "parameters")):
        t.refuse("pipe_partition_method", f"expected type:<regex>, uniform or parameters, found {show(method)}")
    elif pp > 1 and method != "parameters" and isinstance(layers, int) and layers >= pp:
        ends = layer_partition(layers, pp)[1:-1]
        t.set("model.pipeline_cuts", [f"model.layers.{end - 1}" for end in ends], "pipe_partition_method")


def layer_partition(layers: int, stages: int) -> list[int]:
    """Stage boundaries of `layers` decoder layers, as DeepSpeed's balanced partition of equal layers cuts them:
    ceil(layers / stages) to each stage from the first; where that would leave a stage without a layer, the
    first stages take one more than the others (its uniform partition)."""
    most = -(-layers // stages)
    if most * (stages - 1) < layers:
        return [min(index * most, layers) for index in range(stages + 1)]
    size, extra = divmod(layers, stages)
    bounds = [0]
    for index in range(stages):
        bounds.append(bounds[-1] + size + (1 if index < extra else 0))
    return bounds


FP8_DEFAULTS = {
    "te_fp8_format": "hybrid",
    "te_fp8_wgrad": True,
    "te_fp8_amax_history_len": 1,
    "te_fp8_amax_compute_algo": "most_recent",
    "te_fp8_margin": 0,
}
"""Transformer Engine's fp8 recipe keys and NeoX's defaults for them."""


def float8_keys(a: Arguments, t: Translation) -> None:
    """te_fp8_mha (Transformer Engine's fp8 autocast over each layer, megatron/model/transformer.py) as torchao's
    float8 training of the decoder layers' linear layers (precision.fp8), with TE's recipe keys."""
    if not typed(t, a, "te_fp8_mha", bool, "true or false"):
        for key in FP8_DEFAULTS:
            if a.given(key):
                t.notice(key, "accepted, changes nothing here: NeoX reads it only with te_fp8_mha: true")
        return
    fp8: dict[str, Any] = {}
    if (form := choice(t, a, "te_fp8_format", ("hybrid", "e4m3"))) is not None:
        fp8["format"] = form
    if (wgrad := typed(t, a, "te_fp8_wgrad", bool, "true or false")) is not None:
        fp8["weight_gradient"] = wgrad
    for key in ("te_fp8_amax_history_len", "te_fp8_amax_compute_algo"):
        if a[key] != FP8_DEFAULTS[key]:
            t.notice(
                key,
                f"{show(a[key])}: Transformer Engine's delayed scaling keeps a history of amaxes; torchao's "
                "float8 scales each cast from its operand's current amax (history 1, most_recent)",
            )
    if a["te_fp8_margin"] not in (0, None):
        t.refuse(
            "te_fp8_margin",
            f"expected 0, found {show(a['te_fp8_margin'])}: torchao's float8 scales to the "
            "format's full range, with no margin",
        )
    t.set("precision.fp8", fp8, "te_fp8_mha", *(key for key in ("te_fp8_format", "te_fp8_wgrad") if a.given(key)))


def precision_keys(a: Arguments, t: Translation) -> None:
    """NeoX's precision (arguments.py: calculate_derived): the precision key, or an enabled fp16 / bf16 block."""
    precision, fp16, bf16 = a["precision"], mapping(t, "fp16", a["fp16"]), mapping(t, "bf16", a["bf16"])
    fp16_on = fp16 is not None and bool(fp16.get("enabled", False))
    bf16_on = bf16 is not None and bool(bf16.get("enabled", False))
    if fp16_on and bf16_on:
        t.refuse("bf16", "expected one of the fp16 and bf16 blocks enabled, found both (GPT-NeoX refuses that too)")
        return
    kind = precision
    if fp16_on:
        kind = "fp16" if precision in (None, "fp16") else "conflict"
    elif bf16_on:
        kind = "bfloat16" if precision in (None, "bfloat16") else "conflict"
    if kind == "conflict":
        t.refuse(
            "precision",
            f"expected the precision the enabled {'fp16' if fp16_on else 'bf16'} block says, found {show(precision)}",
        )
        return
    if kind == "fp16" and fp16_on and fp16.get("type") == "bfloat16":
        t.notice(
            "fp16",
            "the block holds type: bfloat16, which GPT-NeoX's DeeperSpeed reads as bf16 training; read "
            "as bf16 (mixed_precision)",
        )
        kind = "bfloat16"
    if kind == "fp16":
        _loss_scaling(t, fp16 or {})
    if kind not in (None, "fp32", "bfloat16", "fp16"):
        t.refuse("precision", f"expected fp16, fp32 or bfloat16, found {show(precision)}")
        return
    if (amp := _apex_amp(t, mapping(t, "amp", a["amp"]), kind, fp16_on or bf16_on)) is not None:
        t.set("precision.type", amp, "amp")
        return
    fp32_allreduce = typed(t, a, "fp32_allreduce", bool, "true or false")
    types = mapping(t, "data_types", a["data_types"]) or {}
    bf16_accumulation = False
    for key, value in types.items():
        if key != "grad_accum_dtype":
            t.refuse(f"data_types.{key}", "unknown DeepSpeed data type setting; expected grad_accum_dtype")
        elif value in ("bf16", "bfloat16") and kind == "bfloat16":
            bf16_accumulation = True
        elif value not in ("fp32", "float32"):
            t.refuse(
                "data_types.grad_accum_dtype",
                f"expected fp32, or bf16 with bf16 training (nxd accumulates fp16 "
                f"and fp32 runs' gradients in fp32), found {show(value)}",
            )
    if bf16_accumulation:  # DeepSpeed's bf16 run with bf16 gradients: fp32 master weights step, as before
        for key, value in (
            ("type", "manual"),
            ("xla_use_bf16", "1"),
            ("master_weights", True),
            ("fp32_grad_acc", False),
            ("fp32_grads_cc", bool(fp32_allreduce)),
        ):
            t.set(f"precision.{key}", value, "bf16", "data_types", "fp32_allreduce")
        return
    nxd_type = {"bfloat16": "mixed_precision", "fp16": "fp16"}.get(kind, "fp32")
    t.set("precision.type", nxd_type, "precision", "fp16", "bf16")


APEX_LEVELS = {"O0": "fp32", "O1": "fp16_autocast", "O2": "fp16"}
"""apex's opt levels: O0 fp32; O1 fp16 autocast over fp32 weights; O2 fp16 weights with fp32 masters."""
APEX_PROPERTIES = ("cast_model_type", "patch_torch_functions", "keep_batchnorm_fp32", "master_weights")


def _apex_amp(t: Translation, block: dict[str, Any] | None, kind: str | None, block_on: bool) -> str | None:
    """DeepSpeed's amp block (NVIDIA apex's amp.initialize settings): the nxd precision type of its opt_level, with
    apex's dynamic loss scaling; None when the block is absent or off."""
    if block is None or not block.get("enabled", False):
        return None
    if block_on or kind not in (None, "fp32"):
        t.refuse(
            "amp",
            "expected amp without an fp16 or bf16 block or precision (DeepSpeed refuses amp with them), "
            f"found precision {show(kind)}",
        )
        return None
    level = block.get("opt_level", "O1")  # apex's default
    if level not in APEX_LEVELS:
        t.refuse(
            "amp.opt_level",
            f"expected O0, O1 or O2, found {show(level)}"
            + (
                ": O3 trains fp16 weights without fp32 master weights, which nxd does not; O2 keeps fp32 masters"
                if level == "O3"
                else ""
            ),
        )
        return None
    for key in set(block) - {"enabled", "opt_level", "loss_scale", "min_loss_scale", "max_loss_scale"}:
        what = (
            "overrides a property of the opt level; nxd runs each level as apex defines it: remove it"
            if key in APEX_PROPERTIES
            else "unknown amp setting"
        )
        t.refuse(f"amp.{key}", f"{what}; expected opt_level, loss_scale, min_loss_scale or max_loss_scale")
    if level == "O0":
        return "fp32"
    scale = block.get("loss_scale", "dynamic")
    if scale != "dynamic":
        t.set("precision.loss_scale", scale, "amp.loss_scale")
    else:  # apex's dynamic scaler: 2^16 first, doubled after 2000 steps without an overflow, halved at each one
        for key, value in (("initial_scale_power", 16), ("loss_scale_window", 2000), ("hysteresis", 1)):
            t.set(f"precision.{key}", value, "amp")
        if "min_loss_scale" in block:
            t.set("precision.min_loss_scale", block["min_loss_scale"], "amp.min_loss_scale")
        else:
            t.notice(
                "amp",
                "apex lowers a dynamic loss scale without a floor; nxd stops at precision.min_loss_scale "
                "(1), where overflows count towards trainer.max_consecutive_nonfinite",
            )
        t.notice("amp", "apex caps a dynamic loss scale at max_loss_scale (2^24 unless set); nxd's grows without a cap")
    return APEX_LEVELS[level]


FP16_BLOCK = {
    "loss_scale": "loss_scale",
    "initial_scale_power": "initial_scale_power",
    "loss_scale_window": "loss_scale_window",
    "hysteresis": "hysteresis",
    "min_loss_scale": "min_loss_scale",
    "consecutive_hysteresis": "consecutive_hysteresis",
}
"""DeepSpeed's fp16 block -> nxd's precision keys (DeepSpeed's defaults where the block is silent)."""


def _loss_scaling(t: Translation, block: dict[str, Any]) -> None:
    """DeepSpeed's loss scaling settings of the fp16 block; its switches (enabled, fp16, type) and auto_cast (the
    model runs in fp16 either way) are read, anything else is refused by name."""
    for key, value in block.items():
        if key in FP16_BLOCK:
            t.set(f"precision.{FP16_BLOCK[key]}", value, f"fp16.{key}")
        elif key not in ("enabled", "fp16", "type", "auto_cast"):
            close = difflib.get_close_matches(key, list(FP16_BLOCK), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            t.refuse(f"fp16.{key}", f"unknown fp16 setting; expected one of enabled, {', '.join(FP16_BLOCK)}{hint}")


def optimizer_keys(a: Arguments, t: Translation) -> None:
    """The optimizer block (NeoX's training.py: get_optimizer) and NeoX's AnnealingLR schedule."""
    block = a["optimizer"]
    t.claim("model.optim", "optimizer")
    if block is None:
        t.refuse(
            "optimizer",
            "expected an optimizer block such as {type: Adam, params: {lr: 0.0006}}, found none "
            "(GPT-NeoX stops without one too)",
        )
        return
    block = mapping(t, "optimizer", block)
    if block is None:
        return
    if not isinstance(block.get("type"), str) or mapping(t, "optimizer.params", block.get("params")) is None:
        t.refuse("optimizer", f"expected a block with a type (a string) and params (a mapping), found {show(block)}")
        return
    kind, params = block["type"].lower(), dict(block["params"])
    if "weight_decay" in params:
        t.refuse(
            "optimizer.params.weight_decay",
            "GPT-NeoX takes weight decay from the top-level weight_decay key (both set fails in NeoX); move it there",
        )
        params.pop("weight_decay")
    lr = params.get("lr", 0.001)
    bnb = typed(t, a, "use_bnb_optimizer", bool, "true or false") is True
    eight_bit = bnb and kind in ("adam", "adamw") and a["use_mup"] is not True
    if bnb and not eight_bit:  # NeoX's get_optimizer reads use_bnb_optimizer in its plain-Adam branch only
        t.notice(
            "use_bnb_optimizer",
            "GPT-NeoX steps with bitsandbytes' 8-bit Adam only for optimizer type Adam "
            f"without use_mup; {block['type']}"
            + (" with use_mup" if a["use_mup"] is True else "")
            + " steps as without it, in nxd too",
        )
    if eight_bit:  # bitsandbytes' Adam8bit, which takes NeoX's params as they are
        options, allowed = {"name": "adam8bit"}, BNB_ADAM_PARAMS
        if params.pop("amsgrad", False) is not False:
            t.refuse("optimizer.params.amsgrad", "expected false: bitsandbytes' Adam8bit has no AMSGrad")
        if params.pop("optim_bits", 8) != 8:
            t.refuse(
                "optimizer.params.optim_bits",
                "expected 8 with use_bnb_optimizer; 32-bit state is Adam's: drop use_bnb_optimizer",
            )
        if params.pop("is_paged", False):
            t.notice(
                "optimizer.params.is_paged",
                "bitsandbytes pages its state to host memory when CUDA memory runs "
                "short; nxd keeps it on the device (nxd-train plan says whether it fits)",
            )
    elif kind in ("adam", "adamw", "cpu_adam", "cpu_torch_adam"):
        if kind.startswith("cpu"):
            t.notice("optimizer.type", f"{block['type']} is DeepSpeed's CPU Adam: the same update, by torch's AdamW")
        options = {"name": "adamw" if params.pop("adam_w_mode", True) else "adam"}
        if a["use_mup"] is True:  # NeoX's get_optimizer: mup's MuAdam, torch's Adam (weight decay in the gradient)
            if kind.startswith("cpu"):
                t.refuse(
                    "optimizer.type",
                    f"with use_mup GPT-NeoX steps with mup's MuAdam or MuSGD; expected Adam or "
                    f"sgd, found {block['type']}",
                )
            options["name"] = "adam"
        allowed = ADAM_PARAMS
        if params.pop("bias_correction", True) is not True:
            t.refuse("optimizer.params.bias_correction", "expected true (torch's Adam always corrects the bias)")
    elif kind == "sgd":
        options, allowed = {"name": "sgd"}, SGD_PARAMS
    elif kind in ("lion", "madgrad_wd", "sm3"):  # NeoX's own (megatron/optimizers.py)
        options, allowed = {"name": kind}, {"lion": LION_PARAMS, "madgrad_wd": MADGRAD_PARAMS, "sm3": SM3_PARAMS}[kind]
    else:
        t.refuse(
            "optimizer.type",
            f"expected Adam, AdamW, cpu_adam, sgd, lion, madgrad_wd or sm3, found "
            f"{show(block['type'])}"
            + {
                "onebitadam": ": onebitadam compresses DeepSpeed's engine's gradient "
                "communication, which nxd's engine (FSDP2) does not; use Adam"
            }.get(kind, ""),
        )
        return
    for key, value in params.items():
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            t.refuse(
                f"optimizer.params.{key}",
                f"unknown parameter of {block['type']}; expected one of {', '.join(sorted(allowed))}{hint}",
            )
        else:
            options[key] = value
    options["lr"] = lr
    options["weight_decay"] = a["weight_decay"]
    if kind == "sm3" and a["weight_decay"]:  # NeoX's SM3 takes no weight decay: its groups' values go unread
        t.notice(
            "weight_decay",
            f"GPT-NeoX's SM3 applies no weight decay, so nxd trains without it too (found {a['weight_decay']})",
        )
        options["weight_decay"] = 0.0
    deepspeed = _deepspeed_schedule(a, t)
    options["sched"] = deepspeed or _schedule(a, t, lr)
    for key, value in options.items():
        source = {
            "weight_decay": "weight_decay",
            "sched": "scheduler" if deepspeed else "lr_decay_style",
            "name": ("optimizer.type", "use_bnb_optimizer") if eight_bit else "optimizer.type",
        }
        keys = source.get(key, f"optimizer.params.{key}")
        t.set(f"model.optim.{key}", value, *((keys,) if isinstance(keys, str) else keys))
    for key, source in (
        ("decay_style", "lr_decay_style"),
        ("warmup_ratio", "warmup"),
        ("min_lr", "min_lr"),
        ("max_steps", "lr_decay_iters" if a.given("lr_decay_iters") else "lr_decay_fraction"),
    ):
        t.claim(f"model.optim.sched.{key}", source)


DEEPSPEED_SCHEDULES = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest")
ANNEALING_KEYS = {
    "lr_decay_style": "linear",
    "warmup": 0.01,
    "min_lr": 0.0,
    "lr_decay_iters": None,
    "lr_decay_fraction": None,
}
"""NeoX's own schedule keys and their defaults."""


def _deepspeed_schedule(a: Arguments, t: Translation) -> dict[str, Any] | None:
    """DeepSpeed's scheduler block, which DeeperSpeed (NeoX's DeepSpeed) runs in place of NeoX's AnnealingLR."""
    block = mapping(t, "scheduler", a["scheduler"])
    if block is None:
        return None
    kind, params = block.get("type"), mapping(t, "scheduler.params", block.get("params", {})) or {}
    if kind not in DEEPSPEED_SCHEDULES:
        t.refuse("scheduler.type", f"expected one of {', '.join(DEEPSPEED_SCHEDULES)}, found {show(kind)}")
        return None
    for key in set(block) - {"type", "params"}:
        t.refuse(f"scheduler.{key}", f"expected type and params, found {key!r}")
    params = dict(params)
    if params.pop("last_batch_iteration", -1) != -1:
        t.refuse(
            "scheduler.params.last_batch_iteration",
            "expected -1 (a resume restores the schedule's position from the checkpoint)",
        )
    for key, default in ANNEALING_KEYS.items():
        if a[key] != default:
            t.notice(key, "DeepSpeed's scheduler block sets the learning rates instead, as DeeperSpeed does")
    return {"name": "DeepSpeedSchedule", "type": kind, **params}


def _schedule(a: Arguments, t: Translation, lr: Any) -> dict[str, Any]:
    """NeoX's AnnealingLR over `lr_decay_iters` (else lr_decay_fraction x train_iters, else train_iters)."""
    style = choice(t, a, "lr_decay_style", ("constant", "linear", "cosine", "exponential"))
    schedule = {
        "name": "NeoXAnnealing",
        "decay_style": style or "linear",
        "warmup_ratio": a["warmup"],
        "min_lr": a["min_lr"],
    }
    iters, fraction = a["lr_decay_iters"], a["lr_decay_fraction"]
    if iters is not None:
        schedule["max_steps"] = iters
    elif fraction is not None:
        train = a["train_iters"]
        if not isinstance(train, int) or not isinstance(fraction, int | float):
            t.refuse(
                "lr_decay_fraction",
                "expected train_iters (a whole number) with it; nxd cannot take a fraction "
                "of an epoch count before the data is read: give lr_decay_iters instead",
            )
        else:
            schedule["max_steps"] = max(1, math.floor(train * fraction))
    if isinstance(lr, int | float) and isinstance(a["min_lr"], int | float) and a["min_lr"] > lr:
        t.refuse("min_lr", f"expected at most the learning rate ({lr}), found {a['min_lr']}")
    return schedule


def loop_keys(a: Arguments, t: Translation) -> None:
    """Loop length, batch arithmetic (DeepSpeed's rule), validation, clipping, recompute, seed."""
    iters, epochs = a["train_iters"], a["train_epochs"]
    if iters is not None and epochs is not None:
        t.refuse("train_epochs", "expected train_iters or train_epochs, found both (GPT-NeoX refuses that too)")
    elif iters is None and epochs is None:
        t.refuse("train_iters", "expected train_iters or train_epochs, found neither")
    t.set("trainer.max_steps", -1 if iters is None else iters, "train_iters")
    if a["exit_interval"] is not None:
        t.set("trainer.exit_interval", typed(t, a, "exit_interval", int, "a whole number"), "exit_interval")
    t.set("trainer.max_epochs", -1 if epochs is None else epochs, "train_epochs")
    _batches(a, t)
    curriculum_keys(a, t)
    interval, count = a["eval_interval"], a["eval_iters"]
    t.set("trainer.val_check_interval", interval, "eval_interval")
    t.set("trainer.check_val_every_n_epoch", None, "eval_interval")
    t.set("trainer.limit_val_batches", count, "eval_iters")
    t.set("trainer.limit_test_batches", count, "eval_iters")
    t.set("trainer.num_sanity_val_steps", 0)
    t.set("trainer.log_every_n_steps", a["log_interval"], "log_interval")
    t.set("trainer.char_level_ppl", a["char_level_ppl"], "char_level_ppl")
    clip = a["gradient_clipping"]
    t.set("trainer.gradient_clip_val", clip if clip else None, "gradient_clipping")
    if clip == 1.0:
        t.notice(
            "gradient_clipping",
            "clipped to 1.0 as the key says; GPT-NeoX leaves the value of its default, "
            "1.0, out of DeepSpeed's config, so NeoX itself does not clip at 1.0",
        )
    t.set("seed", a["seed"], "seed")
    layers = typed(t, a, "checkpoint_num_layers", int, "a whole number")
    if a["checkpoint_activations"]:
        t.set("model.activations_checkpoint_granularity", "full", "checkpoint_activations")
        if layers not in (None, 1):
            t.notice(
                "checkpoint_num_layers",
                f"{layers} layers per checkpoint: nxd recomputes layer by layer, which "
                f"computes the same and keeps a little more memory",
            )
    stage, offload = _zero_stage(t, a)  # 1 and 2: nxd's zero1 shards the gradients too; 3: the parameters as well
    t.set("distributed_strategy.zero1", stage > 0, "zero_optimization")
    t.set("distributed_strategy.zero3", stage == 3, "zero_optimization")
    if offload:
        t.set("distributed_strategy.cpu_offload", True, "zero_optimization")


CURRICULUM_SCHEDULE = {
    "total_curriculum_step": "total_steps",
    "difficulty_step": "length_step",
    "root_degree": "root_degree",
    "difficulty": "lengths",
    "max_step": "max_steps",
}
"""DeepSpeed's schedule_config keys and the data.curriculum keys they set."""


def curriculum_keys(a: Arguments, t: Translation) -> None:
    """DeepSpeed's curriculum_learning block (curriculum_type seqlen) onto data.curriculum."""
    block = mapping(t, "curriculum_learning", a["curriculum_learning"])
    if block is None:
        return
    block = dict(block)
    if not block.pop("enabled", False):
        t.notice("curriculum_learning", "enabled is not true: every step trains on whole samples")
        return
    if (kind := block.pop("curriculum_type", "seqlen")) != "seqlen":
        t.refuse(
            "curriculum_learning.curriculum_type",
            f"expected seqlen (the sequence-length curriculum GPT-NeoX applies), found {show(kind)}",
        )
        return
    t.set("data.curriculum.enabled", True, "curriculum_learning")
    for key, ours in (
        ("min_difficulty", "min_length"),
        ("max_difficulty", "max_length"),
        ("schedule_type", "schedule"),
    ):
        if key not in block:
            t.refuse(f"curriculum_learning.{key}", "expected it (DeepSpeed requires it), found nothing")
        else:
            t.set(f"data.curriculum.{ours}", block.pop(key), "curriculum_learning")
    schedule = mapping(t, "curriculum_learning.schedule_config", block.pop("schedule_config", {})) or {}
    for key, value in schedule.items():
        if key not in CURRICULUM_SCHEDULE:
            t.refuse(
                f"curriculum_learning.schedule_config.{key}",
                f"expected one of {', '.join(CURRICULUM_SCHEDULE)}, found {key!r}",
            )
        else:
            t.set(f"data.curriculum.{CURRICULUM_SCHEDULE[key]}", value, "curriculum_learning")
    for key in block:
        t.refuse(
            f"curriculum_learning.{key}",
            "expected enabled, curriculum_type, min_difficulty, max_difficulty, "
            f"schedule_type or schedule_config, found {key!r}",
        )


def _zero_stage(t: Translation, a: Arguments) -> tuple[int, bool]:
    """The ZeRO stage of `zero_optimization` (0 without the block) and whether it offloads to the CPU
    (DeepSpeed's offload_optimizer / cpu_offload, and offload_param / cpu_offload_params at stage 3: FSDP2
    offloads the shards of both together); NVMe is refused, DeepSpeed's bucket and overlap settings get a notice."""
    zero = mapping(t, "zero_optimization", a["zero_optimization"])
    if zero is None:
        return 0, False
    stage = zero.get("stage")
    if stage not in (0, 1, 2, 3):
        found = "no stage" if stage is None else show(stage)
        t.refuse("zero_optimization.stage", f"expected 0, 1, 2 or 3, found {found}")
    offloaded = [key for key in OFFLOAD if _offload_device(t, key, zero.get(key)) == "cpu"]
    for key in offloaded:
        if stage == 0:
            t.refuse(
                f"zero_optimization.{key}",
                "expected ZeRO stage 1, 2 or 3 with it (what is offloaded is each rank's shard), found stage 0",
            )
        elif key in ("offload_param", "cpu_offload_params") and stage != 3:
            t.refuse(
                f"zero_optimization.{key}",
                f"expected ZeRO stage 3 with it (DeepSpeed offloads parameters only "
                f"at stage 3), found stage {show(stage)}",
            )
    if stage in (1, 2, 3) and set(offloaded) <= {"offload_optimizer", "cpu_offload"} and offloaded:
        t.notice(
            f"zero_optimization.{offloaded[0]}",
            "FSDP2 offloads each rank's parameter shards with the "
            "optimizer state (as DeepSpeed's offload_param would); the gathered parameters stay on the "
            "device",
        )
    tuning = [key for key in zero if key in ZERO_TUNING]
    if tuning:
        t.notice(
            "zero_optimization",
            f"accepted, changes nothing here: {', '.join(tuning)} tune DeepSpeed's "
            f"communication buckets and overlap; nxd's FSDP2 sizes its own",
        )
    for key in sorted(set(zero) - set(ZERO_TUNING) - set(OFFLOAD) - {"stage"}):
        close = difflib.get_close_matches(key, [*ZERO_TUNING, *OFFLOAD, "stage"], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        t.refuse(
            f"zero_optimization.{key}", f"unknown ZeRO setting; expected stage, an offload or a bucket setting{hint}"
        )
    return (stage if stage in (0, 1, 2, 3) else 0), bool(offloaded)


def _offload_device(t: Translation, key: str, value: object) -> str | None:
    """Where DeepSpeed's offload setting `key` puts the state: cpu, or None (not offloaded); NVMe, partial
    offload and values DeepSpeed does not take are refused, its tuning settings get a notice."""
    if value in (None, False, {}):
        return None
    if key in ("cpu_offload", "cpu_offload_params"):
        if value is True:
            return "cpu"
        t.refuse(f"zero_optimization.{key}", f"expected true or false, found {show(value)}")
        return None
    if not isinstance(value, dict):
        t.refuse(f"zero_optimization.{key}", f"expected a mapping such as {{device: cpu}}, found {show(value)}")
        return None
    device = value.get("device")
    if device in (None, "none"):
        return None
    if device != "cpu":
        t.refuse(
            f"zero_optimization.{key}.device",
            f"expected cpu or none, found {show(device)}: offloading to "
            f"NVMe is not in nxd (FSDP2 offloads to host memory: device cpu)",
        )
        return None
    ratio = value.get("ratio", 1.0)
    if ratio != 1.0:
        t.refuse(
            f"zero_optimization.{key}.ratio",
            f"expected 1 (the whole state offloaded; FSDP2 offloads all or nothing), found {show(ratio)}",
        )
    if tuning := sorted(set(value) - {"device", "ratio"}):
        t.notice(
            f"zero_optimization.{key}",
            f"accepted, changes nothing here: {', '.join(tuning)} tune DeepSpeed's "
            "offload; FSDP2 pins its host shards on CUDA itself",
        )
    return "cpu"


def _batches(a: Arguments, t: Translation) -> None:
    """train_batch_size = micro batch x gradient accumulation x data-parallel size: any two give the third
    and all three must agree (DeepSpeed's rule; NeoX's gradient_accumulation_steps defaults to 1)."""
    total = typed(t, a, "train_batch_size", int, "a whole number")
    micro = typed(t, a, "train_micro_batch_size_per_gpu", int, "a whole number")
    steps = typed(t, a, "gradient_accumulation_steps", int, "a whole number")
    steps = steps if "gradient_accumulation_steps" in a.values else None  # NeoX's default 1 is no choice
    for key, value in zip(
        ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"),
        (total, micro, steps),
        strict=True,
    ):
        if value is not None and value < 1:
            t.refuse(key, f"expected a positive whole number, found {value}")
            return
    sizes = [a[key] for key in ("num_gpus", "num_nodes", "model_parallel_size", "pipe_parallel_size")]
    if not all(isinstance(size, int) or size is None for size in sizes):
        return
    _, _, tp, pp = sizes
    model_parallel = max(1, tp or 0) * max(1, pp or 0)
    trainer = t.tree.get("trainer", {})  # as parallel_keys derived them (the hostfile's hosts and slots included)
    world = trainer.get("devices", model_parallel) * trainer.get("num_nodes", 1)
    dp = world // model_parallel or 1
    keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    if (elastic := mapping(t, "elasticity", a["elasticity"])) is not None and elastic.get("enabled", False):
        given = [key for key, value in zip(keys, (total, micro, steps), strict=True) if value is not None]
        _elastic_batches(elastic, dp, model_parallel, t, given)
        return
    if total is None and micro is None:
        t.refuse("train_batch_size", "expected train_batch_size or train_micro_batch_size_per_gpu, found neither")
        return
    if micro is None:
        micro, remainder = divmod(total, dp * (steps or 1))
        if remainder or micro == 0:
            t.refuse(
                "train_batch_size",
                f"expected a multiple of gradient_accumulation_steps x data-parallel size "
                f"({steps or 1} x {dp}), found {total}",
            )
            return
    elif total is None:
        total = micro * (steps or 1) * dp
    elif steps is not None and total != micro * steps * dp:
        t.refuse(
            "train_batch_size",
            f"expected train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
            f"data-parallel size ({micro} x {steps} x {dp} = {micro * steps * dp}), found {total}",
        )
        return
    t.set("data.micro_batch_size", micro, *keys)
    t.set("data.global_batch_size", total, *keys)


ELASTICITY_KEYS = {
    "enabled",
    "max_train_batch_size",
    "micro_batch_sizes",
    "min_gpus",
    "max_gpus",
    "min_time",
    "prefer_larger_batch",
    "ignore_non_elastic_batch_info",
    "version",
    "num_gpus_per_node",
    "model_parallel_size",
}


def _elastic_batches(block: dict[str, Any], dp: int, model_parallel: int, t: Translation, given: list[str]) -> None:
    """DeepSpeed's elasticity block: the global batch and this data-parallel size's micro-batch computed as its
    compute_elastic_config does, so that a run resumed on another size in the valid range keeps its batch."""
    if unknown := sorted(set(block) - ELASTICITY_KEYS):
        t.refuse(
            f"elasticity.{unknown[0]}",
            f"unknown elasticity setting; expected one of {', '.join(sorted(ELASTICITY_KEYS))}",
        )
        return
    if given and not block.get("ignore_non_elastic_batch_info", False):
        t.refuse(
            given[0],
            "elasticity takes control of the batch sizes (DeepSpeed's rule): remove "
            f"{', '.join(given)}, or set elasticity.ignore_non_elastic_batch_info: true",
        )
        return
    if missing := [key for key in ("max_train_batch_size", "micro_batch_sizes") if key not in block]:
        t.refuse(
            f"elasticity.{missing[0]}", "expected it in an enabled elasticity block (DeepSpeed requires it), found none"
        )
        return
    micro = block["micro_batch_sizes"]
    if not isinstance(micro, list) or not micro or not all(isinstance(m, int) and m > 0 for m in micro):
        t.refuse("elasticity.micro_batch_sizes", f"expected a list of positive whole numbers, found {show(micro)}")
        return
    counts = {
        key: block.get(key, default)
        for key, default in (
            ("max_train_batch_size", 1),
            ("min_gpus", 1),
            ("max_gpus", 10000),
            ("num_gpus_per_node", 1),
            ("model_parallel_size", 1),
        )
    }
    if bad := [
        key for key, value in counts.items() if not isinstance(value, int) or isinstance(value, bool) or value < 1
    ]:
        t.refuse(f"elasticity.{bad[0]}", f"expected a positive whole number, found {show(counts[bad[0]])}")
        return
    if counts["min_gpus"] > counts["max_gpus"]:
        t.refuse("elasticity.min_gpus", f"expected at most max_gpus ({counts['max_gpus']}), found {counts['min_gpus']}")
        return
    if "model_parallel_size" in block and counts["model_parallel_size"] != model_parallel:
        t.refuse(
            "elasticity.model_parallel_size",
            f"expected this run's model-parallel size (model_parallel_size x "
            f"pipe_parallel_size = {model_parallel}), found {counts['model_parallel_size']}",
        )
        return
    if (version := block.get("version", 0.2)) not in (0.1, 0.2, "0.1", "0.2"):
        t.refuse("elasticity.version", f"expected 0.1 or 0.2, found {show(version)}")
        return
    if block.get("min_time", 0):
        t.notice("elasticity.min_time", "a hint to DeepSpeed's resource scheduler; nxd's launchers do not read it")
    try:
        found = elastic_batch(
            micro_batches=micro,
            max_batch=counts["max_train_batch_size"],
            data_parallel=dp,
            min_gpus=counts["min_gpus"],
            max_gpus=counts["max_gpus"],
            prefer_larger=block.get("prefer_larger_batch", True) is not False,
            version=float(version),
            gpus_per_node=counts["num_gpus_per_node"],
            model_parallel=counts["model_parallel_size"],
        )
    except ElasticityError as error:
        t.refuse("elasticity", f"expected a block that gives {dp} data-parallel rank(s) a batch: {error}")
        return
    t.set("data.micro_batch_size", found.micro_batch, "elasticity")
    t.set("data.global_batch_size", found.global_batch, "elasticity")
    t.notice(
        "elasticity",
        f"the global batch {found.global_batch} in micro-batches of {found.micro_batch} on {dp} "
        f"data-parallel rank(s); a resume keeps it on {', '.join(map(str, found.valid_sizes))}",
    )


NEOX_HOST_KEYS = {
    "hostfile": "hostfile",
    "include": "include",
    "exclude": "exclude",
    "nodes": "num_nodes",
    "per_node": "num_gpus",
}
"""The NeoX key behind each setting a hostfile selection names."""


def _hosts(a: Arguments, t: Translation, nodes: int, devices: int | None) -> list[Host]:
    """The hosts of NeoX's hostfile after include / exclude, num_nodes and num_gpus, as DeepSpeed's launcher
    picks them (none without a hostfile, or when it cannot be read: that is refused by name)."""
    if a["hostfile"] is None:
        return []
    for key in ("hostfile", "include", "exclude"):
        if a[key] is not None and not isinstance(a[key], str):
            t.refuse(
                key,
                f"expected {'a file path' if key == 'hostfile' else 'hosts such as host1@host2:0,1'}, "
                f"found {show(a[key])}",
            )
            return []
    if _local_only(a):
        t.notice(
            "hostfile",
            f"{a['hostfile']} is not a file; DeepSpeed's launcher then trains on this machine's "
            "devices alone, and so does nxd (NeoX's own configs name /mock_path)",
        )
        return []
    try:
        found = read_hostfile(Path(a["hostfile"]))
        return select_hosts(found, a["include"], a["exclude"], None if nodes == -1 else nodes, devices)
    except HostfileError as error:
        t.refuse(NEOX_HOST_KEYS[error.key], error.message)
        return []


def _local_only(a: Arguments) -> bool:
    """The hostfile named is not a file: DeepSpeed's launcher (fetch_hostfile) then uses this machine alone."""
    return isinstance(a["hostfile"], str) and not Path(a["hostfile"]).is_file()


def launcher_keys(a: Arguments, t: Translation) -> None:
    """NeoX's launcher keys -> trainer.cluster, which `nxd-train launch` writes a job from: slurm (launcher slurm
    or deepspeed_slurm) is an sbatch script (on as many nodes and tasks as the hostfile gave); a hostfile otherwise
    is each host's torchrun command."""
    slurm = a["launcher"] == "slurm" or a["deepspeed_slurm"]
    if slurm:
        t.set("trainer.cluster.scheduler", "slurm", "launcher", "deepspeed_slurm")
    elif a["hostfile"] is not None and not _local_only(a):
        t.set("trainer.cluster.scheduler", "hosts", "launcher", "hostfile")
    hosts = ("hostfile", "include", "exclude", "master_addr", "master_port")  # each host's torchrun reads these
    values = {key: a[key] for key in (*hosts, "comment", "account")}
    for key, value in values.items():  # under slurm the hostfile only sized the run
        if key in ("hostfile", "include", "exclude") and _local_only(a):
            continue
        if a.given(key) and not (slurm and key in hosts):  # the typed config names a value of another type
            t.set(f"trainer.cluster.{key}", value, key)
