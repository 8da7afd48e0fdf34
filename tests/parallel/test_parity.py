"""Every parallel layout against one process: same seed, same global batch, 5 optimizer steps of
fp32 training; losses, gradient norms and every gradient within 1e-6, for both model families."""

from __future__ import annotations

import pytest
import torch
from nxd_train.parallelism import Layout

from .parity import Scenario, max_difference, run_scenarios, train_scenario

FAMILIES = ("megatron", "hf")
TOLERANCE = 1e-6


def _two_process_scenarios() -> list[Scenario]:
    scenarios = []
    for family in FAMILIES:
        scenarios += [
            Scenario(f"{family}-tp2", family, tp=2),
            Scenario(f"{family}-tp2-sp", family, tp=2, layout=Layout(sequence_parallel=True), clip=0.5),
            Scenario(f"{family}-dp2-zero1", family, layout=Layout(zero1=True), clip=0.5),
            Scenario(f"{family}-dp2-replicated", family, layout=Layout(ranks_at_once=1)),
            Scenario(f"{family}-tp2-kv-replicator", family, tp=2, kv_heads=1, layout=Layout(kv_replicator=2)),
            Scenario(f"{family}-tp2-sp-kv-replicator", family, tp=2, kv_heads=1,
                     layout=Layout(kv_replicator=2, sequence_parallel=True)),  # fmt: skip
            Scenario(f"{family}-tp2-full-recompute", family, tp=2, layout=Layout(recompute="full")),
            Scenario(f"{family}-dp2-zero1-selective-recompute", family,
                     layout=Layout(zero1=True, recompute="selective", recompute_modules=("CoreAttention",),
                                   recompute_mlp=True)),  # fmt: skip
        ]
    return scenarios


def _four_process_scenarios() -> list[Scenario]:
    return [Scenario(f"{family}-dp2-tp2-zero1-sp", family, tp=2, layout=Layout(zero1=True, sequence_parallel=True),
                     clip=0.5) for family in FAMILIES]  # fmt: skip


@pytest.fixture(scope="module")
def references() -> dict[tuple[str, int, float], dict]:
    return {(family, kv, clip): train_scenario(Scenario("one", family, kv_heads=kv, clip=clip), world=1)
            for family in FAMILIES for kv in (1, 2) for clip in (0.0, 0.5)}  # fmt: skip


@pytest.fixture(scope="module")
def two_processes() -> dict[str, dict]:
    return run_scenarios(2, _two_process_scenarios())


@pytest.fixture(scope="module")
def four_processes() -> dict[str, dict]:
    return run_scenarios(4, _four_process_scenarios())


def _check(scenario: Scenario, record: dict, references: dict) -> None:
    reference = references[(scenario.family, scenario.kv_heads, scenario.clip)]
    for name, value in reference["init"].items():  # each shard is the slice of the one-process init
        assert torch.equal(record["init"][name], value), name
    differences = max_difference(reference, record)
    assert max(differences.values()) < TOLERANCE, (scenario.name, differences)


@pytest.mark.parametrize("scenario", _two_process_scenarios(), ids=lambda s: s.name)
def test_two_processes_match_one(scenario, two_processes, references):
    _check(scenario, two_processes[scenario.name], references)


@pytest.mark.parametrize("scenario", _four_process_scenarios(), ids=lambda s: s.name)
def test_four_processes_match_one(scenario, four_processes, references):
    _check(scenario, four_processes[scenario.name], references)


@pytest.mark.parametrize("family", FAMILIES)
def test_zero1_holds_at_most_six_tenths_of_the_optimizer_state(family, two_processes):
    sharded = two_processes[f"{family}-dp2-zero1"]["optimizer_state_bytes"]
    replicated = two_processes[f"{family}-dp2-replicated"]["optimizer_state_bytes"]
    assert sharded <= 0.6 * replicated, (sharded, replicated)
