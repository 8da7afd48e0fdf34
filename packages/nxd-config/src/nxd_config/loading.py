"""`load_config`: config files or a mapping -> the dialect's reading (NxDT: overrides, older spellings,
interpolation; GPT-NeoX: merging, overrides, translation) -> schema -> cross-field rules. Every problem found
on the way is reported together in one ConfigError."""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from omegaconf.resolvers import oc

from . import aliases, rules
from .dialects import dialect_of
from .errors import ConfigError, ConfigIssue, ConfigNotice
from .neox.files import NeoXFile, canonical, merge, read_file
from .neox.translate import Translation, translate
from .overrides import apply_overrides
from .qeff.overrides import qeff_override
from .qeff.translate import translate as translate_qeff
from .schema import NxdConfig
from .validation import defined_keys, dotted, validate


def _multiply(a: Any, b: Any) -> Any:
    for value in (a, b):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"multiply takes numbers, found {value!r}")
    return a * b


ALLOW_ENV = "NXD_ALLOW_ENV"
"""The environment variable naming (comma-separated) the variables a config's ${oc.env:NAME} may read."""


def _environment(name: str, *default: Any) -> str | None:
    """OmegaConf's oc.env, for the variables the user names in NXD_ALLOW_ENV only: a config someone hands you must
    not copy a secret from the environment into config.yaml, a log, the W&B run or a URL the run contacts."""
    allowed = {item.strip() for item in os.environ.get(ALLOW_ENV, "").split(",")}
    if name not in allowed:
        raise ValueError(
            f"a config reads the environment variable {name} only where you allow it: add {name} to "
            f"{ALLOW_ENV} (names, comma-separated) to let ${{oc.env:{name}}} read it"
        )
    return oc.env(name, *default)


def _register_resolvers() -> None:
    """nxd's resolvers, again before each resolution: OmegaConf's registry is the process's, and a clear_resolvers()
    elsewhere would bring back an oc.env that reads any variable."""
    OmegaConf.register_resolver("multiply", _multiply, replace=True)
    OmegaConf.register_resolver("oc.env", _environment, replace=True, annotation_validation="off")


_register_resolvers()


Source = str | PathLike[str] | Mapping[str, Any]


def load_config(
    source: Source | Sequence[str | PathLike[str]],
    overrides: Sequence[str] = (),
    *,
    dialect: str | None = None,
    launch: Mapping[str, str] | None = None,
) -> NxdConfig:
    """Load, override, resolve and validate a config.

    `source` is a YAML file path, a mapping, or several GPT-NeoX files (merged as NeoX's launcher merges
    them); `overrides` are `a.b=c`, `+a.b=c` or `~a.b` strings in the files' dialect. `dialect` ("nxdt" or
    "neox") forces the dialect, which is otherwise recognised from the files. `launch` holds the launch's
    WORLD_SIZE and LOCAL_WORLD_SIZE, which a QEfficient file's processes come from (default: the environment's,
    as torchrun sets them). Raises ConfigError listing every problem; warns (ConfigNotice) about accepted keys
    that deserve attention.
    """
    sources = [source] if isinstance(source, str | PathLike | Mapping) else list(source)
    if not sources:
        raise ConfigError(ConfigIssue("", "expected a config file, found none"))
    raw = [(_name(item), dict(item) if isinstance(item, Mapping) else read_file(Path(item))) for item in sources]
    spoken = dialect_of(raw, dialect)
    if spoken == "neox":
        return _load_neox(raw, list(overrides))
    if spoken == "qeff":
        return _load_qeff(raw[0], list(overrides), launch)
    name = raw[0][0]
    config = _read(sources[0], name)
    issues = apply_overrides(config, list(overrides), defined_keys())
    tree = OmegaConf.to_container(config, resolve=False)
    issues += aliases.normalise(tree)
    return _build(tree, issues, lambda found: ConfigError(found, name), lambda issue: issue.render())


