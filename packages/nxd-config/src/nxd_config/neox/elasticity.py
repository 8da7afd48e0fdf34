"""DeepSpeed's elastic batch (the `elasticity` block GPT-NeoX passes on): one global batch that divides into
micro-batches of the listed sizes on every data-parallel size in a range, so that a job resumed on another
number of processes keeps its batch (deepspeed/elasticity/elasticity.py, versions 0.1 and 0.2).

Version 0.1 scales each listed micro-batch size, and their least common multiple, by the largest of the
smallest highly composite numbers that keeps it within max_train_batch_size, and keeps the candidate valid
on the most data-parallel sizes in min_gpus..max_gpus (ties: the larger batch with prefer_larger_batch, else
the smaller). A size is valid when the batch splits into micro-batches of a listed size on it. Version 0.2
counts whole nodes of num_gpus_per_node processes, model_parallel_size of them sharing a model, and on a size
outside the valid ones takes the largest (or smallest) multiple of a micro-batch x the size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HIGHLY_COMPOSITE = (
    1,
    2,
    4,
    6,
    12,
    24,
    36,
    48,
    60,
    120,
    180,
    240,
    360,
    720,
    840,
    1260,
    1680,
    2520,
    5040,
    7560,
    10080,
    15120,
    20160,
    25200,
    27720,
    45360,
    50400,
    55440,
    83160,
    110880,
    166320,
    221760,
    277200,
    332640,
    498960,
    554400,
    665280,
    720720,
)
"""The 38 smallest highly composite numbers (batches up to 720K), as DeepSpeed lists them."""


@dataclass(frozen=True)
class ElasticBatch:
    """The global batch, the data-parallel sizes it is valid on, and this size's micro-batch."""

    global_batch: int
    valid_sizes: tuple[int, ...]
    micro_batch: int | None


class ElasticityError(ValueError):
    """The block cannot give this data-parallel size a batch (the message says why)."""


def valid_sizes(batch: int, micro_batches: list[int], low: int, high: int) -> list[int]:
    """The sizes in low..high on which `batch` splits into whole micro-batches of one of `micro_batches`."""
    found = set()
    for micro in micro_batches:
        if batch % micro == 0:
            most = batch // micro
            found.update(size for size in range(max(low, 1), min(high, most) + 1) if most % size == 0)
    return sorted(found)


def _scaled(base: int, limit: int) -> int:
    """`base` x the largest listed highly composite number that keeps it within `limit` (itself when above)."""
    if base >= limit:
        return base
    fits = [number for number in HIGHLY_COMPOSITE if number <= limit // base]
    return fits[-1] * base


def _version_01(
    micro_batches: list[int], limit: int, low: int | None, high: int | None, prefer_larger: bool
) -> tuple[int, list[int]]:
    low = low or 1
    high = high or limit // min(micro_batches)
    if any(micro > limit for micro in micro_batches):
        raise ElasticityError(
            f"expected every micro_batch_sizes entry at most max_train_batch_size ({limit}), found {micro_batches}"
        )
    candidates = {_scaled(base, limit) for base in [*micro_batches, math.lcm(*micro_batches)]}
    counted = {batch: valid_sizes(batch, micro_batches, low, high) for batch in candidates}
    most = max(len(sizes) for sizes in counted.values())
    if not most:
        raise ElasticityError(
            f"none of the candidate batches {sorted(counted)} splits into micro_batch_sizes "
            f"{micro_batches} on any data-parallel size from {low} to {high}"
        )
    tied = [batch for batch, sizes in counted.items() if len(sizes) == most]
    best = max(tied) if prefer_larger else min(tied)
    return best, counted[best]


def elastic_batch(
    *,
    micro_batches: list[int],
    max_batch: int,
    data_parallel: int,
    min_gpus: int = 1,
    max_gpus: int = 10000,
    prefer_larger: bool = True,
    version: float = 0.2,
    gpus_per_node: int = 1,
    model_parallel: int = 1,
) -> ElasticBatch:
    """DeepSpeed's compute_elastic_config for a run of `data_parallel` data-parallel ranks."""
    if version == 0.1:
        if model_parallel > 1:
            raise ElasticityError(
                f"version 0.1 does not take model parallelism; expected model_parallel_size 1 or "
                f"version 0.2, found model_parallel_size {model_parallel}"
            )
        batch, sizes = _version_01(micro_batches, max_batch, min_gpus, max_gpus, prefer_larger)
    elif version == 0.2:
        # the run's processes, as a scheduler counts them (DeepSpeed's engine passes the data-parallel size, which
        # its node arithmetic divides by the model-parallel size once more)
        batch, sizes = _version_02(
            micro_batches,
            max_batch,
            data_parallel * model_parallel,
            min_gpus,
            max_gpus,
            prefer_larger,
            gpus_per_node,
            model_parallel,
        )
    else:
        raise ElasticityError(f"expected version 0.1 or 0.2, found {version}")
    if data_parallel not in sizes:
        raise ElasticityError(
            f"the global batch {batch} is valid on data-parallel sizes {sizes}; this run has {data_parallel}"
        )
    micro = next((m for m in sorted(set(micro_batches), reverse=True) if batch // data_parallel % m == 0), None)
    if micro is None:
        raise ElasticityError(f"no micro_batch_sizes entry divides {batch} // {data_parallel}")
    return ElasticBatch(batch, tuple(sizes), micro)


def _version_02(
    micro_batches: list[int],
    limit: int,
    current: int,
    low: int,
    high: int,
    prefer_larger: bool,
    gpus_per_node: int,
    model_parallel: int,
) -> tuple[int, list[int]]:
    if gpus_per_node % model_parallel:
        raise ElasticityError(
            f"expected num_gpus_per_node ({gpus_per_node}) to be a multiple of model_parallel_size ({model_parallel})"
        )
    per_node = gpus_per_node // model_parallel
    batch, nodes = _version_01(
        micro_batches, limit // per_node, low // gpus_per_node, high // gpus_per_node, prefer_larger
    )
    batch, sizes = batch * per_node, [count * per_node for count in nodes]
    if current // model_parallel in sizes:
        return batch, sizes
    ranks = current / gpus_per_node * per_node  # DeepSpeed's arithmetic, a float until the end
    candidates = [math.floor(limit / (micro * ranks)) * micro * ranks for micro in micro_batches]
    return int(max(candidates) if prefer_larger else min(candidates)), [int(ranks)]
