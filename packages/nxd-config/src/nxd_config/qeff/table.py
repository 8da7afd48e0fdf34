"""The QEfficient key table (key, QEfficient default, status, nxd consumer, note), generated from
`keys.QEFF_KEYS`, and the table of Trainer and TRL fields a QEfficient file may carry (`trainer_fields`).

    python -m nxd_config.qeff.table                     print the key table as Markdown
    python -m nxd_config.qeff.table --update docs/config-reference.md  rewrite both tables between their markers
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..reference import dialect_key_table, rewrite_between, table_command
from .keys import QEFF_KEYS
from .trainer_fields import field_table

START, END = "<!-- qeff-keys:start -->", "<!-- qeff-keys:end -->"
FIELDS_START, FIELDS_END = "<!-- qeff-trainer-fields:start -->", "<!-- qeff-trainer-fields:end -->"


def key_table() -> str:
    """Every QEfficient key as a Markdown table, with a line counting them by status."""
    return dialect_key_table(
        "QEfficient fine-tuning keys",
        ["key", "QEfficient default", "status", "nxd", "note"],
        list(QEFF_KEYS.values()),
        lambda key: [
            f"`{key.name}`",
            f"`{json.dumps(key.default)}`",
            str(key.status),
            f"`{key.consumer}`" if key.consumer else "",
            key.note,
        ],
    )


def update(readme: Path) -> bool:
    """Rewrite both tables between their markers in `readme`; True if either changed."""
    keys = rewrite_between(readme, START, END, key_table())
    return rewrite_between(readme, FIELDS_START, FIELDS_END, field_table()) or keys


def main(argv: list[str] | None = None) -> int:
    return table_command(argv, "python -m nxd_config.qeff.table", __doc__, key_table, update)


if __name__ == "__main__":
    sys.exit(main())
