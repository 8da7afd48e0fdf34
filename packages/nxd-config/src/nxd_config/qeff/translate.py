"""A QEfficient fine-tuning config (its six sections, and `dpo`) -> an NxDT-dialect config tree.

Every key is judged by its entry in `keys.QEFF_KEYS`; a key QEfficient's config classes lack gets a notice naming
the key that does its job (QEfficient drops it silently: `trainer_fields`). The mapped ones are translated section
by section, with QEfficient's defaults where the file is silent. The batch arithmetic reads the processes a launcher
started (torchrun's WORLD_SIZE and LOCAL_WORLD_SIZE), as the Trainer QEfficient runs does.
"""

from __future__ import annotations

import difflib
import importlib.util
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import show
from ..neox.keys import KeyStatus
from ..neox.translation import Translation
from .keys import CALLBACK_ALIASES, QEFF_KEYS, SECTIONS
from .trainer_fields import unknown_key_notice

NESTED = (
    "model.peft_config",
    "training.ddp_config",
    "training.gradient_checkpointing_kwargs",
    "callbacks.early_stopping",
    "callbacks.json_logger",
)
"""Keys whose value is a block of named settings, read key by key."""
ALPACA_FUNCTIONS = (
    "QEfficient.finetune.experimental.preprocessing.alpaca_func:create_alpaca_prompt",
    "preprocess/alpaca_func:create_alpaca_prompt",
)
"""QEfficient's built-in Alpaca prompt function, as its code and its reference name it."""
BUILTIN_ALPACA = "nxd_data.formatters:alpaca_prompt"
PRECISION = {
    "fp16": "fp16",
    "float16": "fp16",
    "bf16": "mixed_precision",
    "bfloat16": "mixed_precision",
    "fp32": "fp32",
    "float32": "fp32",
}
SCHEDULES = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
)
OPTIMIZERS = ("adamw", "adam", "sgd")
NXD_SECTIONS = ("generate", "eval")
"""nxd's sections a QEfficient file may carry as they are: what `nxd-train generate` and `nxd-train eval` do."""
QUOTED_FIELD = re.compile(r"\{'([A-Za-z_][A-Za-z0-9_]*)'\}")


class Keys:
    """The file's keys (`section.key`, flattened) over QEfficient's defaults."""

    def __init__(self, values: dict[str, Any]):
        self.values = values

    def __getitem__(self, name: str) -> Any:
        return self.values[name] if name in self.values else QEFF_KEYS[name].default

    def given(self, name: str) -> bool:
        return name in self.values


def flatten(t: Translation, values: Mapping[str, Any]) -> dict[str, Any]:
    """`section.key` -> value of the file's QEfficient keys. A section or key QEfficient's config classes lack gets a
    notice and is left out (QEfficient keeps it in extra_params and never reads it: the file runs there as if it
    were absent)."""
    flat: dict[str, Any] = {}
    for section, body in values.items():
        if section in NXD_SECTIONS and isinstance(body, Mapping):  # nxd's own: what generate and eval read
            for key, value in body.items():
                t.set(f"{section}.{key}", value, f"{section}.{key}")
            continue
        if section not in SECTIONS and isinstance(body, Mapping):
            t.notice(
                section,
                f"not a QEfficient section: QEfficient keeps it in extra_params and never reads it, and "
                f"nxd ignores it too (sections: {', '.join(SECTIONS)}){_close(section, SECTIONS)}",
            )
            continue
        if section not in SECTIONS:  # a flat override naming no key of any section
            leaves = {name.rpartition(".")[2] for name in QEFF_KEYS}
            t.refuse(section, f"unknown key; expected section.key or a QEfficient key name{_close(section, leaves)}")
            continue
        if body is None:
            continue
        if not isinstance(body, Mapping):
            t.refuse(section, f"expected a block of settings, found {show(body)}")
            continue
        for key, value in body.items():
            name = f"{section}.{key}"
            if section == "callbacks":
                name = f"callbacks.{CALLBACK_ALIASES.get(key, key)}"
            if name in NESTED and isinstance(value, Mapping | type(None)):
                if name in QEFF_KEYS:  # a callback, on however it is configured
                    flat[name] = True
                for inner, setting in (value or {}).items():
                    flat[f"{name}.{inner}"] = setting
                continue
            if name in NESTED:
                t.refuse(name, f"expected a block of settings, found {show(value)}")
            else:
                flat[name] = value
    for name in flat:
        if name not in QEFF_KEYS:
            t.notice(name, unknown_key_notice(name))
    return {name: value for name, value in flat.items() if name in QEFF_KEYS}


