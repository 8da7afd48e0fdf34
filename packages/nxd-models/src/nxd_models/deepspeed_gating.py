"""DeepSpeed's MoE gate (deepspeed/moe/sharded_moe.py: TopKGate's top1gating and top2gating), GPT-NeoX's
`moe_type: deepspeed`.

Affinities are the softmax of the router logits (fp32). Capacity, when tokens are dropped, is
max(ceil(T / E x capacity_factor x k), min_capacity) tokens per expert, with the evaluation factor outside training.

- top-1: each token's argmax expert. An expert over capacity keeps a random `capacity` of its tokens (Random Token
  Selection: the largest of U(0, 1) draws), and the kept token is weighed by its softmax probability as it is.
- top-2: the first expert is the argmax; the second the argmax of the other logits plus Gumbel noise (DeepSpeed's
  sampled second expert). Capacity counts every first choice in token order, then the second choices after them;
  a token's kept probabilities are renormalised to sum to one.
- The load-balancing loss is E x sum_e mean(softmax)_e x (share of tokens whose first choice is e), for both k.

The random draws (Random Token Selection, Gumbel noise; each can be turned off, as DeepSpeed's use_rts and
top2_2nd_expert_sampling) happen while training only, from torch's generator (which activation recompute restores,
so a replay draws the same); evaluation takes capacity in token order and the plain second expert, so that it is
repeatable (DeepSpeed draws there too).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

DEEPSPEED_TOP_K = (1, 2)
"""The gates DeepSpeed's MoE has (top1gating, top2gating)."""


def deepspeed_capacity(tokens: int, num_experts: int, top_k: int, factor: float, min_capacity: int) -> int:
    """DeepSpeed's _capacity: ceil(T / E x (factor x k)), at least min_capacity, in DeepSpeed's order of operations."""
    return max(math.ceil((tokens / num_experts) * (factor * top_k)), min_capacity)


def deepspeed_gate(
    logits: torch.Tensor, top_k: int, capacity: int | None, *, random_selection: bool, sample_second: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens, experts) choices and those kept (bool), and the combine weights (fp32, zero where not kept), of
    DeepSpeed's gate over `logits` (fp32); `capacity` None keeps every token (moe_token_dropping false).
    `random_selection` (DeepSpeed's use_rts) and `sample_second` (its top2_2nd_expert_sampling) draw; without them
    top-1 keeps tokens in token order and top-2 takes the second-largest logit."""
    gates = torch.softmax(logits, dim=-1)
    with torch.no_grad():
        first = F.one_hot(logits.argmax(dim=-1), logits.shape[-1]).bool()
        if top_k == 1:
            chosen = first
            kept = first if capacity is None else _selection(first, capacity, random_selection)
        else:
            others = logits.detach() + _gumbel(logits) if sample_second else logits.detach()
            second = F.one_hot(others.masked_fill(first, float("-inf")).argmax(dim=-1), logits.shape[-1]).bool()
            chosen = first | second
            kept_first, kept_second = first, second
            if capacity is not None:  # first choices in token order, then second choices after them
                kept_first = first & (torch.cumsum(first.long(), 0) - 1 < capacity)
                places = torch.cumsum(second.long(), 0) - 1 + first.long().sum(0, keepdim=True)
                kept_second = second & (places < capacity)
            kept = kept_first | kept_second
    weights = gates.masked_fill(~kept, 0.0)
    if top_k == 2:
        weights = weights / weights.sum(-1, keepdim=True).clamp(min=torch.finfo(weights.dtype).eps)
    return chosen, kept, weights


def _selection(first: torch.Tensor, capacity: int, random: bool) -> torch.Tensor:
    """The tokens each expert keeps of those routed to it: `capacity` at random (the largest U(0, 1) scores), or the
    first `capacity` in token order."""
    tokens = first.shape[0]
    if capacity >= tokens:
        return first
    if not random:
        return first & (torch.cumsum(first.long(), 0) <= capacity)
    scores = first * torch.rand(first.shape, device=first.device)
    top = torch.topk(scores, capacity, dim=0).indices
    return first & torch.zeros_like(first).scatter_(0, top, True)


def _gumbel(logits: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise of `logits`' shape, as DeepSpeed's gumbel_rsample draws it."""
    uniform = torch.rand(logits.shape, device=logits.device, dtype=logits.dtype)
    return -torch.log(-torch.log(uniform.clamp(min=torch.finfo(logits.dtype).tiny)))
