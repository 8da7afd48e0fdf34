"""A config written back as an NxDT-dialect YAML file: the keys it sets, in the schema's order, with every
nxd extension (a key NxDT lacks, or a value it lacks) marked by a comment. Loading the file gives the same
config, so this is how a run read from another dialect migrates to NxDT's."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel

from .schema import NxdConfig, Status
from .schema._base import key_meta

EXTENSION = "  # nxd extension"


def to_nxdt_yaml(config: NxdConfig) -> str:
    """The keys `config` sets (as a file or a translation wrote them) as NxDT-dialect YAML."""
    return "".join(_lines(config, 0))


def _lines(section: BaseModel, depth: int) -> list[str]:
    lines, indent = [], "  " * depth
    fields = type(section).model_fields
    for name, field in sorted(fields.items(), key=lambda item: item[0] != "name"):  # a choice's name first
        if name not in section.model_fields_set:
            continue
        value, meta = getattr(section, name), key_meta(field)
        label = field.alias or name
        marked = meta.get("status") == str(Status.EXTENSION) or _plain(value) in meta.get("extension_values", ())
        mark = EXTENSION if marked else ""
        if isinstance(value, BaseModel):
            lines.append(f"{indent}{label}:{mark}\n")
            lines += _lines(value, depth + 1)
        else:
            lines.append(f"{indent}{label}: {_scalar(_plain(value))}{mark}\n")
    return lines


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    return value


def _scalar(value: Any) -> str:
    """One value on one line (lists and mappings in flow style)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, sort_keys=False).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()