def _close(name: str, known: Any) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def translate(values: Mapping[str, Any], name: str, environ: Mapping[str, str] | None = None) -> Translation:
    """The NxDT tree of QEfficient config `values`; `name` names the run, `environ` gives the launch's sizes."""
    t = Translation()
    flat = flatten(t, values)
    k = Keys(flat)
    for key, value in k.values.items():
        entry = QEFF_KEYS[key]
        if entry.status is KeyStatus.NOTICE and (
            value != entry.default and value is not None or key.startswith("callbacks.")
        ):  # a callback named is asked for
            t.notice(key, f"accepted, changes nothing here: {entry.note}")
        elif entry.status is KeyStatus.REFUSED and value not in (entry.default, None, False, {}):
            t.refuse(key, f"expected {show(entry.default)} (QEfficient's default), found {show(value)}: {entry.note}")
    t.set("name", name)
    t.set("model_source", "hf")
    environ = os.environ if environ is None else environ
    _model(t, k)
    method = _method(t, k)
    _dataset(t, k, method)
    _training(t, k, method, environ)
    _optimizer(t, k)
    _callbacks(t, k)
    if method == "dpo":
        _dpo(t, k)
    elif given := sorted(
        key for key, value in k.values.items() if key.startswith("dpo.") and value != QEFF_KEYS[key].default
    ):
        t.refuse(given[0], f"the dpo section applies to training.type dpo; found type {show(k['training.type'])}")
    t.read = set(k.values)
    return t


# ----------------------------------------------------------------------------- model


def _model(t: Translation, k: Keys) -> None:
    if k["model.model_type"] != "hf":
        t.refuse(
            "model.model_type",
            f"expected hf, found {show(k['model.model_type'])}: nxd builds Hugging Face "
            "models from their config.json (QEfficient's registered classes are not read)",
        )
    model = _local(t, "model.model_name", k["model.model_name"])
    for path in ("model.model_config", "exp_manager.resume_from_checkpoint"):
        t.claim(path, "model.model_name")
    if model is not None:
        t.set("model.model_config", model, "model.model_name")
        t.set("exp_manager.resume_from_checkpoint", model, "model.model_name")
        t.set("model.weight_init_only", True, "model.model_name")
    tokenizer_key = _spelling(t, k, "dataset.tokenizer_name", "model.tokenizer_name")
    tokenizer_key = tokenizer_key if k[tokenizer_key] else None
    tokenizer = _local(t, tokenizer_key, k[tokenizer_key]) if tokenizer_key else model
    if tokenizer is not None:
        t.set("data.tokenizer.library", "huggingface", tokenizer_key or "model.model_name")
        t.set("data.tokenizer.type", tokenizer, tokenizer_key or "model.model_name")
    if k["model.load_in_4bit"]:
        t.refuse(
            "model.load_in_4bit",
            "expected false, found true: 4-bit base weights (QLoRA) need bitsandbytes on "
            "a CUDA device, and nxd's LoRA keeps the base in the precision type's dtype (training.torch_dtype "
            "bf16 halves its memory)",
        )
    attention = k["model.attn_implementation"]
    if attention not in ("sdpa", "eager", None):
        t.notice(
            "model.attn_implementation",
            f"{attention}: nxd computes attention with torch's SDPA (the same "
            "attention, by the kernel torch picks for this device)",
        )
    if not k["model.use_peft"]:
        return
    peft = "model_alignment_strategy.peft"
    for key, target in (
        ("lora_r", "lora_rank"),
        ("lora_alpha", "lora_alpha"),
        ("lora_dropout", "lora_dropout"),
        ("target_modules", "target_modules"),
        ("bias", "lora_bias"),
    ):
        value = k[f"model.peft_config.{key}"]
        t.set(f"{peft}.{target}", "none" if key == "bias" and value is None else value, f"model.peft_config.{key}")
    t.set(f"{peft}.save_lora_config_adapter", True, "model.use_peft")
    if str(k["model.peft_config.peft_type"]).upper() != "LORA":
        t.refuse(
            "model.peft_config.peft_type",
            f"expected LORA, found {show(k['model.peft_config.peft_type'])}: "
            "nxd's adapters are LoRA (IA3 and the other peft methods are not built)",
        )
    task = str(k["model.peft_config.task_type"]).upper()
    if task not in ("CAUSAL_LM", "SEQ_CLS"):
        t.refuse(
            "model.peft_config.task_type",
            f"expected CAUSAL_LM, found {show(k['model.peft_config.task_type'])}:"
            " nxd fine-tunes decoder-only causal language models",
        )


