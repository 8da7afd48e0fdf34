"""What a config (or a hostfile) can put into the scripts `nxd-train launch` writes: a value that would break a
script line is refused when the config loads, naming the key; every value accepted reaches the job as data. Each
script is checked with `bash -n`, then run by bash with srun and ssh replaced by recorders and nothing else on PATH:
the recorded launch must be the only command, with the arguments the config gives, and Slurm's own reading of the
#SBATCH lines (its batch-script parser: quotes of either kind, a backslash takes the next character as it is, an
unquoted '#' starts a comment) must give back each value."""

from __future__ import annotations

import contextlib
import json
import random
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from nxd_config import ConfigError, load_config
from nxd_train.cli import main
from nxd_train.cluster.scripts import LaunchError, host_commands, sbatch_script

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
SBATCH_KEYS = {
    "name": "job-name",
    "trainer.cluster.job_name": "job-name",
    "trainer.cluster.partition": "partition",
    "trainer.cluster.account": "account",
    "trainer.cluster.comment": "comment",
    "trainer.cluster.time": "time",
}
"""Each config value an sbatch script holds, and the directive it becomes."""
PIECES = [
    "\n",
    "\r",
    "\x00",
    "\x1b",
    "\t",
    "\u2028",
    "\x85",
    "'",
    '"',
    "\\",
    "#",
    ";",
    "&&",
    "|",
    " ",
    "-",
    "--",
    "-oProxyCommand=touch MARK",
    "$(touch MARK)",
    "`touch MARK`",
    "${HOME}",
    "$HOME",
    "!",
    "*",
    "~",
    "%",
    "é",
    "名",
    "touch MARK",
    "\ntouch MARK #",
    "a",
    "node1",
    "0",
    ".",
    "/",
    ":",
    "=",
    "hetjob",
    "PackJob",
]
"""What a hostile value is drawn from: control characters and line breaks, quotes, shell syntax, option dashes."""

RECORDER = """#!/bin/bash
f=$(/usr/bin/mktemp -p "$RECORDS" call.XXXXXX)
printf '%s\\0' "${0##*/}" "$@" > "$f"
"""


def slurm_arguments(line: str) -> list[str]:
    """The arguments sbatch reads from one #SBATCH line, as its batch-script parser (_get_argument in sbatch's
    opt.c) reads them: whitespace separates, ' and " quote, a backslash takes the next character as it is, an
    unquoted '#' ends the line, an unmatched quote is fatal."""
    found, i, text = [], 0, line.removeprefix("#SBATCH")
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return found
        argument, quote, escape = "", None, False
        while i < len(text) and (quote or not text[i].isspace()):
            char = text[i]
            i += 1
            if escape:
                escape = False
            elif char == "\\":
                escape = True
                continue
            elif quote:
                if char == quote:
                    quote = None
                    continue
            elif char in "'\"":
                quote = char
                continue
            elif char == "#":
                return found + ([argument] if argument else [])
            argument += char
        assert quote is None, f"sbatch would stop: unmatched {quote} in {line!r}"
        found.append(argument)


@pytest.fixture
def recorders(tmp_path):
    """A PATH holding only srun, ssh and sbatch, each recording its arguments, and the folder of records."""
    bin_dir, records = tmp_path / "bin", tmp_path / "records"
    bin_dir.mkdir(), records.mkdir()
    for name in ("srun", "ssh", "sbatch"):
        (bin_dir / name).write_text(RECORDER)
        (bin_dir / name).chmod(0o755)
    return bin_dir, records


def run_script(script: str, where: Path, recorders: tuple[Path, Path]) -> list[list[str]]:
    """`script` checked by bash -n, then run by bash in `where` with nothing on PATH but the recorders: the commands
    it ran, each as its argv. Anything else it tried to run fails 'command not found' and fails the test."""
    bin_dir, records = recorders
    for record in records.iterdir():
        record.unlink()
    path = where.parent / "job.sh"
    path.write_text(script)
    assert subprocess.run(["/bin/bash", "-n", str(path)], capture_output=True).returncode == 0, script
    result = subprocess.run(
        ["/bin/bash", str(path)],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(bin_dir), "RECORDS": str(records)},
    )
    assert (result.returncode, result.stderr) == (0, ""), script
    return [record.read_bytes().decode().split("\0")[:-1] for record in sorted(records.iterdir())]


def test_a_line_break_in_a_value_the_script_holds_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for key in SBATCH_KEYS:
        plus = "" if key == "name" else "+"
        assert main(["launch", str(TINY), f'{plus}{key}="x\\ntouch {tmp_path}/PWN #"']) == 1
        err = capsys.readouterr().err
        assert f"{key}: expected one line of text without control characters" in err, err
        assert "Traceback" not in err and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["a hetjob", "my-PACKJOB"])
def test_a_directive_value_sbatch_would_read_as_another_job_is_refused(value):
    overrides = [f"+trainer.cluster.comment={value}"]
    with pytest.raises(LaunchError, match="trainer.cluster.comment: expected a value without 'hetjob' or 'packjob'"):
        sbatch_script(load_config(TINY, overrides), [TINY], overrides)


def test_a_host_that_is_an_ssh_option_is_refused_and_ssh_options_end_before_the_host(tmp_path, recorders):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node0 slots=1\n-oProxyCommand=touch${IFS}PWN slots=1\n")
    overrides = [f"+trainer.cluster.hostfile={hostfile}", "+trainer.cluster.scheduler=hosts"]
    with pytest.raises(LaunchError, match=r"trainer.cluster.hostfile: .*hostfile:2: expected a host name or address"):
        host_commands(load_config(TINY, overrides), [TINY], overrides)
    with pytest.raises(ConfigError, match=r"trainer.cluster.master_addr: expected a host name or address"):
        load_config(TINY, [*overrides, "+trainer.cluster.master_addr=-oProxyCommand=x"])
    hostfile.write_text("node0 slots=1\n")
    (ssh,) = run_script(host_commands(load_config(TINY, overrides), [TINY], overrides), tmp_path, recorders)
    assert ssh[:5] == ["ssh", "-o", "BatchMode=yes", "--", "node0"]


