"""Built-in record formatters that `prompt_func` / `completion_func` may name (`nxd_data.formatters:NAME`).

`alpaca_prompt` is the Alpaca prompt (Stanford Alpaca's template, as QEfficient's alpaca function writes it):
with an instruction only when the row's `input` is empty, with both otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes "
    "the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"
)
ALPACA_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n### Instruction:\n"
    "{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)


def alpaca_prompt(row: Mapping[str, Any]) -> str:
    """The Alpaca prompt of a row with `instruction` and `input` columns."""
    return (ALPACA_NO_INPUT if row["input"] == "" else ALPACA_WITH_INPUT).format_map(row)