def nxdt_yaml_with(source: str | PathLike[str], overrides: Sequence[str], updates: Mapping[str, Any]) -> str | None:
    """One NxDT-dialect file as written, with `overrides` applied and each dotted key of `updates` set, as YAML:
    interpolations and the file's spellings kept, so the result reads as the file does (a later
    `trainer.max_steps=1000` still moves what interpolates it). None when `source` is in another dialect (GPT-NeoX
    and QEfficient files have no interpolations to keep: write `to_nxdt_yaml` of the loaded config). ConfigError as
    load_config raises it."""
    name = str(source)
    raw = read_file(Path(source))
    if dialect_of([(name, raw)], None) != "nxdt":
        return None
    config = _read(source, name)
    if issues := apply_overrides(config, list(overrides), defined_keys()):
        raise ConfigError(issues, name)
    for key, value in updates.items():
        OmegaConf.update(config, key, value, force_add=True)
    return OmegaConf.to_yaml(config, resolve=False)


def _name(source: Source) -> str:
    return "<mapping>" if isinstance(source, Mapping) else str(source)


def _build(tree: dict[str, Any], issues: list[ConfigIssue], error: Any, render: Any) -> NxdConfig:
    """Resolve, validate and judge the cross-field rules of an NxDT-dialect tree; ConfigError (made by `error`
    from the issues) with every problem, or the config with its notices (each written by `render`) warned."""
    resolved, resolve_issues = _resolve(tree)
    issues += resolve_issues
    built, type_issues, repaired = validate(resolved)
    issues += type_issues
    findings = rules.check(built, repaired) if built is not None else []
    issues += [finding.issue for finding in findings if not finding.notice]
    if issues:
        raise error(issues)
    for finding in findings:
        warnings.warn(render(finding.issue), ConfigNotice, stacklevel=3)
    assert built is not None
    return built


def _load_neox(raw: list[tuple[str, dict[str, Any]]], overrides: list[str]) -> NxdConfig:
    """GPT-NeoX files merged, overridden (NeoX keys, dashes or underscores) and translated to NxDT's tree."""
    merged, origin = merge([NeoXFile(name, values) for name, values in raw])
    names = ", ".join(name for name, _ in raw)
    config = OmegaConf.create(merged)
    issues = apply_overrides(config, [_neox_override(item, merged) for item in overrides])
    if issues:
        raise ConfigError(issues, names)
    values = OmegaConf.to_container(config, resolve=False)
    translation = translate(values, Path(raw[0][0]).stem if raw[0][0] != "<mapping>" else "neox")

    located = [_located(issue, origin, names) for issue in translation.issues]

    def where(issue: ConfigIssue) -> ConfigIssue:
        return issue if issue in located else _neox_issue(issue, translation, origin, names)

    def error(found: list[ConfigIssue]) -> ConfigError:
        """Every problem once: a check of the translated config about keys already refused says no more."""
        refused = translation.refused
        kept = [
            issue
            for issue in found
            if issue in located or not {key.partition(".")[0] for key in _provenance(issue.path, translation)} & refused
        ]
        return ConfigError([where(issue) for issue in kept])

    built = _build(translation.tree, list(located), error, lambda issue: where(issue).render())
    for notice in translation.notices:
        key = notice.partition(":")[0].partition(".")[0]
        warnings.warn(f"{origin.get(key, names)}: {notice}", ConfigNotice, stacklevel=2)
    return built


def _load_qeff(raw: tuple[str, dict[str, Any]], overrides: list[str], launch: Mapping[str, str] | None) -> NxdConfig:
    """A QEfficient fine-tuning file, overridden (`section.key=VALUE`, or QEfficient's flat `key=VALUE`) and
    translated to NxDT's tree."""
    name, values = raw
    config = OmegaConf.create(values)
    issues = apply_overrides(config, [qeff_override(item, values) for item in overrides])
    if issues:
        raise ConfigError(issues, name)
    translation = translate_qeff(
        OmegaConf.to_container(config, resolve=False), Path(name).stem if name != "<mapping>" else "qeff", launch
    )
    origin = dict.fromkeys(values, name)
    located = [_located(issue, origin, name) for issue in translation.issues]

    def error(found: list[ConfigIssue]) -> ConfigError:
        refused = {issue.path for issue in translation.issues}
        kept = [issue for issue in found if issue in located or not set(_provenance(issue.path, translation)) & refused]
        return ConfigError(
            [issue if issue in located else _neox_issue(issue, translation, origin, name) for issue in kept]
        )

    built = _build(
        translation.tree, list(located), error, lambda issue: _neox_issue(issue, translation, origin, name).render()
    )
    for notice in translation.notices:
        warnings.warn(f"{name}: {notice}", ConfigNotice, stacklevel=2)
    return built


