"""GRPO through nxd-train: the shipped example (single-digit addition from a random start) samples, scores and
trains, logging TRL's metric names and completions.jsonl; two data-parallel processes, two tensor-parallel ones and
two pipeline stages (gathered for sampling) log what one process logs (the same completions: each draws from its own seeded stream); a resumed run repeats
the uninterrupted one; and what cannot run is refused before launch, by key."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from nxd_config import ConfigError, load_config
from nxd_train.checks.preflight import PreflightError, plan_run
from nxd_train.run.corpus import default_cache_dir
from nxd_train.run.loop import train

from tests.training_runs import FAST, read_metrics, run_command

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "grpo_tiny.yaml"
DATA = ROOT / "configs" / "data"
GRPO = "model_alignment_strategy.grpo"
SHORT = ["trainer.max_steps=6", "model_alignment_strategy.grpo.num_generations=4", "data.global_batch_size=4"]
METRICS = (
    "loss",
    "reward",
    "reward_std",
    "rewards/exact_match/mean",
    "rewards/exact_match/std",
    "rewards/digit/mean",
    "advantages/std",
    "frac_reward_zero_std",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "rollouts/tokens_per_s",
    "rollouts/generation_seconds",
)


def _job(log_dir: Path, *overrides: str) -> list[str]:
    return [
        *FAST,
        f"data.train_dir={DATA / 'addition_prompts.jsonl'}",
        f"data.tokenizer.type={DATA / 'addition_tokenizer.json'}",
        f"+exp_manager.explicit_log_dir={log_dir}",
        *overrides,
    ]


def _train(log_dir: Path, *overrides: str) -> list[dict[str, float]]:
    cfg = load_config(EXAMPLE, _job(log_dir, *overrides))
    return [row for row in read_metrics(train(plan_run(cfg, default_cache_dir()))) if "loss" in row]


def test_the_example_samples_scores_and_logs_what_trl_logs(tmp_path):
    rows = _train(tmp_path / "run", *SHORT)
    assert len(rows) == 6 and all(name in rows[0] for name in METRICS)
    for row in rows:
        assert 0 <= row["rewards/exact_match/mean"] <= 1 and 0 <= row["rewards/digit/mean"] <= 1
        assert row["reward"] == pytest.approx(row["rewards/exact_match/mean"] + 0.25 * row["rewards/digit/mean"])
        assert row["completions/mean_length"] == row["completions/max_length"] == 1  # a digit, or the end at once
        assert 0 < row["completions/clipped_ratio"] <= 1  # those that did not end are cut at max_new_tokens
        assert row["clip_ratio/region_mean"] == 0  # one update a rollout: the ratio is 1
    samples = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert {sample["step"] for sample in samples} == set(range(1, 7))
    assert all(set(sample) == {"step", "prompt", "completion", "reward"} for sample in samples)
    assert all(sample["prompt"].endswith("=") for sample in samples)


@pytest.mark.slow  # one run of the whole example (about 40 s); the short run above stays in the default suite
def test_the_example_learns_addition(tmp_path):
    rows = _train(tmp_path / "run", "trainer.log_every_n_steps=5")
    first, last = rows[:6], rows[-6:]  # the first and last 30 steps
    before = sum(row["rewards/exact_match/mean"] for row in first) / len(first)
    after = sum(row["rewards/exact_match/mean"] for row in last) / len(last)
    assert before < 0.2 and after > before + 0.25, (before, after)


@pytest.mark.parametrize(
    "layout",
    [
        ["trainer.devices=2"],
        pytest.param(["trainer.devices=2", "distributed_strategy.zero1=True"], marks=pytest.mark.slow),
        pytest.param(
            ["trainer.devices=2", "distributed_strategy.tensor_model_parallel_size=2"], marks=pytest.mark.slow
        ),
        ["trainer.devices=2", "distributed_strategy.pipeline_model_parallel_size=2"],
        pytest.param(
            [
                "trainer.devices=4",
                "distributed_strategy.pipeline_model_parallel_size=2",
                "distributed_strategy.tensor_model_parallel_size=2",
            ],
            marks=pytest.mark.slow,
        ),
    ],
    ids=["dp2", "dp2-zero1", "tp2", "pp2", "pp2-tp2"],
)
def test_two_processes_sample_and_log_what_one_process_does(tmp_path, layout):
    job = [*SHORT, "trainer.max_steps=4", "data.micro_batch_size=2", f"+{GRPO}.num_iterations=2"]  # 2 rollouts
    single = _train(tmp_path / "one", *job)
    result = run_command(str(EXAMPLE), *_job(tmp_path / "two", *job, *layout), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    double = [row for row in read_metrics(tmp_path / "two") if "loss" in row]
    for step, (one, two) in enumerate(zip(single, double, strict=True)):
        assert two["reward"] == one["reward"] and two["completions/mean_length"] == one["completions/mean_length"]
        # the first step (before any update) within 1e-6 in the loss and 1e-7 in the gradient norm; each update
        # after it moves every weight by about the rate whatever its gradient (Adam), so a gradient of rounding noise
        # that the other summation order gives another sign (tensor-parallel sums, pipeline stages training padded
        # rows where one process packs them) carries on: about 1e-6 in the loss and 2e-5 in the gradient norm
        assert abs(two["loss"] - one["loss"]) < (1e-6 if step == 0 else 5e-6)
        assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-7 if step == 0 else 5e-5)


def test_a_reward_that_fails_on_the_first_pipeline_rank_stops_every_rank(tmp_path):
    """Under pipeline stages only the first pipeline rank samples and scores: a reward failing there reaches the
    other rank too, and the run stops with the reward's message instead of waiting for a rollout."""
    reward = f"{GRPO}.rewards=[{{function: 'math:sqrt'}}]"  # imports; called with keywords, it raises TypeError
    layout = ["trainer.devices=2", "distributed_strategy.pipeline_model_parallel_size=2"]
    job = _job(tmp_path / "run", *SHORT, "data.micro_batch_size=2", reward, *layout)
    result = run_command(str(EXAMPLE), *job, cwd=tmp_path, timeout=300)
    assert result.returncode != 0 and "reward sqrt: raised TypeError" in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr


