"""The key reference table (key, type, default, effect, used by, status), generated from the schema.

python -m nxd_config.reference            print the table as Markdown
python -m nxd_config.reference --update docs/config-reference.md   rewrite the table between its markers
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from .schema import Status
from .schema._base import alternatives, key_meta
from .validation import iter_keys

START, END = "<!-- keys:start -->", "<!-- keys:end -->"


@dataclass(frozen=True)
class KeyRow:
    """One key of the schema as the reference documents it (`default` is JSON, "required" or "(section)")."""

    key: str
    type: str
    default: str
    effect: str
    used_by: str
    status: str


def key_rows(prefix: str = "") -> list[KeyRow]:
    """Every key of the schema, depth first; only `prefix` and the keys under it when given. A key under one
    choice of a section carries the choice: `model.optim[sgd].momentum`."""
    rows = []
    for path, field, owners in iter_keys():
        if prefix and not (path == prefix or path.startswith((f"{prefix}.", f"{prefix}["))):
            continue
        extra = key_meta(field)
        if len(owners) > 1 and path.endswith(".name"):
            names = " | ".join(json.dumps(typing.get_args(o.model_fields["name"].annotation)[0]) for o in owners)
            rows.append(
                KeyRow(
                    path, names, "required", "Which one; selects the keys below.", _by(owners[0]), str(Status.HONOURED)
                )
            )
            continue
        status = extra.get("status", str(Status.HONOURED))
        note = extra.get("note", "")
        if _is_section(field.annotation):  # a section's status says something only when it limits the section
            status, default = ("" if "status" not in extra else status), "(section)"
        else:
            default = _default(field.default)
        rows.append(
            KeyRow(
                path,
                _type(field.annotation),
                default,
                field.description or "",
                extra.get("by", ""),
                f"{status}: {note}" if note else status,
            )
        )
    return rows


def key_table() -> str:
    """Every key of the schema as a Markdown table."""
    rows = ["| key | type | default | effect | used by | status |", "|---|---|---|---|---|---|"]
    for row in key_rows():
        cells = [
            f"`{row.key}`",
            row.type,
            row.default if row.default in ("required", "(section)") else f"`{row.default}`",
            row.effect,
            row.used_by,
            row.status,
        ]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def dialect_key_table(title: str, headers: list[str], keys: list[Any], cells: Callable[[Any], list[str]]) -> str:
    """A dialect's key table: a line counting `keys` by status (mapped, notice, refused), then one row of
    `cells(key)` under `headers` per key."""
    tally = Counter(str(key.status) for key in keys)
    summary = ", ".join(f"{tally[status]} {status}" for status in ("mapped", "notice", "refused"))
    rows = [f"{len(keys)} {title}: {summary}.", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    rows += ["| " + " | ".join(cell.replace("|", "\\|") for cell in cells(key)) + " |" for key in keys]
    return "\n".join(rows) + "\n"


def _by(model: type[BaseModel]) -> str:
    return next((key_meta(f)["by"] for f in model.model_fields.values() if key_meta(f).get("by")), "")


def _is_section(annotation: Any) -> bool:
    args = [a for a in alternatives(annotation) if a is not type(None)]
    return bool(args) and all(isinstance(a, type) and issubclass(a, BaseModel) for a in args)


def _type(annotation: Any) -> str:
    names = []
    for arg in alternatives(annotation):
        origin = typing.get_origin(arg)
        if arg is type(None):
            name = "null"
        elif origin is typing.Literal:
            name = " | ".join(json.dumps(v) for v in typing.get_args(arg))
        elif origin is tuple:
            items = typing.get_args(arg)
            name = f"list[{_type(items[0])}]" if items else "list"
        elif isinstance(arg, type) and issubclass(arg, BaseModel):
            name = "mapping"
        else:
            name = getattr(arg, "__name__", str(arg))
        if name not in names:
            names.append(name)
    return " | ".join(names)


def _default(value: Any) -> str:
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, tuple):
        value = list(value)
    return json.dumps(value)


def update(readme: Path) -> bool:
    """Rewrite the table between the markers in `readme`; True if it changed."""
    return rewrite_between(readme, START, END, key_table())


def rewrite_between(readme: Path, start: str, end: str, content: str) -> bool:
    """Replace what lies between the markers `start` and `end` in `readme` with `content`; True if it changed."""
    text = readme.read_text(encoding="utf-8")
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    new = f"{head}{start}\n{content}{end}{tail}"
    if new == text:
        return False
    temporary = readme.with_suffix(readme.suffix + ".tmp")
    temporary.write_text(new, encoding="utf-8")
    temporary.replace(readme)
    return True


def table_command(
    argv: list[str] | None, prog: str, doc: str | None, table: Callable[[], str], rewrite: Callable[[Path], bool]
) -> int:
    """A generated table's command line: print `table()`, or `--update README` rewrites it there."""
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    parser.add_argument("--update", type=Path, metavar="README", help="rewrite the table in this file")
    args = parser.parse_args(argv)
    if args.update:
        print(f"{args.update}: {'updated' if rewrite(args.update) else 'already current'}")
    else:
        sys.stdout.write(table())
    return 0


def main(argv: list[str] | None = None) -> int:
    return table_command(argv, "python -m nxd_config.reference", __doc__, key_table, update)


if __name__ == "__main__":
    sys.exit(main())