def test_the_hosts_script_exits_1_naming_each_host_whose_command_failed(tmp_path):
    hostfile, bin_dir = tmp_path / "hostfile", tmp_path / "bin"
    hostfile.write_text("node0 slots=1\nnode1 slots=1\nnode2 slots=1\n")
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text('#!/bin/bash\ncase "$4" in node1) exit 0;; node0) exit 255;; *) exit 3;; esac\n')
    (bin_dir / "ssh").chmod(0o755)
    overrides = [
        "trainer.num_nodes=3",
        "data.global_batch_size=24",
        f"+trainer.cluster.hostfile={hostfile}",
        "+trainer.cluster.scheduler=hosts",
    ]
    (tmp_path / "hosts.sh").write_text(host_commands(load_config(TINY, overrides), [TINY], overrides))
    result = subprocess.run(
        ["/bin/bash", str(tmp_path / "hosts.sh")], capture_output=True, text=True, env={"PATH": str(bin_dir)}
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "nxd-train launch: node rank 0 (node0) exited with 255",
        "nxd-train launch: node rank 2 (node2) exited with 3",
    ]
    (bin_dir / "ssh").write_text("#!/bin/bash\nexit 0\n")
    assert subprocess.run(["/bin/bash", str(tmp_path / "hosts.sh")], env={"PATH": str(bin_dir)}).returncode == 0


def _hostile(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 6)))


def _fuzz(tmp_path: Path, recorders: tuple[Path, Path], draws: int, seed: int) -> dict[str, int]:
    """`draws` hostile values, each through one key that reaches a script (an sbatch value, the config file's
    path, the working directory, a host of the hostfile, master_addr), each script run as in run_script."""
    rng, outcome = random.Random(seed), {"refused": 0, "written": 0}
    for draw in range(draws):
        value = _hostile(rng)
        safe = value.replace("/", "_").replace("\0", "_").strip(".") or "_"
        where = tmp_path / f"w{draw}" / (safe if rng.random() < 0.5 else "plain")
        where.mkdir(parents=True)
        config = where / f"{safe}.yaml"
        shutil.copyfile(TINY, config)
        target = rng.choice([*SBATCH_KEYS, "path", "host", "trainer.cluster.master_addr"])
        hosts = target in ("host", "trainer.cluster.master_addr")
        overrides = []
        if target in SBATCH_KEYS:
            overrides.append(f"{'' if target == 'name' else '+'}{target}={json.dumps(value)}")
        if hosts:
            host = value if target == "host" else "node0"
            (where / "hostfile").write_text(f"{host} slots=1\n")
            overrides += [f"+trainer.cluster.hostfile={where / 'hostfile'}", "+trainer.cluster.scheduler=hosts"]
            if target != "host":
                overrides.append(f"+{target}={json.dumps(value)}")
        try:
            with contextlib.chdir(where):  # the script's working directory is the one launch is run from
                cfg = load_config(config, overrides)
                script = (host_commands if hosts else sbatch_script)(cfg, [config], overrides)
        except (ConfigError, LaunchError):
            outcome["refused"] += 1
            continue
        outcome["written"] += 1
        calls = run_script(script, where, recorders)
        launched = [sys.executable, "-m", "nxd_train", str(config.absolute()), *overrides]
        if not hosts:
            assert calls == [["srun", "--kill-on-bad-exit=1", *launched]], script
            directives = {}
            for line in script.splitlines():
                if line.startswith("#SBATCH"):
                    (argument,) = slurm_arguments(line)
                    option, _, given = argument.partition("=")
                    directives[option.removeprefix("--")] = given
                elif line and not line.startswith("#"):
                    break  # sbatch reads no directive after the first command
            if target in SBATCH_KEYS and not (target == "name" and cfg.trainer.cluster.job_name):
                loaded = cfg.name if target == "name" else getattr(cfg.trainer.cluster, target.rsplit(".", 1)[1])
                assert directives[SBATCH_KEYS[target]] == loaded, script  # OmegaConf's escapes are undone
        else:
            ((program, *ssh),) = calls
            host = cfg.trainer.cluster.master_addr or (value if target == "host" else "node0")
            assert program == "ssh" and ssh[:4] == ["-o", "BatchMode=yes", "--", value if target == "host" else "node0"]
            remote = shlex.split(ssh[4])
            assert remote[:4] == ["cd", str(where), "&&", "CUDA_VISIBLE_DEVICES=0"], script
            assert remote[remote.index("--master-addr") + 1] == host
            assert remote[remote.index("-m", 6) + 1 :] == ["nxd_train", str(config.absolute()), *overrides]
        assert not list(tmp_path.rglob("MARK")), script
    return outcome


def test_hostile_values_through_every_key_that_reaches_a_script_run_nothing(tmp_path, recorders):
    outcome = _fuzz(tmp_path, recorders, draws=60, seed=0)
    assert outcome["refused"] and outcome["written"], outcome


@pytest.mark.slow
def test_500_hostile_values_run_nothing(tmp_path, recorders):
    outcome = _fuzz(tmp_path, recorders, draws=500, seed=1)
    assert outcome["refused"] and outcome["written"], outcome
