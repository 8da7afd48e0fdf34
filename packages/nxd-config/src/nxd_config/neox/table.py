"""The GPT-NeoX key table (key, group, NeoX default, status, nxd consumer, note), generated from `keys.NEOX_KEYS`.

python -m nxd_config.neox.table                     print the table as Markdown
python -m nxd_config.neox.table --update docs/config-reference.md  rewrite the table between its markers
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..reference import dialect_key_table, rewrite_between, table_command
from .keys import NEOX_KEYS

START, END = "<!-- neox-keys:start -->", "<!-- neox-keys:end -->"


def key_table() -> str:
    """Every NeoX argument as a Markdown table, with a line counting them by status."""
    return dialect_key_table(
        "GPT-NeoX arguments",
        ["key", "group", "NeoX default", "status", "nxd", "note"],
        list(NEOX_KEYS.values()),
        lambda key: [
            f"`{key.name}`",
            key.group,
            f"`{json.dumps(key.default)}`",
            str(key.status),
            f"`{key.consumer}`" if key.consumer else "",
            key.note,
        ],
    )


def update(readme: Path) -> bool:
    """Rewrite the table between the markers in `readme`; True if it changed."""
    return rewrite_between(readme, START, END, key_table())


def main(argv: list[str] | None = None) -> int:
    return table_command(argv, "python -m nxd_config.neox.table", __doc__, key_table, update)


if __name__ == "__main__":
    sys.exit(main())
