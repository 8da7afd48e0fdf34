"""Building blocks of the schema: the section base class and the per-key metadata.

Every key is declared with `key(...)`, which records what the key does, which nxd package acts
on it and its status. The key reference table (the repository's docs/config-reference.md) is generated from these
declarations, so the documentation cannot drift from the schema.
"""

from __future__ import annotations

import types
import typing
import unicodedata
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field


class Status(StrEnum):
    """What nxd does with a key."""

    HONOURED = "honoured"
    """The key does what the reference says."""
    NEURON_ONLY = "Neuron only"
    """Acted on only on AWS Neuron devices; elsewhere accepted and reported as ignored."""
    NO_EFFECT = "no effect"
    """Accepted for compatibility; the note says why it changes nothing in nxd."""
    LIMITED = "limited"
    """Only some values are supported; the others are rejected with a message saying so."""
    EXTENSION = "nxd extension"
    """A key nxd adds to the dialect (NxDT does not read it); its default keeps NxDT files meaning the same."""


def key(
    default: Any = ...,
    doc: str = "",
    *,
    by: str = "",
    status: Status = Status.HONOURED,
    note: str = "",
    alias: str | None = None,
    expected: str | None = None,
    extension_values: tuple[Any, ...] = (),
    **constraints: Any,
) -> Any:
    """Declare a config key: its default, effect (`doc`), consuming package (`by`) and status.

    `expected` words what a key with alternative types accepts, for error messages; `extension_values` are
    the values nxd adds to a key NxDT defines (a written config marks them as nxd extensions).
    """
    extra: dict[str, Any] = {"status": str(status), "by": by, "note": note}
    if expected:
        extra["expected"] = expected
    if extension_values:
        extra["extension_values"] = list(extension_values)
    return Field(default, description=doc, alias=alias, json_schema_extra=extra, **constraints)


def key_meta(field: Any) -> dict[str, Any]:
    """What `key(...)` recorded for a field: status, by, note and, where given, expected."""
    return field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}


def alternatives(annotation: Any) -> list[Any]:
    """The types an annotation admits, through Annotated, Optional and unions."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return alternatives(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [alt for arg in typing.get_args(annotation) for alt in alternatives(arg)]
    return [annotation]


def _list_to_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def frozen_list(item: Any) -> Any:
    """A YAML list stored as a tuple, so that the loaded config stays immutable."""
    return Annotated[tuple[item, ...], BeforeValidator(_list_to_tuple)]


def _none_string_to_none(value: Any) -> Any:
    return None if isinstance(value, str) and value in ("None", "none", "null") else value


NoneString = BeforeValidator(_none_string_to_none)
"""Some published NxDT configs write `None` (a string in YAML) where they mean null."""


def _one_line(value: Any) -> Any:
    if isinstance(value, str):
        for position, char in enumerate(value):
            if unicodedata.category(char) in ("Cc", "Zl", "Zp"):  # control characters, line and paragraph breaks
                raise ValueError(
                    f"expected one line of text without control characters (it is written into job "
                    f"scripts), found {value!r}: {char!r} at position {position}"
                )
    return value


OneLine = Annotated[str, AfterValidator(_one_line)]
"""Text that `nxd-train launch` writes into a script line (an #SBATCH directive, a comment): a newline there would
end the line and make the rest a shell command."""


class Section(BaseModel):
    """Base of every config section: strict types, no unknown keys, immutable once loaded."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        populate_by_name=True,
        protected_namespaces=(),
        allow_inf_nan=False,  # no key means anything at inf or NaN (YAML reads 1e400 as inf)
    )

    def is_set(self, name: str) -> bool:
        """Whether the user wrote this key (as opposed to it taking its default)."""
        return name in self.model_fields_set
