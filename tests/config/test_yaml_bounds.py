"""A YAML file's aliases are bounded in every dialect: an alias bomb (each level ten aliases of the one below) is
refused in under a second, in bounded memory, naming the file; a large file with no alias is read in full and
gets the messages its keys deserve."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

BOUNDED_LOAD = textwrap.dedent("""
    import resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # 1 GiB of address space: a bomb cannot be built
    from nxd_config import ConfigError, load_config
    start = time.monotonic()
    try:
        load_config(sys.argv[1], dialect=sys.argv[2])
    except ConfigError as error:
        print(f"{time.monotonic() - start:.3f}")
        print(error)
""")


def alias_bomb(levels: int) -> str:
    """`levels` levels of ten aliases each: 10**levels nodes from about 10 x levels written."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("dialect", ["nxdt", "neox", "qeff"])
def test_an_alias_bomb_is_refused_in_under_a_second_in_bounded_memory(tmp_path, dialect):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(9))
    result = subprocess.run(
        [sys.executable, "-c", BOUNDED_LOAD, str(path), dialect], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
    seconds, message = result.stdout.split("\n", 1)
    assert float(seconds) < 1.0
    # written: the top mapping, a0's key, list and ten items, each other level's key and list (its aliases are
    # a0's nodes again); expanded: level k's list holds (10**(k+2) - 1) / 9 nodes (1, 11, 111, ... ones)
    written, expanded = 1 + 12 + 2 * 8, 1 + 9 + sum((10 ** (k + 2) - 1) // 9 for k in range(9))
    assert message.strip() == (
        f"{path}: <root>: expected valid YAML, found aliases that expand {written} written "
        f"nodes to {expanded:,} (nxd reads at most 10,000 nodes added by aliases) at line 1, "
        "column 1"
    )


def test_anchors_a_config_uses_load_and_an_alias_that_holds_itself_is_refused(tmp_path):
    from nxd_config import ConfigError, load_config

    path = tmp_path / "anchors.yaml"
    path.write_text(alias_bomb(3) + "name: &n tiny\nexp_manager: {name: *n}\n")  # 10 + 100 aliased nodes: fine
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert "a0: unknown key" in str(error.value) and "expected valid YAML" not in str(error.value)
    path.write_text("a: &a [1, *a]\n")
    with pytest.raises(ConfigError, match="expected valid YAML, found an alias that holds itself at line 1"):
        load_config(path)


def test_a_file_of_6000_keys_without_aliases_gets_the_unknown_key_message(tmp_path):
    from nxd_config import ConfigError, load_config

    path = tmp_path / "keys.yaml"
    path.write_text("".join(f"k{i}: {i}\n" for i in range(6000)))
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert f"{path}: k5999: unknown key; expected a key that the top level defines" in str(error.value)
    assert "expansion" not in str(error.value)
