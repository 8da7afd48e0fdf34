"""Property: any mutation of a valid config loads or raises ConfigError, never another exception."""

import contextlib
import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nxd_config import ConfigError, NxdConfig, load_config
from nxd_config.validation import all_key_paths
from omegaconf import OmegaConf

from .conftest import MINIMAL

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# Parsed as nxd parses files (YAML 1.2 numbers: 1e-4 is a float); interpolations stay unresolved.
BASES = [MINIMAL] + [OmegaConf.to_container(OmegaConf.load(p), resolve=False) for p in sorted(CONFIGS.glob("*.yaml"))]
KEY_NAMES = sorted({path.rsplit(".", 1)[-1].split("]")[-1] for path in all_key_paths()})

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(
        [
            "${trainer.max_steps}",
            "${nope.key}",
            "${multiply:2,x}",
            "${.encoder_seq_length}",
            "???",
            "1e-4",
            "mixed_precision_SR",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(KEY_NAMES), children, max_size=3),
    max_leaves=8,
)


def paths(tree: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix] if prefix else []
    if isinstance(tree, dict):
        for key, value in tree.items():
            found += paths(value, (*prefix, key))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            found += paths(value, (*prefix, index))
    return found


@st.composite
def mutated(draw: st.DrawFn) -> dict:
    tree = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 4))):
        candidates = paths(tree)
        target = draw(st.sampled_from(candidates)) if candidates else ()
        parent: Any = tree
        for part in target[:-1]:
            parent = parent[part]
        leaf = target[-1] if target else None
        action = draw(st.sampled_from(["replace", "delete", "add", "rename"]))
        if leaf is None or action == "add":
            node = parent[leaf] if leaf is not None and isinstance(parent[leaf], dict) else tree
            node[draw(st.sampled_from(KEY_NAMES) | st.text(min_size=1, max_size=8))] = draw(values)
        elif action == "replace":
            parent[leaf] = draw(values)
        elif action == "delete":
            del parent[leaf]
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(KEY_NAMES))] = parent.pop(leaf)
    return tree


def _loads_or_says_why(tree: dict) -> None:
    try:
        config = load_config(tree)
    except ConfigError as error:
        assert error.issues and all(issue.message for issue in error.issues)
        return
    assert isinstance(config, NxdConfig)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutations_load_or_raise_config_error(tree: dict) -> None:
    _loads_or_says_why(tree)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_more_mutations_load_or_raise_config_error(tree: dict) -> None:
    _loads_or_says_why(tree)


OVERRIDES = st.lists(
    st.text(max_size=20) | st.sampled_from(["+a.b=1", "~trainer", "trainer.devices=[1", "~x.y"]), max_size=3
)


@settings(max_examples=50, deadline=None)
@given(OVERRIDES)
def test_random_overrides_load_or_raise_config_error(overrides: list[str]) -> None:
    with contextlib.suppress(ConfigError):
        load_config(MINIMAL, overrides)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(OVERRIDES)
def test_more_random_overrides_load_or_raise_config_error(overrides: list[str]) -> None:
    with contextlib.suppress(ConfigError):
        load_config(MINIMAL, overrides)


@pytest.mark.parametrize("base", range(len(BASES)))
def test_bases_are_valid(base: int) -> None:
    load_config(BASES[base])
