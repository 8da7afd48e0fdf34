"""Ring attention against full causal attention (torch's SDPA on the whole sequence in one process,
in fp64):
the output and the gradients of query, key and value, each rank's zig-zag part, within 1e-6, for cp 2
and 4 (4 real gloo processes: the whole world, and two pairs), GQA and head counts that are not
powers of two, with and without document masks."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from nxd_parallel import ring_attention, split_sequence
from nxd_parallel.context_parallel import zigzag_indices

SEQ, BATCH, HEAD_DIM = 16, 2, 8
HEADS = ((4, 4), (6, 2), (3, 1), (5, 5))
DOCUMENTS = (3, 6, 7)
TOLERANCE = 1e-6


def _inputs(heads: int, kv_heads: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(heads * 10 + kv_heads)
    q = torch.randn(BATCH, heads, SEQ, HEAD_DIM, generator=generator)
    k, v = (torch.randn(BATCH, kv_heads, SEQ, HEAD_DIM, generator=generator) for _ in range(2))
    return q, k, v, torch.randn(BATCH, heads, SEQ, HEAD_DIM, generator=generator)


def _documents() -> torch.Tensor:
    return torch.cat([torch.full((n,), d) for d, n in enumerate(DOCUMENTS)]).expand(BATCH, SEQ)


def _reference(heads: int, kv_heads: int, documents: bool) -> list[torch.Tensor]:
    q, k, v, grad = (t.double().requires_grad_(i < 3) for i, t in enumerate(_inputs(heads, kv_heads)))
    mask = None
    if documents:
        ids = _documents()
        mask = (torch.ones(SEQ, SEQ, dtype=torch.bool).tril() & (ids[:, :, None] == ids[:, None, :])).unsqueeze(1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True)
    out.backward(grad)
    return [t.float() for t in (out.detach(), q.grad, k.grad, v.grad)]


def _ring(heads: int, kv_heads: int, documents: bool, group: dist.ProcessGroup) -> list[torch.Tensor]:
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    q, k, v, grad = (split_sequence(t, cp, rank, dim=2) for t in _inputs(heads, kv_heads))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    ids = split_sequence(_documents(), cp, rank) if documents else None
    out = ring_attention(q, k, v, ids, group=group)
    out.backward(grad)
    return [out.detach(), q.grad, k.grad, v.grad]


def _worker(rank: int, directory: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(directory, "store"), 4), rank=rank, world_size=4)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    groups = {4: dist.group.WORLD, 2: pairs[rank // 2]}
    differences = {}
    for cp, group in groups.items():
        for heads, kv_heads in HEADS:
            for documents in (False, True):
                mine = zigzag_indices(SEQ, cp, dist.get_rank(group))
                expected = [t.index_select(2, mine) for t in _reference(heads, kv_heads, documents)]
                found = _ring(heads, kv_heads, documents, group)
                differences[(cp, heads, kv_heads, documents)] = [
                    (a - b).abs().max().item() for a, b in zip(expected, found, strict=True)
                ]
    torch.save(differences, os.path.join(directory, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def differences() -> list[dict]:
    with tempfile.TemporaryDirectory() as directory:
        mp.start_processes(_worker, args=(directory,), nprocs=4, start_method="spawn")
        return [torch.load(os.path.join(directory, f"rank{rank}.pt")) for rank in range(4)]


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("documents", [False, True], ids=["causal", "documents"])
def test_ring_attention_matches_full_attention(differences: list[dict], cp: int, heads: tuple, documents: bool):
    for rank, per_rank in enumerate(differences):
        output, dq, dk, dv = per_rank[(cp, *heads, documents)]
        assert max(output, dq, dk, dv) < TOLERANCE, (rank, output, dq, dk, dv)


def test_zigzag_split_balances_causal_work():
    cp, seq = 4, 16
    parts = [zigzag_indices(seq, cp, rank) for rank in range(cp)]
    assert torch.equal(torch.cat(parts).sort().values, torch.arange(seq))  # every token exactly once
    assert parts[0].tolist() == [0, 1, 14, 15] and parts[3].tolist() == [6, 7, 8, 9]
    work = [int((part + 1).sum()) for part in parts]  # keys each rank's queries attend, causally
    assert len(set(work)) == 1
    with pytest.raises(ValueError, match="2 \\* cp = 8"):
        zigzag_indices(12, cp, 0)