def _local(t: Translation, key: str, value: Any) -> str | None:
    """A model or tokenizer folder: `value` itself when it exists here, else the hub id's snapshot in
    huggingface_hub's cache (fetched when this machine is online; HF_HUB_OFFLINE=1 reads the cache only)."""
    if not isinstance(value, str) or not value:
        t.refuse(key, f"expected a model folder or hub id, found {show(value)}")
        return None
    if Path(value).expanduser().exists():
        return str(Path(value).expanduser())
    if value.count("/") > 1 or value.startswith((".", "/", "~")):
        t.refuse(key, f"expected a model folder or a hub id (owner/name or name), found {value!r}: no such folder")
        return None
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(value, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"])
    except Exception as error:  # offline, unknown repository, gated model: all one message
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        t.refuse(
            key,
            f"{value!r} is not a folder here and the Hugging Face hub did not give it ({first}); expected "
            "a local model folder, or a hub id this machine can reach or has cached (HF_HUB_OFFLINE=1 reads "
            "the cache only; HF_HOME says where it is)",
        )
        return None


# ----------------------------------------------------------------------------- objective and data


def _method(t: Translation, k: Keys) -> str | None:
    """The nxd objective: sft, dpo or reward_model (set in the tree); None when refused."""
    kind = str(k["training.type"]).lower()
    auto = k["model.auto_class_name"]
    if auto not in ("AutoModelForCausalLM", "AutoModelForSequenceClassification"):
        t.refuse(
            "model.auto_class_name",
            f"expected AutoModelForCausalLM or AutoModelForSequenceClassification, found {show(auto)}",
        )
        return None
    if auto == "AutoModelForSequenceClassification":
        if k["dataset.dataset_type"] != "dpo_dataset":
            t.refuse(
                "model.auto_class_name",
                "AutoModelForSequenceClassification trains a reward model on "
                f"preference pairs; expected dataset_type dpo_dataset, found {show(k['dataset.dataset_type'])}",
            )
            return None
        if k["model.use_peft"]:
            t.refuse(
                "model.use_peft",
                "expected false with AutoModelForSequenceClassification: nxd's reward models "
                "train every weight (LoRA adapters beside the score head are not built)",
            )
        length = k["dataset.max_seq_length"]
        t.set(
            "model_alignment_strategy.reward_model",
            {"max_prompt_length": length // 2 if isinstance(length, int) else None},
            "model.auto_class_name",
        )
        return "reward_model"
    if kind in ("sft", "base"):
        t.set("model_alignment_strategy.sft.packing", bool(k["training.packing"]), "training.packing")
        return "sft"
    if kind == "dpo":
        t.set("model_alignment_strategy.dpo", {}, "training.type")
        return "dpo"
    t.refuse("training.type", f"expected sft, base or dpo, found {show(k['training.type'])}")
    return None


def _dataset(t: Translation, k: Keys, method: str | None) -> None:
    d = "data.dataset"
    kinds = {"sft_dataset": "completion", "seq_completion": "text", "dpo_dataset": "preference"}
    kind = kinds.get(k["dataset.dataset_type"])
    if kind == "text" and (k["dataset.completion_template"] is not None or k["dataset.completion_func"] is not None):
        kind = "completion"  # the reference's seq_completion: the completion continues the prompt
    if kind is None:
        t.refuse("dataset.dataset_type", f"expected one of {', '.join(kinds)}, found {show(k['dataset.dataset_type'])}")
        return
    if (kind == "preference") != (method in ("dpo", "reward_model")) and method is not None:
        wanted = "dpo_dataset" if method == "dpo" else "sft_dataset or seq_completion"
        t.refuse(
            "dataset.dataset_type",
            f"{k['dataset.dataset_type']} does not feed training.type {k['training.type']}; expected {wanted}",
        )
    if kind == "preference":
        for key in ("prompt_template", "prompt_func", "completion_template", "completion_func"):
            if k[f"dataset.{key}"] is not None:
                t.refuse(
                    f"dataset.{key}",
                    "dpo_dataset reads its prompt_column, chosen_column and rejected_column "
                    "as they are; expected no template or function",
                )
    t.set(f"{d}.kind", kind, "dataset.dataset_type")
    path_key = "dataset.json_file_path" if k["dataset.json_file_path"] else "dataset.dataset_name"
    t.set(f"{d}.path", k[path_key], path_key)
    config_key = _spelling(t, k, "dataset.config_name", "dataset.dataset_subset")
    if k[config_key] not in (None, "default"):
        t.set(f"{d}.name", k[config_key], config_key)
    t.set(f"{d}.train_split", k["dataset.train_split"], "dataset.train_split")
    t.set(f"{d}.validation_split", k["dataset.test_split"], "dataset.test_split")
    t.set(f"{d}.split_ratio", k["dataset.split_ratio"], "dataset.split_ratio")
    samples = k["dataset.dataset_num_samples"]
    if isinstance(samples, int) and samples > 0:
        t.set(f"{d}.num_samples", samples, "dataset.dataset_num_samples")
    seed_key = _spelling(t, k, "dataset.data_seed", "dataset.seed")
    t.set(f"{d}.seed", k[seed_key], seed_key)
    t.set(
        f"{d}.drop_empty", k["dataset.remove_samples_with_empty_columns"], "dataset.remove_samples_with_empty_columns"
    )
    if k["dataset.dataset_disc_style"] is not None:
        t.set(f"{d}.category", k["dataset.dataset_disc_style"], "dataset.dataset_disc_style")
    for part in ("prompt", "completion") if kind != "preference" else ():
        template, func = k[f"dataset.{part}_template"], k[f"dataset.{part}_func"]
        if template is not None:
            t.set(
                f"{d}.{part}_template", _template(t, f"dataset.{part}_template", template), f"dataset.{part}_template"
            )
        if func is not None:
            t.set(f"{d}.{part}_func", _function(t, f"dataset.{part}_func", func), f"dataset.{part}_func")
    for column in ("prompt_column", "chosen_column", "rejected_column"):
        t.set(f"{d}.{column}", k[f"dataset.{column}"], f"dataset.{column}")
    if k["training.completion_only_loss"] is False:
        t.set(f"{d}.loss_on_prompt", True, "training.completion_only_loss")
    elif str(k["training.type"]).lower() == "base":
        t.set(f"{d}.loss_on_prompt", True, "training.type")
    length = k["dpo.max_length"] if method == "dpo" and k.given("dpo.max_length") else k["dataset.max_seq_length"]
    length_key = "dpo.max_length" if method == "dpo" and k.given("dpo.max_length") else "dataset.max_seq_length"
    t.set("data.seq_length", length, length_key)
    t.set("model.encoder_seq_length", length, length_key)
    t.set("data.num_workers", k["dataset.dataloader_num_workers"], "dataset.dataloader_num_workers")
    if method == "sft" and not k["training.packing"]:
        t.set("data.group_by_length", bool(k["dataset.group_by_length"]), "dataset.group_by_length")


def _template(t: Translation, key: str, template: Any) -> Any:
    """A template as str.format reads it: `{'col'}` (the reference's spelling) as `{col}`, and the reference's
    grammar example `f"..."` without its f-string wrapper, each with a notice."""
    if not isinstance(template, str):
        return template
    if template.startswith(('f"', "f'")) and template.endswith(template[1]) and len(template) > 2:
        template = template[2:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
        t.notice(key, "written as a Python f-string; read as the format string inside it, its \\n as newlines")
    fixed = QUOTED_FIELD.sub(r"{\1}", template)
    if fixed != template:
        names = ", ".join(sorted(set(QUOTED_FIELD.findall(template))))
        t.notice(key, f"{{'{names}'}} read as the column(s) {names} (a quoted field names no column in str.format)")
    return fixed


def _function(t: Translation, key: str, spec: Any) -> Any:
    """QEfficient's built-in Alpaca function as nxd's, unless the user's own file of that path exists."""
    if spec in ALPACA_FUNCTIONS and not Path(spec.partition(":")[0] + ".py").exists():
        t.notice(key, f"{spec} is QEfficient's Alpaca prompt; nxd's {BUILTIN_ALPACA} writes the same text")
        return BUILTIN_ALPACA
    return spec


# ----------------------------------------------------------------------------- training loop


def _training(t: Translation, k: Keys, method: str | None, environ: Mapping[str, str]) -> None:
    out = k["training.output_dir"]
    t.set("exp_manager.explicit_log_dir", out, "training.output_dir")
    t.set("exp_manager.require_empty_log_dir", not k["training.overwrite_output_dir"], "training.overwrite_output_dir")
    t.set("exp_manager.resume_if_exists", False, "training.resume_from_checkpoint")
    if k["training.resume_from_checkpoint"]:
        t.set(
            "exp_manager.resume_from_checkpoint",
            k["training.resume_from_checkpoint"],
            "training.resume_from_checkpoint",
        )
        t.set("model.weight_init_only", False, "training.resume_from_checkpoint")
    t.set("seed", k["training.seed"], "training.seed")
    t.set("trainer.max_epochs", k["training.num_train_epochs"], "training.num_train_epochs")
    t.set("trainer.max_steps", k["training.max_steps"], "training.max_steps")
    _batch(t, k, environ)
    dtype_key = _spelling(t, k, "training.torch_dtype", "training.dtype")
    precision = PRECISION.get(str(k[dtype_key]).lower())
    if precision is None:
        t.refuse(dtype_key, f"expected fp16, bf16 or fp32, found {show(k[dtype_key])}")
    else:
        t.set("precision.type", precision, dtype_key)
    _evaluation(t, k)
    logging = _strategy(k["training.logging_strategy"])
    if logging != "steps":
        t.notice("training.logging_strategy", f"{logging}: nxd logs every logging_steps steps and at the last step")
    t.set("trainer.log_every_n_steps", k["training.logging_steps"], "training.logging_steps")
    _saving(t, k)
    if not k["training.average_tokens_across_devices"]:
        t.refuse(
            "training.average_tokens_across_devices",
            "expected true, found false: nxd divides the loss by the "
            "global batch's token count, so gradients are the same in any layout",
        )
    t.set(
        "distributed_strategy.collective_timeout",
        k["training.ddp_config.ddp_timeout"],
        "training.ddp_config.ddp_timeout",
    )
    t.set("distributed_strategy.tensor_model_parallel_size", k["training.tp_degree"], "training.tp_degree")
    t.set("distributed_strategy.pipeline_model_parallel_size", k["training.pp_degree"], "training.pp_degree")
    if k["training.gradient_checkpointing"]:
        t.set("model.activations_checkpoint_granularity", "full", "training.gradient_checkpointing")
    t.set("model.fusions.torch_compile", bool(k["training.torch_compile"]), "training.torch_compile")
    reports = k["training.report_to"]
    reports = [reports] if isinstance(reports, str) else list(reports or [])
    known = {"tensorboard", "wandb", "none", "trackio", "all"}
    for report in reports:
        if report not in known:
            t.refuse("training.report_to", f"expected tensorboard, wandb, trackio or none, found {show(report)}")
        elif report == "trackio":
            t.notice("training.report_to", "trackio: nxd logs to TensorBoard, W&B and metrics.csv; trackio is not one")
    t.set(
        "exp_manager.create_tensorboard_logger",
        bool({"tensorboard", "all"} & set(reports)) or k.given("callbacks.tensorboard"),
        "training.report_to",
    )
    if "wandb" in reports and importlib.util.find_spec("wandb") is None:
        t.notice(
            "training.report_to",
            "wandb: the wandb package is not installed here (pip install "
            "'nxd-train[wandb]'); nxd logs to metrics.csv and TensorBoard",
        )
    elif "wandb" in reports:
        t.set("exp_manager.create_wandb_logger", True, "training.report_to")


def _spelling(t: Translation, k: Keys, code: str, reference: str) -> str:
    """The key of the two spellings (QEfficient's code's, its reference's) the file uses; both with different
    values are refused."""
    if k.given(code) and k.given(reference) and k[code] != k[reference]:
        t.refuse(
            reference, f"expected one of {code} and {reference}, found both ({show(k[code])} and {show(k[reference])})"
        )
    return reference if k.given(reference) and not k.given(code) else code


def _batch(t: Translation, k: Keys, environ: Mapping[str, str]) -> None:
    """The processes are the launch's (torchrun's WORLD_SIZE / LOCAL_WORLD_SIZE); with no launch, ddp_degree x
    tp x pp on this node (the job `nxd-train launch` writes, or the processes nxd-train starts itself)."""
    degrees = [k[key] or 1 for key in ("training.tp_degree", "training.pp_degree")]
    whole = all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in degrees)
    ddp = k["training.ddp_degree"]
    if "WORLD_SIZE" not in environ and whole and isinstance(ddp, int) and not isinstance(ddp, bool) and ddp >= 1:
        world = local = ddp * degrees[0] * degrees[1]
    else:
        world = int(environ.get("WORLD_SIZE", "1"))
        local = int(environ.get("LOCAL_WORLD_SIZE", str(world)))
    t.set("trainer.devices", local, "training.ddp_degree")
    t.set("trainer.num_nodes", max(1, world // max(local, 1)), "training.ddp_degree")
    micro, steps = k["training.per_device_train_batch_size"], k["training.gradient_accumulation_steps"]
    if not whole:
        return  # the typed config names tp_degree / pp_degree
    model_parallel = degrees[0] * degrees[1]
    dp = max(1, world // model_parallel)
    if k["training.ddp_degree"] not in (None, dp):
        t.refuse(
            "training.ddp_degree",
            f"expected the data-parallel size of the launch ({world} processes / "
            f"tp x pp {model_parallel} = {dp}), found {show(k['training.ddp_degree'])}",
        )
    for key, value in (
        ("training.per_device_train_batch_size", micro),
        ("training.gradient_accumulation_steps", steps),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            t.refuse(key, f"expected a positive whole number, found {show(value)}")
            return
    t.set("data.micro_batch_size", micro, "training.per_device_train_batch_size")
    t.set(
        "data.global_batch_size",
        micro * steps * dp,
        "training.per_device_train_batch_size",
        "training.gradient_accumulation_steps",
    )


def _strategy(value: Any) -> Any:
    """A Trainer strategy as written: YAML 1.1 reads an unquoted `no` as false."""
    return "no" if value is False else value


def _evaluation(t: Translation, k: Keys) -> None:
    strategy = _strategy(k["training.eval_strategy"])
    if not k["training.do_eval"] or strategy == "no":
        t.set("trainer.limit_val_batches", 0, "training.do_eval")
        return
    if strategy == "steps":
        t.set("trainer.val_check_interval", k["training.eval_steps"], "training.eval_steps")
        t.set("trainer.check_val_every_n_epoch", None, "training.eval_strategy")
    elif strategy == "epoch":
        t.set("trainer.val_check_interval", 1.0, "training.eval_strategy")
        t.set("trainer.check_val_every_n_epoch", 1, "training.eval_strategy")
    else:
        t.refuse("training.eval_strategy", f"expected no, steps or epoch, found {show(strategy)}")
    t.set("trainer.limit_val_batches", 1.0, "training.do_eval")


def _saving(t: Translation, k: Keys) -> None:
    strategy = _strategy(k["training.save_strategy"])
    params = "exp_manager.checkpoint_callback_params"
    if strategy == "no":
        t.set("exp_manager.create_checkpoint_callback", False, "training.save_strategy")
        return
    t.set("exp_manager.create_checkpoint_callback", True, "training.save_strategy")
    t.set("exp_manager.trainer_checkpoints", True, "training.save_strategy")
    if strategy == "steps":
        t.set(f"{params}.every_n_train_steps", k["training.save_steps"], "training.save_steps")
    elif strategy != "epoch":
        t.refuse("training.save_strategy", f"expected no, steps or epoch, found {show(strategy)}")
    limit = k["training.save_total_limit"]
    t.set(f"{params}.save_top_k", -1 if limit is None else limit, "training.save_total_limit")
    t.set(f"{params}.monitor", "step", "training.save_total_limit")
    t.set(f"{params}.mode", "max", "training.save_total_limit")
    if k["training.metric_for_best_model"] not in ("eval_loss", "loss", None):
        found = show(k["training.metric_for_best_model"])
        t.refuse("training.metric_for_best_model", f"expected eval_loss, found {found}: nxd judges the validation loss")


def _optimizer(t: Translation, k: Keys) -> None:
    key = _spelling(t, k, "optimizers.optimizer_name", "optimizers.optimizer")
    name = str(k[key]).lower()
    if name not in OPTIMIZERS:
        t.refuse(key, f"expected one of {', '.join(OPTIMIZERS)}, found {show(k[key])}")
    else:
        t.set("model.optim.name", name, key)
    for option in ("lr", "weight_decay"):
        value = k[f"optimizers.{option}"]
        if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as text
            try:
                value = float(value)
            except ValueError:
                t.refuse(f"optimizers.{option}", f"expected a number, found {show(value)}")
                continue
        t.set(f"model.optim.{option}", value, f"optimizers.{option}")
    t.set("trainer.gradient_clip_val", 1.0, "optimizers.optimizer_name")  # the Trainer's max_grad_norm
    sched_key = _spelling(t, k, "scheduler.scheduler_name", "scheduler.scheduler")
    kind = str(k[sched_key]).lower()
    if kind not in SCHEDULES:
        t.refuse(sched_key, f"expected one of {', '.join(SCHEDULES)}, found {show(k[sched_key])}")
        return
    sched = {"name": "TransformersSchedule", "type": kind}
    warmup = k["scheduler.warmup_steps"]
    number = isinstance(warmup, int | float) and not isinstance(warmup, bool) and math.isfinite(warmup)
    if number and 0 < warmup < 1:
        sched["warmup_ratio"] = warmup
    elif number and warmup >= 0 and warmup == int(warmup):
        sched["warmup_steps"] = int(warmup)
        if warmup == 0:
            sched["warmup_ratio"] = k["scheduler.warmup_ratio"]
        elif k["scheduler.warmup_ratio"] != QEFF_KEYS["scheduler.warmup_ratio"].default:
            t.notice(
                "scheduler.warmup_ratio",
                f"passed over: warmup_steps {int(warmup)} is above 0 and wins (set "
                "warmup_steps: 0 to warm up by the ratio)",
            )
    else:
        t.refuse("scheduler.warmup_steps", f"expected a step count or a ratio below 1, found {show(warmup)}")
    t.set("model.optim.sched", sched, sched_key, "scheduler.warmup_steps", "scheduler.warmup_ratio")


def _callbacks(t: Translation, k: Keys) -> None:
    if k.given("callbacks.early_stopping"):
        if not k["training.do_eval"] or _strategy(k["training.eval_strategy"]) == "no":
            t.refuse(
                "callbacks.early_stopping",
                "judges the evaluation loss; expected training.eval_strategy steps "
                "or epoch with do_eval, found no evaluation",
            )
        t.set("exp_manager.create_early_stopping_callback", True, "callbacks.early_stopping")
        params = "exp_manager.early_stopping_callback_params"
        t.set(
            f"{params}.patience",
            k["callbacks.early_stopping.early_stopping_patience"],
            "callbacks.early_stopping.early_stopping_patience",
        )
        t.set(
            f"{params}.min_delta",
            k["callbacks.early_stopping.early_stopping_threshold"],
            "callbacks.early_stopping.early_stopping_threshold",
        )
    if k.given("callbacks.json_logger"):
        path = k["callbacks.json_logger.log_path"] or "training_logs.jsonl"
        if not isinstance(path, str) or Path(path).name != path.removeprefix("./"):
            t.refuse(
                "callbacks.json_logger.log_path", f"expected a file name in training.output_dir, found {show(path)}"
            )
            return
        t.set("exp_manager.json_log_file", Path(path).name, "callbacks.json_logger")


def _dpo(t: Translation, k: Keys) -> None:
    dpo = "model_alignment_strategy.dpo"
    loss = k["dpo.loss_type"]
    if isinstance(loss, list):
        if len(loss) != 1:
            t.refuse("dpo.loss_type", f"expected one loss type, found {show(loss)} (nxd does not mix DPO losses)")
            return
        loss = loss[0]
    t.set(f"{dpo}.loss_type", loss, "dpo.loss_type")
    t.set(f"{dpo}.kl_beta", k["dpo.beta"], "dpo.beta")
    for key in ("label_smoothing", "max_prompt_length", "truncation_mode", "precompute_ref_log_probs"):
        if k[f"dpo.{key}"] is not None:
            t.set(f"{dpo}.{key}", k[f"dpo.{key}"], f"dpo.{key}")
    if k["dpo.max_prompt_length"] is None:
        length = k["dpo.max_length"] if k.given("dpo.max_length") else k["dataset.max_seq_length"]
        if isinstance(length, int):
            t.set(f"{dpo}.max_prompt_length", length // 2, "dpo.max_prompt_length")


__all__ = ["flatten", "translate"]
