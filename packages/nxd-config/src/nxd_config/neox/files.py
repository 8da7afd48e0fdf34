"""Reading GPT-NeoX config files and merging several of them as NeoX's launcher does.

NeoX reads each file with PyYAML (so the JSON-like files it ships, with `#` comments, trailing commas
and Python's `True`, load), turns dashes in top-level keys into underscores, and refuses a key that
an earlier file already set. nxd follows those rules, and reads two spellings more kindly than PyYAML:
`6e-4` is a number (PyYAML's YAML 1.1 reads it as a string, which NeoX then fails on) and `None` is
null (NeoX's own example configs write it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError, ConfigIssue, Described

_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.VERBOSE,
)


MAX_ALIAS_NODES = 10_000
"""The most nodes YAML aliases may add to a file (each alias counts the nodes it repeats): far above any config's
anchors, far below an alias bomb (nine levels of ten aliases make 10^9 nodes from a hundred written)."""


def expanded_nodes(root: yaml.Node) -> tuple[int, int]:
    """The nodes of a composed document as written and as aliases expand it, counted without expanding (each
    node once, its expanded size from its children's); a YAMLError for an alias that holds itself."""
    written: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in written:
            continue
        children = (
            [child for pair in node.value for child in pair]
            if isinstance(node, yaml.MappingNode)
            else list(node.value)
            if isinstance(node, yaml.SequenceNode)
            else []
        )
        if children_done:
            open_nodes.discard(id(node))
            written[id(node)] = 1 + sum(written[id(child)] for child in children)
            continue
        if id(node) in open_nodes:
            raise yaml.constructor.ConstructorError(None, None, "an alias that holds itself", node.start_mark)
        open_nodes.add(id(node))
        stack.append((node, True))
        stack += [(child, False) for child in children if id(child) not in written]
    return len(written), written[id(root)]


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with `1e-4` read as a float and `None` as null, a key given twice in one mapping refused
    with both lines (PyYAML keeps the last silently; OmegaConf stops with a traceback), and a document whose aliases
    add more than MAX_ALIAS_NODES nodes refused before it is built (PyYAML would build it whatever its size)."""

    def construct_document(self, node: yaml.Node) -> Any:
        written, expanded = expanded_nodes(node)
        if expanded - written > MAX_ALIAS_NODES:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"aliases that expand {written:,} written nodes to {expanded:,} (nxd reads at most "
                f"{MAX_ALIAS_NODES:,} nodes added by aliases)",
                node.start_mark,
            )
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`, flattened by PyYAML itself
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):
                continue
            if key in first:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the key {key!r} twice in one mapping (first at line {first[key] + 1})",
                    key_node.start_mark,
                )
            first[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


_Loader.yaml_implicit_resolvers = {key: list(value) for key, value in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
_Loader.add_implicit_resolver("tag:yaml.org,2002:null", re.compile(r"^None$"), ["N"])


def canonical(key: str) -> str:
    """NeoX's spelling of a top-level key: dashes are underscores."""
    return key.replace("-", "_")


@dataclass(frozen=True)
class NeoXFile:
    """One file's top-level keys (canonical spelling) and values, with the file's name for messages."""

    name: str
    values: dict[str, Any]


def read_file(path: Path) -> dict[str, Any]:
    """A config file's mapping as PyYAML reads it (see the module note); ConfigError naming the file otherwise."""
    name = str(path)
    if not path.is_file():
        found = Described("a directory" if path.is_dir() else "no such file")
        raise ConfigError(ConfigIssue.mismatch("", "a YAML or JSON config file", found), name)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(ConfigIssue("", f"expected valid YAML, found {problem}{where}"), name) from None
    except UnicodeDecodeError as exc:
        issue = ConfigIssue.mismatch("", "UTF-8 text", Described(f"an undecodable byte at offset {exc.start}"))
        raise ConfigError(issue, name) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            ConfigIssue.mismatch("", "a mapping of keys at the top level", Described(f"a {type(data).__name__}")), name
        )
    bad = [key for key in data if not isinstance(key, str)]
    if bad:
        raise ConfigError(ConfigIssue.mismatch(str(bad[0]), "a string key", bad[0]), name)
    return data


def merge(files: list[NeoXFile]) -> tuple[dict[str, Any], dict[str, str]]:
    """The files' keys merged in order, and which file set each key. A key set by two files (in any
    spelling) is an error naming both, NeoX's rule; so is a key written twice in one file's spellings."""
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    issues = []
    for file in files:
        for raw, value in file.values.items():
            key = canonical(raw)
            if key in origin:
                where = "earlier in the same file" if origin[key] == file.name else f"by {origin[key]}"
                issues.append(
                    ConfigIssue(
                        raw,
                        f"set again in {file.name}; it was already set {where} (GPT-NeoX "
                        "takes each key from one file: remove one of them)",
                    )
                )
                continue
            merged[key], origin[key] = value, file.name
    if issues:
        raise ConfigError(issues, ", ".join(file.name for file in files))
    return merged, origin
