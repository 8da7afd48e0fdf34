"""Block-sparse causal attention: DeepSpeed's sparsity layouts (GPT-NeoX's `local`, `sparse_fixed`,
`sparse_variable`, `bigbird` and `bslongformer` layers), always unidirectional as NeoX builds them.

A layout says, per head, which (query block, key block) pairs of `block` x `block` tokens may attend; a token
attends a key when its block pair is in the layout and the key is not in its future. The layout is built over
the training sequence (`seq_length`, rounded up to whole blocks) as DeepSpeed builds its master layout, and a
shorter sequence reads its top-left corner. Random blocks are drawn from a generator seeded with the run's
seed and the layer's number, so every rank and every resume draws the same layout.

One `mask_mod` (FlexAttention's form) is the single rule: training on CUDA, FlexAttention skips the tiles the
layout leaves empty; elsewhere (FlexAttention has no backward on the CPU; decoding and masks of documents or
biases) the same rule is drawn as a boolean mask for scaled_dot_product_attention. The two agree to rounding.
Tensor-parallel ranks read their heads' rows of one layout over all heads (GPT-NeoX builds each rank's from its
own first head, so per-head patterns there depend on the split).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

import torch

from .errors import ModelConfigError
from .layer_kinds import LayerKind

if TYPE_CHECKING:  # FlexAttention imports sympy: loaded where a block mask is made
    from torch.nn.attention.flex_attention import BlockMask


SPARSE_KINDS = ("local", "sparse_fixed", "sparse_variable", "bigbird", "bslongformer")
"""Layer kinds whose attention follows a block-sparse layout (their settings: one `SparsitySpec`)."""


@dataclass(frozen=True)
class SparsitySpec:
    """GPT-NeoX's `sparsity_config` (DeepSpeed's sparsity settings). None means the per-kind default NeoX passes:
    num_local_blocks 4 (local: num_sliding_window_blocks, else 4), num_random_blocks 0 for sparse_variable and 1
    for bigbird, num_sliding_window_blocks 3 for bigbird and bslongformer."""

    block: int = 16
    different_layout_per_head: bool = False
    num_local_blocks: int | None = None
    num_global_blocks: int = 1
    num_different_global_patterns: int = 1
    num_random_blocks: int | None = None
    local_window_blocks: tuple[int, ...] = (4,)
    global_block_indices: tuple[int, ...] = (0,)
    global_block_end_indices: tuple[int, ...] | None = None
    num_sliding_window_blocks: int | None = None
    seed: int = 0
    """Draws the random blocks (with the layer's number)."""

    def problems(self, kinds: set[str], seq_length: int) -> list[str]:
        """What DeepSpeed refuses for the kinds in use, in the words of nxd's keys."""
        key, found = "model.sparse_attention", []
        if self.block < 1:
            return [f"{key}.block: expected a positive number of tokens, found {self.block}"]
        blocks = math.ceil(seq_length / self.block)
        if "sparse_fixed" in kinds:
            local, grouped = self.local_blocks(), self.num_global_blocks
            if grouped < 1 or local < 1 or local % grouped:
                found.append(
                    f"{key}.num_local_blocks: expected a positive multiple of num_global_blocks "
                    f"({grouped}), found {local}"
                )
            elif not 1 <= self.num_different_global_patterns <= local // grouped:
                found.append(
                    f"{key}.num_different_global_patterns: expected 1 up to num_local_blocks / "
                    f"num_global_blocks ({local // grouped}), found {self.num_different_global_patterns}"
                )
            elif self.num_different_global_patterns > 1 and not self.different_layout_per_head:
                found.append(
                    f"{key}.num_different_global_patterns: more than one pattern needs "
                    f"different_layout_per_head true, found {self.num_different_global_patterns} with false"
                )
        if "sparse_variable" in kinds and (not self.local_window_blocks or min(self.local_window_blocks) < 1):
            found.append(
                f"{key}.local_window_blocks: expected positive block counts, found {list(self.local_window_blocks)}"
            )
        if kinds & {"sparse_variable", "bslongformer"}:
            ends = self.global_block_end_indices
            if min(self.global_block_indices, default=0) < 0:
                found.append(
                    f"{key}.global_block_indices: expected block indices of 0 or more, found "
                    f"{list(self.global_block_indices)}"
                )
            if ends is not None and (
                len(ends) != len(self.global_block_indices)
                or any(s >= e for s, e in zip(self.global_block_indices, ends, strict=False))
            ):
                found.append(
                    f"{key}.global_block_end_indices: expected one end after each of global_block_indices "
                    f"({list(self.global_block_indices)}), found {list(ends)}"
                )
        for kind in sorted(kinds & {"sparse_variable", "bigbird"}):
            count = self.random_blocks(kind)
            if not 0 <= count <= blocks:
                found.append(
                    f"{key}.num_random_blocks: expected 0 up to the {blocks} blocks of a sequence, found {count}"
                )
        for kind in sorted(kinds & {"local", "bigbird", "bslongformer"}):
            window = self.window_blocks(kind)
            if not 1 <= window <= blocks:
                name = (
                    "num_local_blocks"
                    if kind == "local" and self.num_local_blocks is not None
                    else "num_sliding_window_blocks"
                )
                found.append(
                    f"{key}.{name}: expected 1 up to the {blocks} blocks of a sequence ({kind} layers), found {window}"
                )
        if "bigbird" in kinds and not 1 <= self.num_global_blocks <= blocks:
            found.append(
                f"{key}.num_global_blocks: expected 1 up to the {blocks} blocks of a sequence, found "
                f"{self.num_global_blocks}"
            )
        return found

    def local_blocks(self) -> int:
        return 4 if self.num_local_blocks is None else self.num_local_blocks

    def random_blocks(self, kind: str) -> int:
        default = 1 if kind == "bigbird" else 0
        return default if self.num_random_blocks is None else self.num_random_blocks

    def window_blocks(self, kind: str) -> int:
        """The sliding window in blocks: local reads num_local_blocks first, as NeoX does."""
        if kind == "local":
            chosen = self.num_local_blocks if self.num_local_blocks is not None else self.num_sliding_window_blocks
            return 4 if chosen is None else chosen
        return 3 if self.num_sliding_window_blocks is None else self.num_sliding_window_blocks


def block_layout(kind: str, spec: SparsitySpec, heads: int, blocks: int, layer_number: int) -> torch.Tensor:
    """(heads, blocks, blocks) bool: query block r may attend key block c, by DeepSpeed's rules for `kind` with
    unidirectional attention and no horizontal global attention. Without different_layout_per_head (always for
    local) every head has head 0's layout."""
    per_head = spec.different_layout_per_head and kind != "local"
    layout = torch.zeros(heads if per_head else 1, blocks, blocks, dtype=torch.bool, device="cpu")
    draw = random.Random(spec.seed * 1_000_003 + layer_number)
    for head in range(layout.shape[0]):
        _BUILDERS[kind](layout[head], spec, head, draw)
    layout = layout.tril()  # a block wholly in the future holds no key a query may see
    return layout.expand(heads, blocks, blocks) if not per_head else layout


def _local(layout: torch.Tensor, spec: SparsitySpec, head: int, draw: random.Random) -> None:
    _sliding(layout, spec.window_blocks("local"))


def _sliding(layout: torch.Tensor, window: int) -> None:
    """Row r sees blocks r - window // 2 .. r (the window is centred; its future half is causal-masked)."""
    reach = window // 2
    for row in range(layout.shape[0]):
        layout[row, max(0, row - reach) : row + reach + 1] = True


def _fixed(layout: torch.Tensor, spec: SparsitySpec, head: int, draw: random.Random) -> None:
    """Sparse Transformers' fixed pattern: local windows of num_local_blocks; the last num_global_blocks of each
    window (an earlier group for head h with num_different_global_patterns) seen by every later row."""
    blocks, local, grouped = layout.shape[0], spec.local_blocks(), spec.num_global_blocks
    for start in range(0, blocks, local):
        end = min(start + local, blocks)
        layout[start:end, start:end] = True  # the future half goes with tril
    first = local - (1 + head % spec.num_different_global_patterns) * grouped
    whole = blocks - blocks % local
    for start in range(first, whole, local):
        layout[start:, start : start + grouped] = True
    if whole < blocks:  # a short last window: its global group as far in as fits
        start = min(whole + first, blocks - grouped)
        layout[start:, start : start + grouped] = True


def _variable(layout: torch.Tensor, spec: SparsitySpec, head: int, draw: random.Random) -> None:
    """Fixed's generalisation: random blocks per row, local windows of the listed sizes (the last size
    repeating), global blocks by index (or index ranges) seen by every later row."""
    blocks = layout.shape[0]
    for row in range(blocks):
        layout[row, draw.sample(range(blocks), spec.random_blocks("sparse_variable"))] = True
    start = 0
    sizes = list(spec.local_window_blocks)
    while start < blocks:
        size = sizes.pop(0) if len(sizes) > 1 else sizes[0]
        layout[start : start + size, start : start + size] = True
        start += size
    _global_blocks(layout, spec, rows=False)


def _global_blocks(layout: torch.Tensor, spec: SparsitySpec, rows: bool) -> None:
    """The global blocks (global_block_indices, or the ranges to global_block_end_indices) are seen by every row;
    with `rows` they also see every block (in the past, after tril)."""
    blocks = layout.shape[0]
    ends = spec.global_block_end_indices or [index + 1 for index in spec.global_block_indices]
    for start, end in zip(spec.global_block_indices, ends, strict=True):
        if start < blocks:
            layout[:, start : min(end, blocks)] = True
            if rows:
                layout[start : min(end, blocks), :] = True


def _bigbird(layout: torch.Tensor, spec: SparsitySpec, head: int, draw: random.Random) -> None:
    """BigBird: random past blocks per row, a sliding window, and the first num_global_blocks blocks."""
    blocks, count = layout.shape[0], spec.random_blocks("bigbird")
    for row in range(blocks):
        layout[row, draw.sample(range(row + 1), min(count, row + 1))] = True
    _sliding(layout, spec.window_blocks("bigbird"))
    layout[:, : spec.num_global_blocks] = True


def _longformer(layout: torch.Tensor, spec: SparsitySpec, head: int, draw: random.Random) -> None:
    """Block-sparse Longformer: a sliding window and global blocks by index (or index ranges), which see every
    block and are seen by every block."""
    _sliding(layout, spec.window_blocks("bslongformer"))
    _global_blocks(layout, spec, rows=True)


_BUILDERS = {
    "local": _local,
    "sparse_fixed": _fixed,
    "sparse_variable": _variable,
    "bigbird": _bigbird,
    "bslongformer": _longformer,
}


class BlockSparseLayout:
    """One layer's layout and the masks drawn from it."""

    def __init__(self, kind: str, spec: SparsitySpec, heads: int, seq_length: int, layer_number: int):
        self.kind, self.block = kind, spec.block
        self.blocks = math.ceil(seq_length / spec.block)
        self.layout = block_layout(kind, spec, heads, self.blocks, layer_number)
        self._block_masks: dict[tuple, BlockMask] = {}
        """FlexAttention's block masks by (first head, heads, length, device), made once each."""

    def mask_mod(self, heads: slice, device: torch.device, past: int = 0):  # noqa: ANN201 (FlexAttention's form)
        """FlexAttention's rule for this rank's `heads`: queries at past + q, keys at kv (the layout is captured
        on `device`, so a compiled mask graph holds no copy)."""
        layout, block = self.layout[heads].to(device), self.block

        def allowed(batch: torch.Tensor, head: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            position = q + past
            return layout[head, position // block, kv // block] & (kv <= position)

        return allowed

    def mask(self, heads: slice, queries: int, keys: int, device: torch.device) -> torch.Tensor:
        """(1, heads, queries, keys) bool for the newest `queries` of `keys` positions (dense masks' form)."""
        self._check_length(keys)
        past = keys - queries
        position = torch.arange(past, keys, device=device)
        key = torch.arange(keys, device=device)
        layout = self.layout[heads].to(device)
        seen = layout[:, position // self.block][:, :, key // self.block]
        return (seen & (key[None, :] <= position[:, None]))[None]

    def block_mask(self, heads: slice, length: int, device: torch.device) -> BlockMask:
        """FlexAttention's block mask over one training sequence of `length` tokens."""
        self._check_length(length)
        local = len(range(*heads.indices(self.layout.shape[0])))
        return _block_mask(self, heads.start or 0, local, length, str(device))

    def _check_length(self, keys: int) -> None:
        if keys > self.blocks * self.block:
            raise ModelConfigError(
                f"model.attention_layers: a {self.kind} layer's layout covers "
                f"{self.blocks * self.block} positions (encoder_seq_length in whole blocks), "
                f"found {keys}"
            )


@cache
def _compiled_flex():  # noqa: ANN202
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _block_mask(layout: BlockSparseLayout, start: int, local: int, length: int, device: str) -> BlockMask:
    cached, key = layout._block_masks, (start, local, length, device)
    if key not in cached:
        from torch.nn.attention.flex_attention import create_block_mask

        # FlexAttention's own tiles (128 x 128): a tile the layout leaves empty is skipped, a partial one masked
        cached[key] = create_block_mask(
            layout.mask_mod(slice(start, start + local), torch.device(device)),
            None,
            local,
            length,
            length,
            device=device,
        )
    return cached[key]


def flex_block_sparse(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: BlockMask, *, compiled: bool = True
) -> torch.Tensor:
    """FlexAttention over the layout's blocks only (compiled: its kernels; eager: its reference, forward only on
    the CPU)."""
    from torch.nn.attention.flex_attention import flex_attention

    function = _compiled_flex() if compiled else flex_attention
    return function(query, key, value, block_mask=mask, enable_gqa=key.shape[1] != query.shape[1])


def _layout(config: Any, kind: str, layer_number: int) -> BlockSparseLayout:
    """The layer's layout over the training sequence (a soft prompt's positions included)."""
    length = config.seq_length + config.soft_prompt_tokens
    return BlockSparseLayout(kind, config.settings(kind), config.num_attention_heads, length, layer_number)


def _problems(config: Any, kinds: set[str]) -> list[str]:
    return config.settings(SPARSE_KINDS[0]).problems(kinds, config.seq_length + config.soft_prompt_tokens)


KINDS = tuple(
    LayerKind(kind, settings=SparsitySpec, attention_layout=_layout, problems=_problems, reads_row_positions=True)
    for kind in SPARSE_KINDS
)
"""Transformer layers whose attention reads a block-sparse layout."""
