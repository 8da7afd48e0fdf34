"""GPT-NeoX's generate.py / eval.py keys (NeoXArgsTextgen): the `generate` and `eval` sections that
`nxd-train generate` and `nxd-train eval` read from the same files."""

from __future__ import annotations

from .translation import Arguments, Translation, choice, typed

GENERATION = {"temperature": (float, int), "top_p": (float, int), "top_k": int, "maximum_tokens": int,
              "prompt_end": str, "sample_input_file": str, "sample_output_file": str, "num_samples": int,
              "recompute": bool, "return_logits": bool}  # fmt: skip
"""NeoX key -> the types its value may have (its name under `generate` is the same)."""


def inference_keys(a: Arguments, t: Translation) -> None:
    for key in (*GENERATION, "text_gen_type", "eval_tasks", "eval_results_prefix"):
        a[key]  # read: a key the file leaves at NeoX's default keeps the section's default, which is NeoX's
    if a.given("text_gen_type"):
        kind = choice(t, a, "text_gen_type", ("unconditional", "input-file", "interactive", "precompute"))
        if kind == "precompute":
            t.refuse("text_gen_type", "expected unconditional, input-file or interactive: nxd computes a DPO or "
                     "KTO run's reference log-probs itself, once, from the initial weights (no precompute pass)")
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