def _neox_override(override: str, merged: dict[str, Any]) -> str:
    """A NeoX override with its top-level key in NeoX's spelling (dashes are underscores). Every NeoX argument has
    a default, so `key=VALUE` sets one the files leave out too; a misspelt key meets the key table's
    did-you-mean."""
    prefix = override[:1] if override[:1] in "+~" else ""
    key, sep, value = override[len(prefix) :].partition("=")
    top, dot, rest = key.partition(".")
    top = canonical(top)
    if not prefix and sep and top not in merged:
        prefix = "+"
    return f"{prefix}{top}{dot}{rest}{sep}{value}"


def _provenance(path: str, translation: Translation) -> tuple[str, ...]:
    """The NeoX keys an nxd key (or its nearest section) was made from."""
    keys: tuple[str, ...] = ()
    while path and not keys:
        keys = translation.sources.get(path, ())
        path = path.rpartition(".")[0]
    return keys


def _neox_issue(issue: ConfigIssue, translation: Translation, origin: dict[str, str], names: str) -> ConfigIssue:
    """An issue about the translated tree, told in the NeoX keys (and file) it came from."""
    keys = _provenance(issue.path, translation)
    if not keys:
        return ConfigIssue(f"{names}: {issue.path}", issue.message)
    given = [key for key in keys if key.partition(".")[0] in origin] or list(keys)
    file = origin.get(given[0].partition(".")[0], names)
    return ConfigIssue(f"{file}: {' / '.join(given)} (nxd: {issue.path})", issue.message)


def _located(issue: ConfigIssue, origin: dict[str, str], names: str) -> ConfigIssue:
    """A translation issue (its path a NeoX key) with the file that set the key."""
    key = issue.path.partition(".")[0]
    return ConfigIssue(f"{origin.get(key, names)}: {issue.path}", issue.message)


def _read(source: Source, name: str) -> DictConfig:
    """An NxDT config (already read once as YAML, so well formed) as OmegaConf reads it: interpolations kept,
    `1e-4` a float."""
    try:
        text = dict(source) if isinstance(source, Mapping) else Path(source).read_text(encoding="utf-8")
        return OmegaConf.create(text, max_yaml_expanded_nodes=None)  # read_file bounded its aliases
    except (OmegaConfBaseException, yaml.YAMLError) as exc:
        raise ConfigError(ConfigIssue("", f"expected a YAML mapping, found {_first_line(exc)}"), name) from None


def _resolve(tree: dict[str, Any]) -> tuple[dict[str, Any], list[ConfigIssue]]:
    """Resolve interpolations key by key, so that every broken one is reported.

    Interpolations may point at keys the file leaves to their defaults (`${distributed_strategy.
    context_parallel_size}`), so they resolve against the defaults merged under the file; only
    the file's own keys are kept, so that 'set by the user' stays meaningful downstream.
    """
    issues: list[ConfigIssue] = []
    _register_resolvers()
    merged = OmegaConf.create(_overlay(_defaults(), tree))

    def walk(node: DictConfig | ListConfig, raw: Any, keys: list[str | int]) -> Any:
        is_dict = isinstance(node, DictConfig)
        result: dict[Any, Any] | list[Any] = {} if is_dict else []
        for key in list(raw.keys()) if is_dict else range(len(raw)):
            path = [*keys, key]
            try:
                value = node[key]
            except OmegaConfBaseException as exc:
                issues.append(ConfigIssue.mismatch(dotted(path), "a resolvable value", raw[key], _first_line(exc)))
                value = None
            if isinstance(value, DictConfig | ListConfig):
                child = raw[key] if isinstance(raw[key], dict | list) else OmegaConf.to_container(value, resolve=False)
                value = walk(value, child, path)
            if isinstance(result, dict):
                result[key] = value
            else:
                result.append(value)
        return result

    return walk(merged, tree, []), issues


@functools.cache
def _defaults() -> dict[str, Any]:
    """Every key's default as YAML data; read only (the overlay builds new mappings over it)."""
    return NxdConfig().model_dump(mode="json", by_alias=True)


def _overlay(base: Any, top: Any) -> Any:
    """`top` laid over `base`, mapping by mapping (lists and scalars in `top` win whole)."""
    if isinstance(base, dict) and isinstance(top, dict):
        return {**base, **{key: _overlay(base.get(key), value) for key, value in top.items()}}
    return top


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
