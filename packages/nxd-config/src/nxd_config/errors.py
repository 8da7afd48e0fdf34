"""Errors and notices that nxd-config reports to the user.

Every problem is one `ConfigIssue`: where it is (dotted key) and a message that says what was
expected and what was found. `ConfigError` carries all of them at once, so that a user fixes a
file in one pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MISSING: Any = object()


def show(value: Any) -> str:
    """Render a found value briefly and unambiguously (strings quoted, long values cut)."""
    if isinstance(value, Described):
        return str(value)
    if isinstance(value, dict):
        return "a mapping" if value else "an empty mapping"
    text = repr(list(value) if isinstance(value, tuple) else value)
    return text if len(text) <= 60 else text[:57] + "..."


class Described(str):
    """A found value that is a description ('no such file'), shown as is rather than quoted."""


@dataclass(frozen=True)
class ConfigIssue:
    """One problem: the dotted key path it concerns and the message about it."""

    path: str
    message: str

    @classmethod
    def mismatch(cls, path: str, expected: str, found: Any = MISSING, hint: str = "") -> ConfigIssue:
        """The usual issue: `expected ..., found ...` with an optional hint in parentheses."""
        message = f"expected {expected}"
        if found is not MISSING:
            message += f", found {show(found)}"
        if hint:
            message += f" ({hint})"
        return cls(path, message)

    def render(self, source: str | None = None) -> str:
        where = f"{source}: " if source else ""
        return f"{where}{self.path or '<root>'}: {self.message}"


class ConfigError(ValueError):
    """A config could not be loaded; `issues` lists every problem found."""

    def __init__(self, issues: list[ConfigIssue] | ConfigIssue, source: str | None = None):
        self.issues: list[ConfigIssue] = [issues] if isinstance(issues, ConfigIssue) else list(issues)
        self.source = source
        super().__init__(str(self))

    def __str__(self) -> str:
        lines = [issue.render(self.source) for issue in self.issues]
        if len(lines) == 1:
            return lines[0]
        return f"{len(lines)} problems in the config:\n" + "\n".join(f"  {line}" for line in lines)


class ConfigNotice(UserWarning):
    """A config is valid but something deserves the user's attention (an ignored knob, say)."""


class ConfigDeprecation(ConfigNotice, FutureWarning):
    """An older spelling of a key or value was accepted and rewritten to the current one."""
