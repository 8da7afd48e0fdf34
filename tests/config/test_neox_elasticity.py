"""DeepSpeed's elasticity block (GPT-NeoX passes it on) against its algorithm worked by hand, and in NeoX files:
the batch it gives, the same global batch on every valid data-parallel size, and what it refuses."""

from __future__ import annotations

import pytest
from nxd_config.neox.elasticity import ElasticityError, elastic_batch, valid_sizes

from tests.config.test_neox_dialect import MODEL, errors, load, notices

ELASTIC = {"enabled": True, "max_train_batch_size": 2000, "micro_batch_sizes": [2, 4, 6], "version": 0.1}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def test_the_documented_example_by_hand():
    """micro-batches 2, 4, 6 under 2000. The candidates scale each base by the largest of the listed highly
    composite numbers within 2000 // base: 2 x 840 = 1680 (1000), 4 x 360 = 1440 (500), 6 x 240 = 1440 (333), and
    their lcm 12 x 120 = 1440 (166). 1680 splits on the divisors of 840 (its micro-batches of 2, 4, 6 give 840, 420
    and 280 of them, each dividing 840): 2^3 x 3 x 5 x 7 has 32; 1440 on those of 720: 30. So 1680, and on 3 ranks
    560 per rank takes micro-batches of 4 (6 does not divide 560), on 2 ranks 840 takes 6."""
    assert valid_sizes(1680, [2, 4, 6], 1, 10000) == _divisors(840)
    assert valid_sizes(1440, [2, 4, 6], 1, 10000) == _divisors(720) and len(_divisors(720)) == 30
    for dp, micro in ((1, 6), (2, 6), (3, 4), (8, 6), (840, 2)):
        found = elastic_batch(micro_batches=[2, 4, 6], max_batch=2000, data_parallel=dp, version=0.1)
        assert (found.global_batch, found.micro_batch, len(found.valid_sizes)) == (1680, micro, 32), dp
    with pytest.raises(ElasticityError, match=r"the global batch 1680 is valid on data-parallel sizes \[1, 2, 3, "):
        elastic_batch(micro_batches=[2, 4, 6], max_batch=2000, data_parallel=9, version=0.1)


def test_prefer_smaller_and_a_gpu_range():
    """max_gpus 4 and prefer_larger_batch false: 1680 and 1440 both split on 1, 2, 3, 4: the smaller wins."""
    found = elastic_batch(
        micro_batches=[2, 4, 6], max_batch=2000, data_parallel=4, max_gpus=4, prefer_larger=False, version=0.1
    )
    assert (found.global_batch, found.valid_sizes, found.micro_batch) == (1440, (1, 2, 3, 4), 6)


def test_version_02_counts_nodes_and_takes_a_size_outside_the_valid_ones():
    """Nodes of 4 processes, two per model (2 data-parallel ranks a node): the 0.1 rule on 2000 / 2 = 1000 over
    nodes: 2 x 360 = 720, 4 x 240 = 960, 6 x 120 = 720, lcm 12 x 60 = 720; 960 splits on the 24 divisors of 480,
    720 on the 24 of 360: the larger, 960, times 2 per node: 1920 on 2 x each node count. 4 processes (one node,
    2 data-parallel ranks) are valid: 1920 / 2 = 960 per rank, in micro-batches of 6. Outside the valid sizes
    (nodes of 2, min_gpus 4: 2 to 4 nodes, 1920 on 4, 6, 8 ranks; the run has 2) the largest multiple of a
    micro-batch x 2 within 2000 is taken: 2 x 2 x 500 = 4 x 2 x 250 = 2000 (6 x 2 x 166 = 1992), and 1000 per rank
    splits into micro-batches of 4, not 6."""
    found = elastic_batch(
        micro_batches=[2, 4, 6],
        max_batch=2000,
        data_parallel=2,
        version=0.2,
        gpus_per_node=4,
        model_parallel=2,
        max_gpus=10000,
    )
    assert found.global_batch == 1920 and found.micro_batch == 6 and found.valid_sizes[:3] == (2, 4, 6)
    outside = elastic_batch(
        micro_batches=[2, 4, 6], max_batch=2000, data_parallel=2, version=0.2, gpus_per_node=2, min_gpus=4, max_gpus=8
    )
    assert (outside.global_batch, outside.valid_sizes, outside.micro_batch) == (2000, (2,), 4)


def test_a_neox_file_gets_the_same_batch_on_every_valid_size(tmp_path):
    file = {key: value for key, value in MODEL.items() if key != "train_micro_batch_size_per_gpu"}
    for gpus, micro in ((1, 6), (2, 6), (3, 4)):
        data = load(tmp_path, {**file, "elasticity": ELASTIC, "num_gpus": gpus}).data
        assert (data.global_batch_size, data.micro_batch_size) == (1680, micro), gpus
    found = notices(tmp_path, {**file, "elasticity": ELASTIC, "num_gpus": 2})
    assert any(
        "the global batch 1680 in micro-batches of 6 on 2 data-parallel rank(s); a resume keeps it on 1, 2, 3" in n
        for n in found
    ), found


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"train_micro_batch_size_per_gpu": 2},
            "train_micro_batch_size_per_gpu: elasticity takes control of the batch "
            "sizes (DeepSpeed's rule): remove train_micro_batch_size_per_gpu, or set elasticity.ignore_non_elastic_batch_info",
        ),
        (
            {"elasticity": {**ELASTIC, "max_gpus": 4}, "num_gpus": 8},
            "elasticity: expected a block that gives 8 data-parallel rank(s) a batch: the global batch 1680 is valid on "
            "data-parallel sizes [1, 2, 3, 4]; this run has 8",
        ),
        (
            {"elasticity": {**ELASTIC, "micro_batch_sizes": []}},
            "elasticity.micro_batch_sizes: expected a list of positive",
        ),
        ({"elasticity": {**ELASTIC, "max_gpu": 4}}, "elasticity.max_gpu: unknown elasticity setting"),
        ({"elasticity": {**ELASTIC, "version": 0.3}}, "elasticity.version: expected 0.1 or 0.2, found 0.3"),
        (
            {"elasticity": {"enabled": True, "micro_batch_sizes": [2]}},
            "elasticity.max_train_batch_size: expected it in an enabled elasticity block (DeepSpeed requires it)",
        ),
        (
            {"elasticity": {**ELASTIC, "num_gpus_per_node": 0}},
            "elasticity.num_gpus_per_node: expected a positive whole number, found 0",
        ),
        (
            {"elasticity": {**ELASTIC, "min_gpus": 8, "max_gpus": 4}},
            "elasticity.min_gpus: expected at most max_gpus (4)",
        ),
        (
            {"elasticity": {**ELASTIC, "version": 0.2, "model_parallel_size": 2}},
            "elasticity.model_parallel_size: expected "
            "this run's model-parallel size (model_parallel_size x pipe_parallel_size = 1), found 2",
        ),
    ],
)
def test_what_elasticity_refuses(tmp_path, extra, message):
    file = {key: value for key, value in MODEL.items() if key != "train_micro_batch_size_per_gpu"}
    found = errors(tmp_path, {**file, "elasticity": ELASTIC, **extra})
    assert any(message in m for m in found), found


def test_ignore_non_elastic_batch_info_lets_the_block_win(tmp_path):
    data = load(tmp_path, {**MODEL, "elasticity": {**ELASTIC, "ignore_non_elastic_batch_info": True}}).data
    assert (data.global_batch_size, data.micro_batch_size) == (1680, 6)
