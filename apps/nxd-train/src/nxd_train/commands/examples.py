"""The example configs shipped in the nxd-train wheel (`nxd-train config list`, `config copy NAME DEST`): NxDT's
recipe shapes and the tiny default at the top, GPT-NeoX's files under `neox/`, QEfficient's under `qeff/`."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

SUFFIXES = (".yaml", ".yml")
DIALECT_FOLDERS = {"neox": "GPT-NeoX", "qeff": "QEfficient"}


class ExampleError(ValueError):
    """A name that is no example, or a destination that cannot be written; the message says which."""


@dataclass(frozen=True)
class Example:
    name: str  # the path under configs/ without its suffix: tiny, neox/pythia_tiny
    path: Path
    dialect: str


def examples_folder() -> Path:
    return Path(str(resources.files("nxd_train") / "configs"))


def example_configs() -> list[Example]:
    """Every example config, in name order."""
    root = examples_folder()
    found = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in SUFFIXES or not path.is_file():
            continue
        name = path.relative_to(root).with_suffix("").as_posix()
        folder = name.partition("/")[0] if "/" in name else ""
        found.append(Example(name, path, DIALECT_FOLDERS.get(folder, "NxDT")))
    return found


def find_example(name: str) -> Example:
    """The example called `name` (its suffix optional); ExampleError with the closest names otherwise."""
    examples = {example.name: example for example in example_configs()}
    key = name.removeprefix("configs/")
    for suffix in SUFFIXES:
        key = key.removesuffix(suffix)
    if key in examples:
        return examples[key]
    close = difflib.get_close_matches(key, list(examples), n=3, cutoff=0.5)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    raise ExampleError(
        f"{name!r}: expected the name of an example config (nxd-train config list), found no such example{hint}"
    )


def copy_example(name: str, destination: Path) -> Path:
    """Copy an example to `destination` (a new file, or a folder to put it in); never over a file that exists."""
    example = find_example(name)
    target = destination / example.path.name if destination.is_dir() else destination
    try:
        with open(target, "xb") as handle:
            handle.write(example.path.read_bytes())
    except FileExistsError:
        raise ExampleError(
            f"{target}: exists; expected a new file (nxd-train never replaces one): name another"
        ) from None
    except OSError as error:
        raise ExampleError(f"{target}: cannot write it ({error.strerror or error})") from None
    return target


def summary(path: Path) -> str:
    """The first sentence of an example's leading comment (licence headers and rules skipped); empty when it opens
    with a section heading only."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            if lines or line.strip():
                break
            continue
        text = line.lstrip("#").strip()
        if not any(c.isalpha() for c in text) or "Copyright" in text or "SPDX" in text:
            continue
        if lines and (len(text.split()) < 3 or re.match(r"[A-Z]\w*:", text)):  # the next heading, or a "Label:" line
            break
        lines.append(text)
    sentence = " ".join(lines).split(". ")[0].split(": ")[0].rstrip(".")
    if len(sentence.split()) < 4:  # a section heading (QEfficient's files), no description
        return ""
    return sentence if len(sentence) <= 100 else sentence[:97].rsplit(" ", 1)[0] + " ..."
