"""A scripted fuzz of configs: the default job's file with one thing broken at a time (a value of the
wrong type or range, an unknown key, YAML that does not parse, an interpolation loop, an empty,
binary or missing file). `nxd-train config check` must answer each with exit 0 or 1, never a
traceback, and every problem it reports must name the file and a key or line. 240 cases, drawn from a
fixed seed (about 20 s in all)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import yaml
from nxd_train.cli import default_config_path, main

WRONG_VALUES = ["abc", [1, 2], {"a": 1}, -1, 0, 1e400, None, True, 2**70, -0.5, "", "${missing.key}"]
BROKEN_TEXTS = {
    "unbalanced": "trainer: {max_steps: [1, 2\n",
    "tab indent": "trainer:\n\tmax_steps: 3\n",
    "duplicate key": "seed: 1\nseed: 2\n",
    "scalar root": "just a string\n",
    "list root": "- a\n- b\n",
    "interpolation loop": "name: ${exp_manager.name}\nexp_manager: {name: ${name}}\n",
    "empty": "",
    "binary": "\x00\x01\x02\xff",
}


def _leaves(tree: dict, prefix: str = "") -> list[str]:
    found = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        found += _leaves(value, f"{path}.") if isinstance(value, dict) else [path]
    return found


def _set(tree: dict, path: str, value: object) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        tree = tree[part]
    tree[leaf] = value


def _cases() -> list[tuple[str, str]]:
    """(name, file text) of every case, in a fixed order."""
    base = yaml.safe_load(default_config_path().read_text())
    generator = random.Random(20261123)
    cases = [(f"text: {name}", text) for name, text in BROKEN_TEXTS.items()]
    leaves = _leaves(base)
    while len(cases) < 232:
        tree = yaml.safe_load(default_config_path().read_text())
        path, value = generator.choice(leaves), generator.choice(WRONG_VALUES)
        _set(tree, path, value)
        cases.append((f"{path} = {value!r}", yaml.safe_dump(tree)))
    for section in ("trainer", "model", "data", "exp_manager", "distributed_strategy", "precision"):
        tree = yaml.safe_load(default_config_path().read_text())
        tree.setdefault(section, {})["no_such_key"] = 1
        cases.append((f"unknown key in {section}", yaml.safe_dump(tree)))
    cases += [
        ("top-level unknown key", default_config_path().read_text() + "\nno_such_section: 1\n"),
        ("missing file", ""),
    ]
    return cases


CASES = _cases()


def _in_default_suite(index: int, name: str) -> bool:
    """Every broken text and unknown key, and one in four random wrong values (all of them with --runslow)."""
    return name.startswith(("text: ", "unknown key", "top-level", "missing")) or index % 4 == 0


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(case, marks=() if _in_default_suite(index, case[0]) else pytest.mark.slow)
        for index, case in enumerate(CASES)
    ],
    ids=[name for name, _ in CASES],
)
def test_config_check_answers_without_a_traceback(case, tmp_path, capsys):
    name, text = case
    path = tmp_path / "job.yaml"
    if name != "missing file":
        path.write_bytes(text.encode("latin-1" if "\xff" in text else "utf-8"))
    code = main(["config", "check", str(path)])
    out, err = capsys.readouterr()
    assert code in (0, 1), (name, code)
    assert "Traceback" not in out + err, (name, err[-2000:])
    if code == 1:
        problems = [line.strip() for line in err.splitlines() if line.strip() and not line.startswith("notice:")]
        assert problems, name
        assert str(path) in err, (name, err)
        for line in problems[1:]:  # after the heading, each problem starts with the file, a key or a line
            assert re.match(r"^\s*[\w./\[\]-]+(:\d+)?: \S", line), (name, line)


def test_there_are_enough_cases():
    assert len(CASES) >= 240 and len({name for name, _ in CASES}) > 150


NEOX = Path(__file__).parent / "neox" / "gpt2.yml"
NEOX_CASES = [
    ("num_kv_heads", 3),
    ("sliding_window_width", 500),
    ("max_position_embeddings", 16),
    ("intermediate_size", 1001),
    ("model_parallel_size", 3),
    ("pos_emb", "alibi"),
    ("attention_config", [[["global"], "all"]]),
    ("data_path", "no/such/prefix"),
    ("vocab_file", "no/such/vocab.json"),
    ("moe_num_experts", 3),
]
"""GPT-NeoX files broken one key at a time, through training's whole preflight."""


@pytest.mark.parametrize("case", NEOX_CASES, ids=[f"neox {key}={value!r}" for key, value in NEOX_CASES])
def test_config_check_of_a_neox_file_answers_without_a_traceback(case, tmp_path, capsys):
    key, value = case
    broken = tmp_path / "broken.yml"
    broken.write_text(NEOX.read_text() + f"{key}: {json.dumps(value)}\n")
    code = main(["config", "check", str(broken)])
    out, err = capsys.readouterr()
    assert code in (0, 1) and "Traceback" not in out + err, (case, err[-2000:])
    if code == 1:
        assert str(broken) in err, err
