"""Rewards of sampled completions: Python functions named by import path and the built-in verifiable ones.

A reward is called with the step's prompts and completions (texts, or assistant messages for chat prompts), the
completions' token ids (and nxd's `prompt_ids`) and each of the records' other fields as a list, as TRL calls its
reward functions (so a function takes **kwargs for what it does not read), and
returns one float per completion, or None where it has no opinion (left out of the weighted sum). `checked` runs
one and says, in one line naming it and the record, what is wrong with what it returned.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

RewardFunction = Callable[..., Sequence[float | None]]
BUILTINS = ("exact_match", "regex", "numeric", "format")
ANSWER_MARK = re.compile(r"####\s*(-?[\d,]*\.?\d+)")
NUMBER = re.compile(r"-?\d[\d,]*\.?\d*|-?\.\d+")


class RewardError(Exception):
    """A reward that cannot be loaded, raised, or returned what a reward may not (the message names it)."""


@dataclass(frozen=True)
class Reward:
    name: str
    function: RewardFunction | None
    """None until a caller that loads it supplies it (a reward model)."""
    weight: float = 1.0


def import_reward(path: str, key: str) -> RewardFunction:
    """The function at `path` ("module:function"); a RewardError naming `key` when it does not import."""
    module_name, _, function_name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # the user's module may fail in any way on import
        raise RewardError(f"{key}: {path}: the module does not import ({type(error).__name__}: {error})") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise RewardError(f"{key}: {path}: expected a function {function_name} in {module_name}, found none")
    return function


def completion_text(completion: str | list[dict[str, str]]) -> str:
    """A completion's text (an assistant message's content for chat prompts)."""
    return completion if isinstance(completion, str) else "".join(m.get("content", "") for m in completion)


def numeric_answer(text: str) -> float | None:
    """The answer a completion gives: the number after '####' (GSM8K's mark), else its last number; None without."""
    found = ANSWER_MARK.findall(text) or NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def builtin_reward(
    kind: str, *, field: str = "answer", pattern: str | None = None, tolerance: float = 0.0
) -> RewardFunction:
    """A verifiable reward (1 or 0 a completion): exact_match and numeric against the record's `field`, regex
    (`pattern` found in the completion) and format (the whole completion matches `pattern`)."""
    if kind in ("regex", "format"):
        compiled = re.compile(pattern or "")

        def matches(completions: Sequence[Any], **_: Any) -> list[float]:
            test = compiled.search if kind == "regex" else compiled.fullmatch
            return [float(test(completion_text(c).strip()) is not None) for c in completions]

        return matches
    if kind not in ("exact_match", "numeric"):
        raise RewardError(f"builtin: expected one of {', '.join(BUILTINS)}, found {kind!r}")

    def against_field(completions: Sequence[Any], **fields: Any) -> list[float]:
        if field not in fields:
            raise RewardError(f"expected a {field} field in each record, found none (fields: {', '.join(fields)})")
        scores = []
        for completion, expected in zip(completions, fields[field], strict=True):
            text = completion_text(completion).strip()
            if kind == "exact_match":
                scores.append(float(text == str(expected).strip()))
            else:
                given, wanted = numeric_answer(text), numeric_answer(str(expected))
                scores.append(float(given is not None and wanted is not None and abs(given - wanted) <= tolerance))
        return scores

    return against_field


def checked(reward: Reward, count: int, call: Callable[[RewardFunction], Any], places: Sequence[str]) -> list[float]:
    """`reward`'s scores of `count` completions (NaN where it gave None); a RewardError naming the reward and the
    first record concerned when it raises, returns another count, or returns NaN or what is not a number."""
    try:
        scores = call(reward.function)
    except RewardError as error:
        raise RewardError(f"reward {reward.name}: {error} ({places[0]})") from None
    except Exception as error:  # a user's function may fail in any way
        raise RewardError(f"reward {reward.name}: raised {type(error).__name__}: {error} ({places[0]})") from None
    try:
        scores = list(scores)
    except TypeError:
        raise RewardError(
            f"reward {reward.name}: expected a list of {count} numbers, found {type(scores).__name__} ({places[0]})"
        ) from None
    if len(scores) != count:
        raise RewardError(
            f"reward {reward.name}: expected {count} scores (one a completion), found {len(scores)} ({places[0]})"
        )
    values = []
    for index, score in enumerate(scores):
        if score is None:
            values.append(math.nan)
            continue
        if isinstance(score, bool) or not isinstance(score, int | float) or math.isnan(score):
            raise RewardError(
                f"reward {reward.name}: expected a number or None for each completion, found {score!r} "
                f"({places[index]})"
            )
        values.append(float(score))
    return values
