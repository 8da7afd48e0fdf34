"""nxd-train tune: the candidates (micro-batch sizes dividing a rank's share x ZeRO stages), the memory plan's
pruning, each candidate timed by a real short run, and the fastest written as a config that loads; GPT-NeoX's
autotuning block as the tune keys."""

from __future__ import annotations

import re

import pytest
from nxd_config import load_config
from nxd_train.cli import default_config_path, main
from nxd_train.commands.tune import Candidate, candidates

from tests.config.test_neox_dialect import MODEL, errors, load, notices


def _config(*overrides: str):
    return load_config(default_config_path(), list(overrides))


def test_candidates_divide_a_ranks_share_and_cover_the_stages():
    found = candidates(_config("data.global_batch_size=8", "data.micro_batch_size=2"))
    assert found == [Candidate(size, 0) for size in (1, 2, 4, 8)]
    listed = candidates(_config("data.global_batch_size=8", "+tune.micro_batch_sizes=[2,4]", "+tune.zero_stages=[0,1]"))
    assert listed == [Candidate(2, 0), Candidate(4, 0), Candidate(2, 1), Candidate(4, 1)]
    two = candidates(_config("data.global_batch_size=8", "trainer.devices=2", "+tune.max_micro_batch_size=2"))
    assert two == [Candidate(size, stage) for stage in (0, 1, 3) for size in (1, 2)]  # 4 samples a rank


def test_tune_times_each_candidate_and_writes_the_fastest(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    output = tmp_path / "tuned.yaml"
    code = main(
        [
            "tune",
            str(default_config_path()),
            "data.global_batch_size=8",
            "+tune.micro_batch_sizes=[2,4]",
            "+tune.start_step=2",
            "+tune.end_step=3",
            "--output",
            str(output),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    rates = {
        int(m): float(r.replace(",", ""))
        for m, r in re.findall(r"micro-batch (\d+), ZeRO 0: ([\d,]+) tokens/s", printed)
    }
    assert sorted(rates) == [2, 4]
    best = max(rates, key=rates.get)
    assert f"fastest: micro-batch {best}, ZeRO 0" in printed
    tuned = load_config([output], [])
    assert (tuned.data.micro_batch_size, tuned.global_batch_size) == (best, 8)
    assert tuned == load_config(
        default_config_path(),
        [
            "data.global_batch_size=8",
            "+tune.micro_batch_sizes=[2,4]",
            "+tune.start_step=2",
            "+tune.end_step=3",
            f"data.micro_batch_size={best}",
        ],
    )
    assert "max_steps: ${trainer.max_steps}" in output.read_text()  # the original plus the tuned keys
    assert load_config([output], ["trainer.max_steps=1000"]).model.optim.sched.max_steps == 1000
    assert main(["tune", str(default_config_path()), "--output", str(output)]) == 1  # never over a file
    assert "tuned.yaml exists" in capsys.readouterr().err


def test_candidates_that_do_not_fit_are_left_out(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "tune",
            str(default_config_path()),
            "data.global_batch_size=4",
            "--device-memory",
            "0.000001",
            "--output",
            str(tmp_path / "tuned.yaml"),
        ]
    )
    captured = capsys.readouterr()
    assert code == 1 and not (tmp_path / "tuned.yaml").exists()
    assert captured.out.count("left out: does not fit: peak") == 3  # micro-batches 1, 2 and 4
    assert "no candidate ran" in captured.err


def test_neox_autotuning_block_sets_the_tune_keys(tmp_path):
    block = {
        "enabled": True,
        "start_profile_step": 2,
        "end_profile_step": 4,
        "metric": "throughput",
        "min_train_micro_batch_size_per_gpu": 2,
        "max_train_micro_batch_size_per_gpu": 8,
        "fast": True,
    }
    tune = load(tmp_path, {**MODEL, "autotuning": block}).tune
    assert (tune.start_step, tune.end_step, tune.min_micro_batch_size, tune.max_micro_batch_size) == (2, 4, 2, 8)
    found = notices(tmp_path, {**MODEL, "autotuning": block})
    assert any("autotuning: the search runs with `nxd-train tune`" in n for n in found)
    assert any("autotuning.fast: accepted, changes nothing here" in n for n in found)


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"metric": "speed"}, "autotuning.metric: expected throughput, latency or flops, found 'speed'"),
        ({"start_profile_step": 0}, "autotuning.start_profile_step: expected a positive whole number, found 0"),
        ({"tuner": "x"}, "autotuning.tuner: unknown autotuning setting"),
        ({"start_profile_step": 6, "end_profile_step": 4}, "expected start_step at most end_step (4), found 6"),
    ],
)
def test_what_the_autotuning_block_refuses(tmp_path, block, message):
    found = errors(tmp_path, {**MODEL, "autotuning": {"enabled": True, **block}})
    assert any(message in m for m in found), found
