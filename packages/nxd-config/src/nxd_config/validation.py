"""Schema validation that reports every problem at once.

pydantic stops before model-level checks when a field is invalid, but a user should see a wrong
type, an unknown key and a broken cross-field rule in one run. So invalid entries are removed
(their defaults take over) and validation is repeated until the config builds; the cross-field
rules then run on that repaired config, and any rule finding that depends on a repaired key is
dropped, because it would be about a value the user did not write.
"""

from __future__ import annotations

import copy
import difflib
import functools
import re
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ValidationError

from .aliases import KEY_ALIASES
from .errors import MISSING, ConfigIssue
from .schema import NxdConfig
from .schema._base import alternatives, key_meta

_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "tuple_type": "a list",
    "list_type": "a list",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dict_type": "a mapping",
    "none_required": "null",
}
_MAX_REPAIRS = 50


def validate(raw: dict[str, Any]) -> tuple[NxdConfig | None, list[ConfigIssue], list[str]]:
    """Validate a resolved config tree: the config (None if it cannot be built), its type
    issues, and the dotted paths that had to be repaired to build it."""
    data = copy.deepcopy(raw)
    issues: list[ConfigIssue] = []
    repaired: list[str] = []
    for _ in range(_MAX_REPAIRS):
        try:
            return NxdConfig.model_validate(data), issues, repaired
        except ValidationError as error:
            found = _issues_from(error, data)
            issues.extend(
                issue
                for issue in found
                if issue not in issues and not any(_within(issue.path, path) for path in repaired)
            )
            progress = False
            for entry in error.errors():
                keys = _existing_keys(entry["loc"], data, for_repair=True)
                if _remove(data, keys):
                    repaired.append(dotted(keys))
                    progress = True
            if not progress:
                break
    return None, issues, repaired


def _within(path: str, ancestor: str) -> bool:
    return path == ancestor or path.startswith((ancestor + ".", ancestor + "["))


def dotted(keys: list[str | int] | tuple[str | int, ...]) -> str:
    """('model', 'optim', 'betas', 1) -> 'model.optim.betas[1]'."""
    text = ""
    for part in keys:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _issues_from(error: ValidationError, data: dict[str, Any]) -> list[ConfigIssue]:
    """One issue per key: union alternatives at the same key are merged into one 'or'."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for entry in error.errors():
        keys = _existing_keys(entry["loc"], data, keep_absent_leaf=entry["type"] == "missing")
        grouped.setdefault(dotted(keys), []).append(entry)
    return [_issue(path, entries) for path, entries in grouped.items()]


def _issue(path: str, entries: list[dict[str, Any]]) -> ConfigIssue:
    first = entries[0]
    kind = first["type"]
    if kind == "extra_forbidden":
        return _unknown_key(path, first["loc"])
    if kind in ("value_error", "assertion_error"):
        return ConfigIssue(path, first["msg"].removeprefix("Value error, "))
    if kind == "union_tag_invalid":
        ctx = first["ctx"]
        tags = [tag.strip("'") for tag in ctx["expected_tags"].split(", ")]
        hint = _close(ctx["tag"], tags)
        return ConfigIssue.mismatch(
            f"{path}.name", f"one of {', '.join(tags)}", ctx["tag"], f"did you mean {hint!r}?" if hint else ""
        )
    if kind == "union_tag_not_found":
        return ConfigIssue.mismatch(path, f"a mapping with a 'name' key ({first['ctx']['discriminator']})")
    if kind == "missing":
        return ConfigIssue.mismatch(path, "a value (this key is required)")
    custom = _field_expected(first["loc"])
    if custom and len(entries) > 1:
        return ConfigIssue.mismatch(path, custom, first.get("input", MISSING))
    expected: list[str] = []
    for entry in entries:
        text = _expected(entry)
        if text not in expected:
            expected.append(text)
    found = first.get("input", MISSING)
    if kind == "literal_error" and len(entries) == 1 and isinstance(found, str):
        hint = _close(found, re.findall(r"'([^']*)'", first["ctx"]["expected"]))
        if hint:
            return ConfigIssue.mismatch(path, " or ".join(expected), found, f"did you mean {hint!r}?")
    return ConfigIssue.mismatch(path, " or ".join(expected), found)


def _expected(entry: dict[str, Any]) -> str:
    kind, ctx = entry["type"], entry.get("ctx", {})
    if kind == "literal_error":
        return f"one of {ctx['expected']}"
    bounds = {
        "greater_than": ">",
        "greater_than_equal": ">=",
        "less_than": "<",
        "less_than_equal": "<=",
    }
    if kind in bounds:
        limit = next(iter(ctx.values()))
        return f"a value {bounds[kind]} {limit}"
    if kind in ("too_short", "too_long"):
        count = ctx.get("min_length") if kind == "too_short" else ctx.get("max_length")
        return f"a list of {count} items (found {ctx.get('actual_length')})"
    return _EXPECTED.get(kind, entry["msg"].lower().removeprefix("input should be "))


def _unknown_key(path: str, loc: tuple[Any, ...]) -> ConfigIssue:
    name = str(loc[-1])
    parent = _model_at(loc[:-1])
    siblings = _key_names(parent) if parent else []
    hint = _close(name, siblings)
    if hint:
        suggestion = f"did you mean {hint!r}?"
    else:
        elsewhere = [p for p in all_key_paths() if p.rsplit(".", 1)[-1] == name and "[" not in p]
        suggestion = f"did you mean {elsewhere[0]!r}?" if elsewhere else ""
    section = path.rpartition(".")[0] or "the top level"
    tail = f" ({suggestion})" if suggestion else ""
    return ConfigIssue(path, f"unknown key; expected a key that {section} defines{tail}")


def _close(word: str, candidates: list[str]) -> str | None:
    by_lower = {candidate.lower(): candidate for candidate in candidates}
    matches = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[matches[0]] if matches else None


# ----------------------------------------------------------------------- locating keys in data


def _existing_keys(
    loc: tuple[Any, ...], data: Any, *, keep_absent_leaf: bool = False, for_repair: bool = False
) -> list[str | int]:
    """Map a pydantic location onto the user's tree, skipping union-member tags.

    An absent trailing key (a missing required key) is kept for reporting when asked; for
    repair, a list is removed whole, and a missing key's enclosing mapping is removed.
    """
    keys: list[str | int] = []
    node = data
    for index, part in enumerate(loc):
        last = index == len(loc) - 1
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list | tuple) and isinstance(part, int) and part < len(node)
        if in_dict or in_list:
            keys.append(part)
            node = node[part]
        elif isinstance(node, dict) and last and keep_absent_leaf:
            keys.append(part)
        elif not isinstance(node, dict | list | tuple):
            break
    if for_repair:
        while keys and isinstance(keys[-1], int):
            keys.pop()  # repair a list by dropping the whole key
    return keys


def _remove(data: dict[str, Any], keys: list[str | int]) -> bool:
    if not keys:
        return False
    node: Any = data
    for part in keys[:-1]:
        node = node[part]
    if isinstance(node, dict) and keys[-1] in node:
        del node[keys[-1]]
        return True
    return False


# ----------------------------------------------------------------------- walking the schema


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The sections (BaseModel classes) an annotation admits, or a list of it holds."""
    found = []
    for alt in alternatives(annotation):
        if typing.get_origin(alt) is tuple:
            found += [item for arg in typing.get_args(alt) if arg is not Ellipsis for item in _models_in(arg)]
        elif isinstance(alt, type) and issubclass(alt, BaseModel):
            found.append(alt)
    return found


