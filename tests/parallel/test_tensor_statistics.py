"""Per-tensor statistics and the gradient noise scale, against values worked by hand."""

from __future__ import annotations

import math

import pytest
import torch
from nxd_parallel import GradientNoiseScale, tensor_norms, zero_percentages


def test_zero_percentages_and_norms_by_hand():
    named = {"a": torch.tensor([[0.0, 3.0], [0.0, 4.0]]), "b": torch.tensor([0.0, 0.0, 0.0, 2.0, 0.0])}
    assert zero_percentages(named) == {"a": 50.0, "b": 80.0}
    assert tensor_norms(named) == {"a": 5.0, "b": 2.0}


def test_the_noise_scale_is_neox_estimator_worked_by_hand():
    """Global batch 4, n_batches 2: each pair of steps gives |G_small|^2 (the second step's) and |G_big|^2 (the pair's
    mean), |G|^2 = (8 big - 4 small) / 4 and tr(S) = (small - big) / (1/4 - 1/8), moving averages with beta 0.99."""
    noise = GradientNoiseScale(4, 2)
    steps = [[1.0, 2.0], [3.0, 0.0], [float("inf"), 0.0], [0.0, 1.0], [1.0, 1.0]]
    seen = []
    for gradient in steps:  # two tensors each, so the sums run over both
        noise.update({"a": torch.tensor(gradient[:1]), "b": torch.tensor(gradient[1:])})
        seen.append(noise.value)
    # steps 1-2: small |(3, 0)|^2 = 9, big |(2, 1)|^2 = 5: |G|^2 = 1, tr(S) = 32
    assert seen[:3] == [None, 32.0, 32.0]  # the non-finite step is left out, as NeoX leaves out an overflow
    # steps 4-5: small |(1, 1)|^2 = 2, big |(0.5, 1)|^2 = 1.25: |G|^2 = 0.5, tr(S) = 6; the averages' corrections cancel
    squared, trace = 0.99 * 0.01 * 1 + 0.01 * 0.5, 0.99 * 0.01 * 32 + 0.01 * 6
    assert math.isclose(seen[4], trace / squared, rel_tol=1e-12)


def test_the_noise_scale_with_offload_and_a_missing_gradient():
    noise = GradientNoiseScale(4, 2, offload=True)
    for gradient in ([1.0, 2.0], [3.0, 0.0]):
        noise.update({"a": torch.tensor(gradient)})
    assert noise.value == 32.0 and noise.summed == {}
    absent = GradientNoiseScale(4, 2)  # a parameter without a gradient in a step counts as a zero gradient
    absent.update({"a": torch.tensor([1.0]), "b": torch.tensor([2.0])})
    absent.update({"a": torch.tensor([3.0])})
    assert absent.value == 32.0  # small |(3, 0)|^2, big |(2, 1)|^2, as above
    with pytest.raises(ValueError, match="n_batches of at least 2"):
        GradientNoiseScale(4, 1)
