"""Incremental decoding of the Megatron-style decoder: a key/value cache and the mask its attention needs.

Each attention layer appends the keys and values of the tokens it sees to the cache and attends over all of
them, so a generated token costs one position's work instead of the whole prefix's. Under tensor parallelism
a rank caches its own heads. The queries of one call sit at absolute positions `past .. past + seq - 1`, so
the causal (and sliding-window) mask is rectangular and anchored at the bottom right, which SDPA's
`is_causal` (anchored at the top left) does not give.
"""

from __future__ import annotations

import torch


class KVCache:
    """The keys and values (batch, heads, tokens, head_dim) each attention layer has seen, by layer number."""

    def __init__(self) -> None:
        self._layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def length(self) -> int:
        """Tokens cached (the position the next token takes)."""
        first = next(iter(self._layers.values()), None)
        return 0 if first is None else first[0].shape[2]

    def extend(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this call's keys and values to layer `layer`'s; returns every cached key and value."""
        if layer in self._layers:
            old_key, old_value = self._layers[layer]
            key, value = torch.cat([old_key, key], dim=2), torch.cat([old_value, value], dim=2)
        self._layers[layer] = key, value
        return key, value


def decoding_mask(past: int, seq: int, window: int | None, device: torch.device) -> torch.Tensor:
    """(1, 1, seq, past + seq) True where query i (at position past + i) may attend key j: j <= past + i and,
    with a sliding `window`, past + i - j < window."""
    query = torch.arange(past, past + seq, device=device)[:, None]
    key = torch.arange(past + seq, device=device)[None, :]
    allowed = key <= query
    if window is not None:
        allowed &= query - key < window
    return allowed[None, None]