def _field(model: type[BaseModel], name: str) -> Any:
    for field_name, field in model.model_fields.items():
        if name in (field_name, field.alias):
            return field
    return None


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The schema class that holds the keys at a pydantic location."""
    candidates: list[type[BaseModel]] = [NxdConfig]
    for part in loc:
        if isinstance(part, int):
            continue
        tagged = [model for model in candidates if _tag(model) == part]
        if len(candidates) > 1 and tagged:
            candidates = tagged
            continue
        field = next((f for f in (_field(m, part) for m in candidates) if f is not None), None)
        if field is None:
            return None
        candidates = _models_in(field.annotation)
        if not candidates:
            return None
    return candidates[0] if len(candidates) == 1 else None


def _field_expected(loc: tuple[Any, ...]) -> str | None:
    """A key's own wording of what it accepts, when its type is a union of alternatives."""
    for end in range(len(loc), 0, -1):
        model = _model_at(loc[: end - 1])
        field = _field(model, loc[end - 1]) if model and isinstance(loc[end - 1], str) else None
        if field is not None:
            return key_meta(field).get("expected")
    return None


def _tag(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("name")
    if field is None or typing.get_origin(field.annotation) is not typing.Literal:
        return None
    return typing.get_args(field.annotation)[0]


def _key_names(model: type[BaseModel]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]


@functools.cache
def all_key_paths() -> tuple[str, ...]:
    """Every dotted key the schema defines (optimizer/scheduler keys under each choice)."""
    return tuple(path for path, _, _ in iter_keys())


@functools.cache
def defined_keys() -> frozenset[str]:
    """Every dotted key a file may set, choices merged (model.optim.momentum), older spellings included."""
    return frozenset(re.sub(r"\[[^]]*\]", "", path) for path in all_key_paths()) | {old for old, _ in KEY_ALIASES}


def iter_keys(
    model: type[BaseModel] = NxdConfig, prefix: str = ""
) -> Iterator[tuple[str, Any, tuple[type[BaseModel], ...]]]:
    """(dotted path, pydantic FieldInfo, owning classes) for every key, depth first.

    Under a choice such as model.optim, keys every choice shares appear once (model.optim.lr);
    the others carry the choice: model.optim[sgd].momentum.
    """
    yield from _iter_members((model,), prefix)


def _iter_members(members: tuple[type[BaseModel], ...], prefix: str) -> Iterator[tuple[str, Any, tuple]]:
    common = [name for name in members[0].model_fields if all(name in m.model_fields for m in members)]
    variant: dict[type[BaseModel], list[str]] = {m: [n for n in m.model_fields if n not in common] for m in members}
    for name in common:
        if name == "name" and len(members) > 1:  # the discriminator: one key, many values
            yield f"{prefix}name", members[0].model_fields[name], members
            continue
        groups: dict[str, list[type[BaseModel]]] = {}
        for member in members:
            groups.setdefault(_signature(member.model_fields[name]), []).append(member)
        usual = max(groups.values(), key=len)
        yield from _iter_field(usual[0].model_fields[name], f"{prefix}{_key_name(usual[0], name)}", tuple(usual))
        for member in members:
            if member not in usual:
                variant[member].insert(0, name)
    if len(members) > 1:
        for member in members:
            for name in variant[member]:
                path = f"{prefix.rstrip('.')}[{_tag(member)}].{name}"
                yield from _iter_field(member.model_fields[name], path, (member,))


def _signature(field: Any) -> str:
    return repr((field.annotation, field.default, field.description))


def _iter_field(field: Any, path: str, owners: tuple) -> Iterator[tuple[str, Any, tuple]]:
    yield path, field, owners
    children = tuple(_models_in(field.annotation))
    if children:
        yield from _iter_members(children, path + ".")


def _key_name(model: type[BaseModel], name: str) -> str:
    return model.model_fields[name].alias or name


__all__ = ["all_key_paths", "dotted", "iter_keys", "validate"]
