"""GPT-NeoX's generate.py / eval.py keys (NeoXArgsTextgen) and DeepSpeed's autotuning block: the `generate`,
`eval` and `tune` sections that `nxd-train generate`, `nxd-train eval` and `nxd-train tune` read from the same
files."""

from __future__ import annotations

from ..errors import show
from .translation import Arguments, Translation, choice, mapping, typed

GENERATION = {
    "temperature": (float, int),
    "top_p": (float, int),
    "top_k": int,
    "maximum_tokens": int,
    "prompt_end": str,
    "sample_input_file": str,
    "sample_output_file": str,
    "num_samples": int,
    "recompute": bool,
    "return_logits": bool,
}
"""NeoX key -> the types its value may have (its name under `generate` is the same)."""


def inference_keys(a: Arguments, t: Translation) -> None:
    for key in (*GENERATION, "text_gen_type", "eval_tasks", "eval_results_prefix"):
        a[key]  # read: a key the file leaves at NeoX's default keeps the section's default, which is NeoX's
    if a.given("text_gen_type"):
        kind = choice(t, a, "text_gen_type", ("unconditional", "input-file", "interactive", "precompute"))
        if kind == "precompute":
            t.refuse(
                "text_gen_type",
                "expected unconditional, input-file or interactive: nxd computes a DPO or "
                "KTO run's reference log-probs itself, once, from the initial weights (no precompute pass)",
            )
        elif kind is not None:
            t.set("generate.text_gen_type", kind, "text_gen_type")
    for key, kind in GENERATION.items():
        if a.given(key) and (value := typed(t, a, key, kind, f"a value of type {_names(kind)}")) is not None:
            t.set(f"generate.{key}", float(value) if kind == (float, int) else value, key)
    if a.given("eval_tasks"):
        tasks = a["eval_tasks"]
        if isinstance(tasks, str):
            tasks = [tasks]
        if not isinstance(tasks, list) or not all(isinstance(task, str) for task in tasks):
            t.refuse("eval_tasks", f"expected a list of lm-evaluation-harness task names, found {tasks!r}")
        else:
            t.set("eval.tasks", tasks, "eval_tasks")
    if a.given("eval_results_prefix") and (prefix := typed(t, a, "eval_results_prefix", str, "a path prefix")):
        t.set("eval.results_prefix", prefix, "eval_results_prefix")


def _names(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))


AUTOTUNING = {
    "start_profile_step": "start_step",
    "end_profile_step": "end_step",
    "min_train_micro_batch_size_per_gpu": "min_micro_batch_size",
    "max_train_micro_batch_size_per_gpu": "max_micro_batch_size",
}
"""DeepSpeed's autotuning settings -> `tune`'s keys."""
TUNER_ONLY = (
    "fast",
    "results_dir",
    "exps_dir",
    "overwrite",
    "tuner_type",
    "tuner_early_stopping",
    "tuner_num_trials",
    "arg_mappings",
    "num_tuning_micro_batch_sizes",
    "mp_size",
    "model_info",
    "max_train_batch_size",
    "min_train_batch_size",
    "model_info_path",
)
"""DeepSpeed's tuner's own settings: nxd's search has no tuner, experiment folders or batch-size search."""


def autotuning_keys(a: Arguments, t: Translation) -> None:
    """DeepSpeed's autotuning block: the `tune` section nxd-train tune searches with (training itself ignores the
    block, as DeepSpeed's engine does outside its autotuner)."""
    block = mapping(t, "autotuning", a["autotuning"])
    if not block:
        return
    for key, value in block.items():
        if key in AUTOTUNING:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                t.refuse(f"autotuning.{key}", f"expected a positive whole number, found {show(value)}")
            else:
                t.set(f"tune.{AUTOTUNING[key]}", value, "autotuning")
        elif key == "metric":
            if value not in ("throughput", "latency", "flops"):
                t.refuse("autotuning.metric", f"expected throughput, latency or flops, found {show(value)}")
        elif key in TUNER_ONLY:
            t.notice(
                f"autotuning.{key}",
                "accepted, changes nothing here: DeepSpeed's tuner's own setting; nxd-train "
                "tune times every micro-batch size x ZeRO stage that fits",
            )
        elif key != "enabled":
            t.refuse(
                f"autotuning.{key}",
                f"unknown autotuning setting; expected one of enabled, metric, "
                f"{', '.join(AUTOTUNING)} or DeepSpeed's tuner settings",
            )
    if block.get("enabled"):
        t.notice(
            "autotuning",
            "the search runs with `nxd-train tune` on the same files (it writes the fastest "
            "micro-batch size and ZeRO stage as a config); training reads no autotuning setting",
        )
