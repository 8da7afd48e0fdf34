"""Context parallelism: the sequence split over the cp ranks, and ring attention over that split.

torch's experimental `context_parallel` has no CPU path, so attention across the split is ours:
each rank keeps its queries and passes its key/value block around the ring (cp - 1 hops); every
visiting block's attention is merged into the running result with an online softmax (log-sum-exp).
The backward runs the same ring, recomputing each block's probabilities from the saved log-sum-exp
and sending the key/value gradients along with the keys and values, so they arrive back at their
owner after a full turn. Only plain `torch.distributed` point-to-point calls are used: gloo, NCCL
and any other backend work.

The split is zig-zag (head-tail): the sequence is cut into 2 * cp chunks and rank r holds chunks r
and 2cp-1-r, so every rank has the same amount of causal work. Causality between two chunks is
decided by their chunk numbers: an earlier chunk is attended whole, the same chunk causally, a
later chunk not at all (it is skipped, never computed).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup


def zigzag_indices(seq_len: int, cp: int, rank: int, device: torch.device | None = None) -> torch.Tensor:
    """The positions in the whole sequence of the tokens rank `rank` of `cp` holds: chunks rank and
    2cp-1-rank of 2cp equal chunks (seq_len must be a multiple of 2 * cp)."""
    if seq_len % (2 * cp):
        raise ValueError(f"a sequence of {seq_len} tokens cannot be split into 2 * cp = {2 * cp} equal chunks")
    chunk = seq_len // (2 * cp)
    return torch.cat([torch.arange(c * chunk, (c + 1) * chunk, device=device) for c in (rank, 2 * cp - 1 - rank)])


def split_sequence(tensor: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """This rank's zig-zag part of `tensor` along `dim` (the sequence dimension)."""
    return tensor.index_select(dim, zigzag_indices(tensor.shape[dim], cp, rank, tensor.device))


def ring_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    document_ids: torch.Tensor | None = None,
    scale: float | None = None,
    *,
    group: ProcessGroup,
) -> torch.Tensor:
    """Causal attention of this rank's zig-zag part of the sequence against the whole sequence.

    query (b, hq, s, d), key/value (b, hkv, s, d) with hq a multiple of hkv (GQA), s = seq / cp as
    `split_sequence` gives it; `document_ids` (b, s), when given, also keeps attention inside each
    document. Returns (b, hq, s, d). Arithmetic runs in fp32 (or the inputs' wider dtype).
    `partial(ring_attention, group=cp_group)` is a model's context-parallel attention.
    """
    if query.shape[1] % key.shape[1]:
        raise ValueError(f"{query.shape[1]} query heads: expected a multiple of the {key.shape[1]} key/value heads")
    if query.shape[2] % 2:
        raise ValueError(f"a zig-zag part has two equal chunks; found {query.shape[2]} tokens")
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    return _RingAttention.apply(query, key, value, document_ids, group, scale)


class _Ring:
    """The cp group as a ring: this rank's place, and its neighbours' global ranks."""

    def __init__(self, group: ProcessGroup):
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        ranks = dist.get_process_group_ranks(group)
        self.next = ranks[(self.rank + 1) % self.size]
        self.previous = ranks[(self.rank - 1) % self.size]

    def chunks(self, step: int) -> tuple[int, int]:
        """The chunk numbers of the key/value block held at `step` (it came from rank - step)."""
        source = (self.rank - step) % self.size
        return source, 2 * self.size - 1 - source

    def shift(self, *tensors: torch.Tensor) -> tuple[list[dist.Work], list[torch.Tensor]]:
        """Start sending `tensors` to the next rank and receiving the previous rank's into new buffers."""
        buffers = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
        ops = [dist.P2POp(dist.isend, t.contiguous(), self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, b, self.previous, self.group) for b in buffers]
        return dist.batch_isend_irecv(ops), buffers


def _wait(works: list[dist.Work]) -> None:
    for work in works:
        work.wait()


def _pairs(ring: _Ring, step: int) -> list[tuple[int, int, bool]]:
    """(query half, key half, causal) for each pair of chunks with something to attend."""
    own, visiting = ring.chunks(0), ring.chunks(step)
    return [(q, k, own[q] == visiting[k]) for q in (0, 1) for k in (0, 1) if visiting[k] <= own[q]]


