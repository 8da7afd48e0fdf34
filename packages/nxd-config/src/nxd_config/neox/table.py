"""The GPT-NeoX key table (key, group, NeoX default, status, nxd consumer, note), generated from `keys.NEOX_KEYS`.

    python -m nxd_config.neox.table                     print the table as Markdown
    python -m nxd_config.neox.table --update README.md  rewrite the table between its markers
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from ..reference import rewrite_between, table_command
from .keys import NEOX_KEYS, KeyStatus

START, END = "<!-- neox-keys:start -->", "<!-- neox-keys:end -->"


def counts() -> dict[KeyStatus, int]:
    """How many NeoX keys are mapped, noticed and refused."""
    found = Counter(key.status for key in NEOX_KEYS.values())
    return {status: found[status] for status in KeyStatus}


def key_table() -> str:
    """Every NeoX argument as a Markdown table, with a line counting them by status."""
    tally = counts()
    summary = ", ".join(f"{tally[status]} {status}" for status in KeyStatus)
    rows = [f"{len(NEOX_KEYS)} GPT-NeoX arguments: {summary}.", "",
            "| key | group | NeoX default | status | nxd | note |", "|---|---|---|---|---|---|"]  # fmt: skip
    for key in NEOX_KEYS.values():
        cells = [f"`{key.name}`", key.group, f"`{json.dumps(key.default)}`", str(key.status),
                 f"`{key.consumer}`" if key.consumer else "", key.note]  # fmt: skip
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def update(readme: Path) -> bool:
    """Rewrite the table between the markers in `readme`; True if it changed."""
    return rewrite_between(readme, START, END, key_table())


def main(argv: list[str] | None = None) -> int:
    return table_command(argv, "python -m nxd_config.neox.table", __doc__, key_table, update)


if __name__ == "__main__":
    sys.exit(main())
