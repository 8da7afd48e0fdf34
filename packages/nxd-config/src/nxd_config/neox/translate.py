"""A merged GPT-NeoX argument set -> an NxDT-dialect config tree, with NeoX's rules and defaults.

Every key of the file is judged by its entry in `keys.NEOX_KEYS`: a notice key set away from NeoX's default
gets a notice, a refused one an error, and the mapped ones are translated group by group (`model_keys`,
`training_keys`, `file_keys`), each reading its NeoX keys (with NeoX's defaults where the file is silent) and
writing the nxd keys they become. What NeoX derives while it runs (batch arithmetic, the MLP width, the
attention layout, the learning-rate horizon) is derived the way NeoX derives it, so the tree holds plain values.
"""

from __future__ import annotations

import difflib
from typing import Any

from ..errors import show
from . import file_keys, inference_keys, model_keys, post_training_keys, training_keys
from .keys import NEOX_KEYS, KeyStatus, NeoXKey
from .translation import Arguments, Translation, is_default, mapping

GROUPS = (
    model_keys.model_keys,
    model_keys.sharing_keys,
    model_keys.soft_prompt_keys,
    model_keys.mup_keys,
    model_keys.attention_keys,
    model_keys.mlp_keys,
    model_keys.moe_keys,
    training_keys.parallel_keys,
    training_keys.launcher_keys,
    training_keys.precision_keys,
    training_keys.float8_keys,
    training_keys.optimizer_keys,
    training_keys.loop_keys,
    file_keys.data_keys,
    post_training_keys.post_training_keys,
    file_keys.tokenizer_keys,
    file_keys.checkpoints_keys,
    file_keys.resume_keys,
    file_keys.logging_keys,
    inference_keys.inference_keys,
    inference_keys.autotuning_keys,
)
"""Each group of mapped keys, in the order they are translated."""


def translate(values: dict[str, Any], name: str) -> Translation:
    """The NxDT tree of NeoX arguments `values` (canonical spellings); `name` names the run."""
    t = Translation()
    values = _with_extra_deepspeed_args(t, values)
    a = Arguments(values)
    for key, value in values.items():
        entry = NEOX_KEYS.get(key)
        if entry is None:
            close = difflib.get_close_matches(key, list(NEOX_KEYS), n=1, cutoff=0.7)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            t.refuse(key, f"unknown key; expected a GPT-NeoX argument{hint}")
        elif entry.status is not KeyStatus.MAPPED and not is_default(value, entry.default):
            _judge(t, entry, value)
    t.set("name", name)
    for group in GROUPS:
        group(a, t)
    t.read = a.read
    return t


def _with_extra_deepspeed_args(t: Translation, values: dict[str, Any]) -> dict[str, Any]:
    """`deepspeed_extra_args` holds DeepSpeed config keys that NeoX passes on as they are: each is read as
    the DeepSpeed key of that name written at the top level."""
    if values.get("deepspeed_extra_args") is None:
        return values
    extra = mapping(t, "deepspeed_extra_args", values["deepspeed_extra_args"])
    if extra is None:
        return values
    merged = {key: value for key, value in values.items() if key != "deepspeed_extra_args"}
    for key, value in extra.items():
        entry = NEOX_KEYS.get(key)
        if entry is None or entry.group != "DeepSpeed" or key == "deepspeed_extra_args":
            t.refuse(
                f"deepspeed_extra_args.{key}",
                "expected a DeepSpeed config key (such as comms_logger or flops_profiler)",
            )
        elif key in merged:
            t.refuse(f"deepspeed_extra_args.{key}", f"expected {key} once, found it at the top level too")
        else:
            merged[key] = value
    return merged


def _judge(t: Translation, entry: NeoXKey, value: Any) -> None:
    if entry.status is KeyStatus.NOTICE:
        t.notice(entry.name, f"accepted, changes nothing here: {entry.note}")
    else:
        t.refuse(entry.name, f"expected {show(entry.default)} (GPT-NeoX's default), found {show(value)}: {entry.note}")