def _scores(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    causal: bool,
    q_docs: torch.Tensor | None,
    k_docs: torch.Tensor | None,
) -> torch.Tensor:
    """Scaled scores of one chunk pair with the hidden entries at -inf."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    allowed = None
    if causal:
        allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    if q_docs is not None:
        same = (q_docs[:, :, None] == k_docs[:, None, :]).unsqueeze(1)
        allowed = same if allowed is None else allowed & same
    return scores if allowed is None else scores.masked_fill(~allowed, float("-inf"))


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """Log-sum-exps with -inf (rows that attend nothing) replaced by 0, safe to subtract."""
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)


def _halves(tensor: torch.Tensor | None, dim: int) -> tuple:
    return (None, None) if tensor is None else tensor.chunk(2, dim=dim)


def _expand(tensor: torch.Tensor, groups: int) -> torch.Tensor:
    return tensor.repeat_interleave(groups, dim=1) if groups > 1 else tensor


def _fold(grad: torch.Tensor, groups: int) -> torch.Tensor:
    """The gradient of expanded key/value heads summed back onto the shared heads."""
    if groups == 1:
        return grad
    b, h, s, d = grad.shape
    return grad.view(b, h // groups, groups, s, d).sum(2)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, document_ids, group, scale):  # noqa: ANN001, ANN205
        ring = _Ring(group)
        dtype = torch.promote_types(query.dtype, torch.float32)
        groups = query.shape[1] // key.shape[1]
        q_halves = _halves(query.to(dtype), 2)
        q_docs = _halves(document_ids, 1)
        out = [torch.zeros_like(h) for h in q_halves]
        lse = [torch.full(h.shape[:-1], float("-inf"), dtype=dtype, device=h.device) for h in q_halves]
        kv, docs = torch.stack([key, value]), document_ids
        for step in range(ring.size):
            pending = None
            if step + 1 < ring.size:  # the next block travels while this one is computed
                pending = ring.shift(kv, *(() if docs is None else (docs,)))
            k_halves, v_halves = (_halves(_expand(t.to(dtype), groups), 2) for t in kv)
            k_docs = _halves(docs, 1)
            for qh, kh, causal in _pairs(ring, step):
                scores = _scores(q_halves[qh], k_halves[kh], scale, causal, q_docs[qh], k_docs[kh])
                block_lse = torch.logsumexp(scores, dim=-1)
                block_out = torch.matmul(torch.exp(scores - _finite(block_lse)[..., None]), v_halves[kh])
                merged = torch.logaddexp(lse[qh], block_lse)
                safe = _finite(merged)[..., None]
                out[qh] = out[qh] * torch.exp(lse[qh][..., None] - safe) + block_out * torch.exp(
                    block_lse[..., None] - safe
                )
                lse[qh] = merged
            if pending is not None:
                _wait(pending[0])
                kv, docs = pending[1][0], (pending[1][1] if docs is not None else None)
        output, lse = torch.cat(out, dim=2), torch.cat(lse, dim=2)
        ctx.save_for_backward(query, key, value, document_ids, output, lse)
        ctx.ring, ctx.scale = ring, scale
        return output.to(query.dtype)

    @staticmethod
    def backward(ctx, grad_output):  # noqa: ANN001, ANN205
        query, key, value, document_ids, output, lse = ctx.saved_tensors
        ring, scale = ctx.ring, ctx.scale
        dtype = output.dtype
        groups = query.shape[1] // key.shape[1]
        grad_output = grad_output.to(dtype)
        delta = (grad_output * output).sum(-1)  # rowsum(dO * O), the softmax backward's correction
        q_halves, do_halves = _halves(query.to(dtype), 2), _halves(grad_output, 2)
        delta_halves, lse_halves = _halves(delta, 2), _halves(_finite(lse), 2)
        q_docs = _halves(document_ids, 1)
        dq = [torch.zeros_like(h) for h in q_halves]
        kv, docs = torch.stack([key, value]), document_ids
        dkv = torch.zeros(kv.shape, dtype=dtype, device=kv.device)
        for step in range(ring.size):
            pending = None
            if step + 1 < ring.size:
                pending = ring.shift(kv, *(() if docs is None else (docs,)))
            k_full, v_full = _expand(kv[0].to(dtype), groups), _expand(kv[1].to(dtype), groups)
            k_halves, v_halves, k_docs = _halves(k_full, 2), _halves(v_full, 2), _halves(docs, 1)
            dk = [torch.zeros_like(h) for h in k_halves]
            dv = [torch.zeros_like(h) for h in v_halves]
            for qh, kh, causal in _pairs(ring, step):
                scores = _scores(q_halves[qh], k_halves[kh], scale, causal, q_docs[qh], k_docs[kh])
                probs = torch.exp(scores - lse_halves[qh][..., None])
                dv[kh] += torch.matmul(probs.transpose(-2, -1), do_halves[qh])
                dprobs = torch.matmul(do_halves[qh], v_halves[kh].transpose(-2, -1))
                dscores = probs * (dprobs - delta_halves[qh][..., None])
                dq[qh] += torch.matmul(dscores, k_halves[kh]) * scale
                dk[kh] += torch.matmul(dscores.transpose(-2, -1), q_halves[qh]) * scale
            dkv = dkv + torch.stack([_fold(torch.cat(dk, dim=2), groups), _fold(torch.cat(dv, dim=2), groups)])
            if ring.size > 1:  # the gradients travel with their block; a last hop after the last step brings them home
                works, (dkv,) = ring.shift(dkv)
                _wait(works)
            if pending is not None:
                _wait(pending[0])
                kv, docs = pending[1][0], (pending[1][1] if docs is not None else None)
        grad_query = torch.cat(dq, dim=2).to(query.dtype)
        return grad_query, dkv[0].to(key.dtype), dkv[1].to(value.dtype), None, None, None
