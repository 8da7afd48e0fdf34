"""adam8bit in two gloo processes against one: parameters sharded by rows, by the last axis and as a vector step
as one process steps them, bit for bit; each rank keeps half of the 8-bit state where the shards are whole
256-value blocks (the rows' state where a split of the last axis would cut blocks, the whole state where rows are
not whole blocks); a state saved by two ranks resumes in one."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from nxd_precision.adam8bit import Adam8bit
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

SHAPES = {
    "rows": ((6, 512), Shard(0)),
    "last": ((4, 1024), Shard(1)),
    "vector": ((1024,), Shard(0)),
    "cut": ((6, 768), Shard(1)),
    "unaligned": ((6, 300), Shard(0)),
    "small": ((8, 16), Shard(1)),
}
"""Name: (shape, placement over two ranks). cut: halves of 384 values would cut blocks (rows whole, the last axis
gathered); unaligned: rows of 300 values (blocks cross rows: whole tensors); small: under min_8bit_size (fp32
moments, sharded)."""
OPTIONS = {"lr": 0.01, "betas": (0.8, 0.95), "weight_decay": 0.1, "min_8bit_size": 200}
STEPS = 4


def _initial() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=generator) for name, (shape, _) in SHAPES.items()}


def _gradient(name: str, step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100 * step + sorted(SHAPES).index(name))
    return torch.randn(SHAPES[name][0], generator=generator)


def _train(parameters: dict[str, torch.Tensor], optimizer: Adam8bit, steps: range, mesh=None) -> None:
    for step in steps:
        for name, p in parameters.items():
            whole = _gradient(name, step)
            p.grad = whole if mesh is None else distribute_tensor(whole, mesh, [SHAPES[name][1]])
        optimizer.step()


def _worker(rank: int, directory: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(directory, "store"), 2), rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    parameters = {
        name: torch.nn.Parameter(distribute_tensor(value, mesh, [SHAPES[name][1]]))
        for name, value in _initial().items()
    }
    optimizer = Adam8bit(list(parameters.values()), **OPTIONS)
    _train(parameters, optimizer, range(STEPS // 2), mesh)
    model = torch.nn.ParameterDict(parameters)
    dcp.save(get_optimizer_state_dict(model, optimizer), checkpoint_id=os.path.join(directory, "checkpoint"))
    _train(parameters, optimizer, range(STEPS // 2, STEPS), mesh)
    kinds = {
        name: {
            key: (
                type(value).__name__,
                tuple(value.to_local().shape) if isinstance(value, DTensor) else tuple(value.shape),
            )
            for key, value in optimizer.state[p].items()
            if key != "step"
        }
        for name, p in parameters.items()
    }
    torch.save(
        {"weights": {name: p.full_tensor() for name, p in parameters.items()}, "state": kinds},
        os.path.join(directory, f"rank{rank}.pt"),
    )
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks() -> tuple[list[dict], str]:
    directory = tempfile.mkdtemp()
    mp.start_processes(_worker, args=(directory,), nprocs=2, start_method="spawn")
    return [torch.load(os.path.join(directory, f"rank{rank}.pt"), weights_only=True) for rank in range(2)], directory


def _one_process(
    steps: range, parameters: dict[str, torch.nn.Parameter] | None = None, state: dict | None = None
) -> dict[str, torch.nn.Parameter]:
    parameters = parameters or {name: torch.nn.Parameter(value) for name, value in _initial().items()}
    optimizer = Adam8bit(list(parameters.values()), **OPTIONS)
    if state is not None:
        set_optimizer_state_dict(torch.nn.ParameterDict(parameters), optimizer, state)
    _train(parameters, optimizer, steps)
    return parameters


def test_two_ranks_step_as_one_process(two_ranks):
    records, _ = two_ranks
    single = _one_process(range(STEPS))
    for record in records:
        for name, value in record["weights"].items():
            assert torch.equal(value, single[name].detach()), name


def test_shards_of_whole_blocks_keep_half_the_state(two_ranks):
    records, _ = two_ranks
    state = records[0]["state"]
    assert state["rows"] == {
        "exp_avg": ("DTensor", (3, 512)),
        "exp_avg_sq": ("DTensor", (3, 512)),
        "absmax_exp_avg": ("DTensor", (3, 2)),
        "absmax_exp_avg_sq": ("DTensor", (3, 2)),
    }
    assert state["last"]["exp_avg"] == ("DTensor", (4, 512)) and state["last"]["absmax_exp_avg"] == ("DTensor", (4, 2))
    assert state["vector"]["exp_avg"] == ("DTensor", (512,)) and state["vector"]["absmax_exp_avg"] == ("DTensor", (2,))
    assert state["cut"]["exp_avg"] == ("DTensor", (6, 768)) and state["cut"]["absmax_exp_avg"] == ("DTensor", (6, 3))
    assert state["unaligned"]["exp_avg"] == ("DTensor", (6, 300)) and state["unaligned"]["absmax_exp_avg"] == (
        "DTensor",
        (8,),
    )  # 1800 values: 8 blocks, on each rank
    assert state["small"] == {"exp_avg": ("DTensor", (8, 8)), "exp_avg_sq": ("DTensor", (8, 8))}


def test_a_state_saved_by_two_ranks_resumes_in_one(two_ranks):
    records, directory = two_ranks
    halfway = _one_process(range(STEPS // 2))
    resumed = {name: torch.nn.Parameter(p.detach().clone()) for name, p in halfway.items()}
    probe = Adam8bit(list(resumed.values()), **OPTIONS)
    state = get_optimizer_state_dict(torch.nn.ParameterDict(resumed), probe)
    dcp.load(state, checkpoint_id=os.path.join(directory, "checkpoint"))
    finished = _one_process(range(STEPS // 2, STEPS), resumed, state)
    for name, value in records[0]["weights"].items():
        assert torch.equal(value, finished[name].detach()), name
