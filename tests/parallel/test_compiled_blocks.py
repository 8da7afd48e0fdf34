"""Compiled decoder blocks (`Layout(compile_blocks=True)`, model.fusions.torch_compile) against eager
training: 5 fp32 steps, losses, gradient norms and every gradient within 1e-5 (inductor may reorder
floating-point sums). One process for both families by default; each parallel layout with --runslow
(every block compiles in every process, about a minute a layout on 2 cores)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from nxd_parallel import Layout

from .parity import Scenario, max_difference, run_scenarios, train_scenario

TOLERANCE = 1e-5
COMPILED = Layout(compile_blocks=True)


def _check(reference: dict, record: dict, name: str) -> None:
    differences = max_difference(reference, record)
    assert max(differences.values()) < TOLERANCE, (name, differences)


@pytest.mark.parametrize("family", ["megatron", pytest.param("hf", marks=pytest.mark.slow)])
def test_one_process_compiled_matches_eager(family):
    eager = Scenario(f"{family}-eager", family)
    compiled = replace(eager, name=f"{family}-compiled", layout=COMPILED)
    records = run_scenarios(1, [eager, compiled])
    _check(records[eager.name], records[compiled.name], compiled.name)


LAYOUTS = [
    Scenario("megatron-dp2-zero1", layout=Layout(zero1=True, compile_blocks=True), clip=0.5),
    Scenario(
        "hf-dp2-zero1-selective-recompute",
        "hf",
        layout=Layout(zero1=True, compile_blocks=True, recompute="selective", recompute_modules=("CoreAttention",)),
    ),
    Scenario("megatron-dp2-full-recompute", layout=Layout(recompute="full", compile_blocks=True)),
    Scenario("megatron-pp2", pp=2, layers=4, tied=False, layout=COMPILED),
    Scenario("hf-pp2", "hf", pp=2, layers=4, tied=False, layout=COMPILED),
    Scenario("megatron-cp2", cp=2, layout=COMPILED),
    Scenario("hf-cp2-documents", "hf", cp=2, documents=True, layout=COMPILED),
]
"""Every layout but tensor parallelism, which nxd-train refuses with compiled blocks (torch.compile
over tensor-parallel blocks fails inside DTensor's backward or loses the embedding's gradient)."""


@pytest.mark.slow
@pytest.mark.parametrize("scenario", LAYOUTS, ids=lambda s: s.name)
def test_compiled_blocks_in_each_layout_match_one_eager_process(scenario, compiled_layouts):
    reference = train_scenario(replace(scenario, name="one", tp=1, pp=1, cp=1, layout=Layout()), world=1)
    _check(reference, compiled_layouts[scenario.name], scenario.name)


@pytest.fixture(scope="module")
def compiled_layouts() -> dict[str, dict]:
    return run_scenarios(2, LAYOUTS)


def test_tensor_parallelism_with_compiled_blocks_is_refused_by_name(capsys):
    from nxd_train.cli import default_config_path, main

    assert (
        main(
            [
                "config",
                "check",
                str(default_config_path()),
                "+model.fusions.torch_compile=True",
                "trainer.devices=2",
                "distributed_strategy.tensor_model_parallel_size=2",
            ]
        )
        == 1
    )
    assert (
        "model.fusions.torch_compile: not available with tensor parallelism (distributed_strategy."
        "tensor_model_parallel_size: 2)"
    ) in capsys.readouterr().err
