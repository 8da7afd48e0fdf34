"""Which dialect a config file speaks: NxDT's (sections such as `trainer`, `model`, `data`), GPT-NeoX's
(flat NeoX argument names, one or several files) or QEfficient's fine-tuning file (sections `model`,
`dataset`, `training`, `optimizers`, `scheduler`, `callbacks`). A run reads files of one dialect."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import ConfigError, ConfigIssue
from .neox.files import canonical
from .neox.keys import NEOX_KEYS
from .qeff.keys import OWN_SECTIONS, SECTIONS

DIALECTS = ("nxdt", "neox", "qeff")
NXDT_SECTIONS = (
    "trainer",
    "exp_manager",
    "distributed_strategy",
    "data",
    "model",
    "precision",
    "model_alignment_strategy",
)


def detect(values: Mapping[str, Any]) -> str | None:
    """ "nxdt" when the file has an NxDT section, "qeff" when it has QEfficient's, "neox" when its keys are NeoX
    arguments, None when it is neither (an empty file, or keys of no dialect)."""
    foreign = [key for key in values if key not in SECTIONS and (key in NXDT_SECTIONS or canonical(key) in NEOX_KEYS)]
    if set(OWN_SECTIONS) & set(values) and not foreign:  # a misspelt section of its own stays QEfficient's
        return "qeff"
    if any(isinstance(values.get(section), Mapping) for section in NXDT_SECTIONS):
        return "nxdt"
    known = [key for key in values if canonical(key) in NEOX_KEYS]
    return "neox" if known else None


def dialect_of(files: list[tuple[str, Mapping[str, Any]]], forced: str | None = None) -> str:
    """The one dialect of `files` (name, top-level mapping): `forced`, or the one they show (NxDT when none
    shows one). Files of both dialects, or several NxDT files, are an error naming them."""
    if forced is not None and forced not in DIALECTS:
        raise ConfigError(ConfigIssue.mismatch("--dialect", f"one of {', '.join(DIALECTS)}", forced))
    seen = {name: forced or detect(values) for name, values in files}
    kinds = {kind for kind in seen.values() if kind is not None}
    if kinds == {"nxdt", "neox"}:
        neox = next(name for name, kind in seen.items() if kind == "neox")
        nxdt = next(name for name, kind in seen.items() if kind == "nxdt")
        raise ConfigError(
            ConfigIssue(neox, f"a GPT-NeoX config, and {nxdt} an NxDT config; expected files of one dialect")
        )
    if "qeff" in kinds and (len(kinds) > 1 or len(files) > 1):
        raise ConfigError(
            ConfigIssue(
                files[-1][0],
                "a second config beside a QEfficient fine-tuning file; expected "
                "that one file (its sections hold the whole run)",
            )
        )
    kind = kinds.pop() if kinds else "nxdt"
    if kind == "nxdt" and len(files) > 1:
        raise ConfigError(
            ConfigIssue(files[1][0], f"a second NxDT config after {files[0][0]}; expected one (NxDT takes one file)")
        )
    return kind
