"""Incremental decoding of the Megatron-style decoder: a key/value cache and the mask its attention needs.

Each attention layer appends the keys and values of the tokens it sees to the cache and attends over all of
them, so a generated token costs one position's work instead of the whole prefix's. Under tensor parallelism
a rank caches its own heads. The queries of one call sit at absolute positions `past .. past + seq - 1`, so
the causal mask is rectangular and anchored at the bottom right, which SDPA's `is_causal` (anchored at the top
left) does not give: the attention core anchors it there when queries and keys differ in length, and a
sliding window that binds gets `decoding_mask`.
"""

from __future__ import annotations

import torch


class KVCache:
    """The keys and values (batch, heads, tokens, head_dim) each attention layer has seen, by the layer's position
    in the stack (a shared layer runs at several). Each position's are written into a buffer that doubles when
    full, so a token costs no copy of the past ones."""

    def __init__(self) -> None:
        self._layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._length: dict[int, int] = {}

    @property
    def length(self) -> int:
        """Tokens cached (the position the next token takes)."""
        return next(iter(self._length.values()), 0)

    def slot(self, position: int) -> LayerCache:
        """The cache of the layer at `position` in the stack."""
        return LayerCache(self, position)

    def reorder_cache(self, rows: torch.Tensor) -> None:
        """Keep only the batch's `rows`, in their order (transformers' `Cache.reorder_cache`): generation drops
        the rows that have ended."""
        for layer, (keys, values) in self._layers.items():
            self._layers[layer] = keys.index_select(0, rows), values.index_select(0, rows)

    def extend(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this call's keys and values to position `layer`'s; returns every cached key and value."""
        past, new = self._length.get(layer, 0), key.shape[2]
        keys, values = self._layers.get(layer, (None, None))
        if keys is None or past + new > keys.shape[2]:
            capacity = max(2 * past, past + new, 16)
            grown = [
                torch.empty(*t.shape[:2], capacity, t.shape[3], dtype=t.dtype, device=t.device) for t in (key, value)
            ]
            if keys is not None:
                grown[0][:, :, :past], grown[1][:, :, :past] = keys[:, :, :past], values[:, :, :past]
            keys, values = grown
            self._layers[layer] = keys, values
        keys[:, :, past : past + new], values[:, :, past : past + new] = key, value
        self._length[layer] = past + new
        return keys[:, :, : past + new], values[:, :, : past + new]


class LayerCache:
    """One position's part of a `KVCache`: what an attention layer extends."""

    def __init__(self, cache: KVCache, position: int):
        self.cache, self.position = cache, position

    def extend(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.extend(self.position, key, value)


def decoding_mask(past: int, seq: int, window: int | None, device: torch.device) -> torch.Tensor | None:
    """(1, 1, seq, past + seq) True where query i (at position past + i) may attend key j: j <= past + i and,
    with a sliding `window`, past + i - j < window; None without a window that binds (the attention's own causal
    rule then covers it)."""
    if window is None or past + seq <= window:
        return None
    query = torch.arange(past, past + seq, device=device)[:, None]
    key = torch.arange(past + seq, device=device)[None, :]
    return ((key <= query) & (query - key < window))[None, None]
