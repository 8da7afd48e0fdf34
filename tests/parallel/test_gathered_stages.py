"""Pipeline stages gathered into the whole model (online RL's sampling runs on it), in real gloo processes: after the
stages' weights change, `refresh` gives every rank the stages' current values (its tensor-parallel share of them),
and the gathered model's logits equal one process's whole model holding the same values."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from nxd_models import GPTConfig, causal_lm_logits, model_family
from nxd_parallel import GatheredStages, Layout, ParallelDims, StagedModel, build_parallel_model, modules_of
from torch.distributed.tensor import DTensor


@dataclass(frozen=True)
class Case:
    name: str
    world: int = 2
    tp: int = 1
    pp: int = 2
    layers: int = 2
    layout: Layout = field(default_factory=Layout)


SPEC = dict(
    vocab_size=64,
    hidden_size=32,
    num_attention_heads=4,
    num_kv_heads=2,
    seq_length=16,
    ffn_hidden_size=48,
    share_embeddings_and_output_weights=False,
)
CASES = [
    Case("pp2"),
    pytest.param(Case("pp2_virtual2", layers=4, layout=Layout(virtual_stages=2)), marks=pytest.mark.slow),
    pytest.param(Case("pp2_tp2", world=4, tp=2), marks=pytest.mark.slow),
    pytest.param(Case("pp2_dp2_zero1", world=4, layout=Layout(zero1=True)), marks=pytest.mark.slow),
]
IDS = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def _worker(rank: int, case: Case, directory: str) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(directory, "store"), case.world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=case.world)
    try:
        family = model_family(GPTConfig(num_layers=case.layers, tensor_parallel_size=case.tp, **SPEC))
        mesh = ParallelDims(case.world, tp=case.tp, pp=case.pp).build_mesh("cpu")
        stages = build_parallel_model(family, case.layout, mesh, torch.device("cpu"), seed=3)
        assert isinstance(stages, StagedModel)
        gathered = GatheredStages(family, case.layout, mesh, torch.device("cpu"), seed=3)
        with torch.no_grad():  # the stages train on: values the initialisation never made
            for name, parameter in stages.named_parameters():
                parameter.mul_(1.5).add_(0.01 * (len(name) % 7))
        model = gathered.refresh(stages)
        state = {name: _whole(t) for module in modules_of(stages) for name, t in module.state_dict().items()}
        parts: list = [None] * case.world
        dist.all_gather_object(parts, state)
        with torch.no_grad():
            logits = _whole(causal_lm_logits(model.eval(), IDS, torch.arange(12).expand(2, -1)))
        whole = {name: _whole(t) for name, t in model.state_dict().items()}
        results: list = [None] * case.world
        dist.all_gather_object(results, (whole, logits))
        if rank == 0:
            stage_state = {name: value for part in parts for name, value in part.items()}
            torch.save((stage_state, results), os.path.join(directory, "found.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_rank_gets_the_stages_current_values_and_their_logits(case):
    with tempfile.TemporaryDirectory() as directory:
        mp.start_processes(_worker, args=(case, directory), nprocs=case.world, start_method="spawn")
        stage_state, results = torch.load(os.path.join(directory, "found.pt"), weights_only=True)
    reference = model_family(GPTConfig(num_layers=case.layers, tensor_parallel_size=case.tp, **SPEC)).build(seed=3)
    reference.load_state_dict(stage_state)
    with torch.no_grad():
        expected = causal_lm_logits(reference.eval(), IDS, torch.arange(12).expand(2, -1))
    for whole, logits in results:
        assert set(whole) == set(stage_state)
        for name, value in stage_state.items():
            assert torch.equal(whole[name], value), name
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