def test_a_resumed_run_samples_and_trains_as_the_uninterrupted_one(tmp_path):
    job = [
        *SHORT,
        "exp_manager.create_checkpoint_callback=True",
        "+exp_manager.checkpoint_callback_params.every_n_train_steps=3",
    ]
    whole = _train(tmp_path / "whole", *job)
    _train(tmp_path / "part", *job, "trainer.max_steps=3", "model.optim.sched.max_steps=6")
    resumed = _train(tmp_path / "part", *job, "exp_manager.resume_if_exists=True")  # its rows follow the first 3
    assert [row["step"] for row in resumed] == [row["step"] for row in whole]
    assert [row["reward"] for row in resumed] == [row["reward"] for row in whole]
    assert [row["loss"] for row in resumed] == [row["loss"] for row in whole]


def _refusal(tmp_path: Path, *overrides: str) -> str:
    try:
        plan_run(load_config(EXAMPLE, _job(tmp_path / "run", *overrides)), default_cache_dir())
    except (ConfigError, PreflightError) as error:
        return str(error)
    raise AssertionError("not refused")


def test_what_cannot_run_is_refused_before_launch_by_key(tmp_path):
    records = tmp_path / "questions.jsonl"
    records.write_text(json.dumps({"question": "1 + 1 =", "answer": "2"}) + "\n")
    cases = [
        ([f"data.train_dir={records}"], "expected a prompt field (the prompt), found none"),
        ([f"{GRPO}.num_generations=1"], f"{GRPO}.num_generations: expected at least 2 completions a prompt"),
        ([f"{GRPO}.max_new_tokens=16"], f"{GRPO}.max_new_tokens: expected less than the sequence length (16)"),
        ([f"{GRPO}.rewards=[{{function: 'no_such_module:score'}}]"], f"{GRPO}.rewards[0].function: no_such_module"),
        ([f"+{GRPO}.beta=0.04"], f"{GRPO}.beta: a KL to the reference needs the weights the run starts from"),
        (["trainer.devices=2", "+distributed_strategy.context_parallel_size=2"], "expected 1 with " + GRPO),
        ([f"{GRPO}.rewards=[{{builtin: regex}}]"], f"{GRPO}.rewards[0].pattern: expected the regular expression"),
        ([f"{GRPO}.rewards=[{{builtin: regex, pattern: '('}}]"], f"{GRPO}.rewards[0].pattern: expected a regular"),
        (
            [f"{GRPO}.rewards=[{{builtin: exact_match, tolerance: 0.1}}]"],
            f"{GRPO}.rewards[0].tolerance: read by builtin",
        ),
    ]
    for overrides, message in cases:
        assert message in _refusal(tmp_path, *overrides), overrides


def test_a_reward_that_fails_stops_the_run_naming_it_and_the_record_or_its_group_is_skipped(tmp_path, monkeypatch):
    module = tmp_path / "flaky_rewards.py"
    module.write_text(
        textwrap.dedent(
            """
            def fails_on_three(prompts, completions, answer, **kwargs):
                if any(prompt.startswith("3 ") for prompt in prompts):
                    raise ValueError("cannot score threes")
                return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("flaky_rewards", None)
    reward = f"{GRPO}.rewards=[{{function: 'flaky_rewards:fails_on_three'}}]"
    with pytest.raises(
        Exception, match=r"reward fails_on_three: raised ValueError: cannot score threes \(.*line \d+\)"
    ):
        _train(tmp_path / "stop", *SHORT, reward)
    rows = _train(tmp_path / "skip", *SHORT, reward, f"+{GRPO}.on_reward_error=skip")
    assert rows[-1]["rollouts/skipped_groups"] > 0


def test_dynamic_sampling_replaces_groups_whose_rewards_are_all_equal(tmp_path):
    plain = _train(tmp_path / "plain", *SHORT)
    refilled = _train(tmp_path / "refilled", *SHORT, f"+{GRPO}.dynamic_sampling=True")
    assert refilled[-1]["rollouts/refilled_groups"] > 0
    assert sum(r["frac_reward_zero_std"] for r in refilled) < sum(r["frac_reward_zero_std"] for r in plain)
