"""The reward model's pairwise loss (with GPT-NeoX's z_loss and TRL's margin) on fixed scores against
the formula worked by hand, and its objective reading each row's score at its score position."""

from __future__ import annotations

import math

import pytest
import torch
from nxd_align import RewardObjective, reward_loss


def _softplus(x: float) -> float:
    return math.log(1 + math.exp(x))


@pytest.mark.parametrize("chosen, rejected, z_loss, margin, expected", [
    (1.0, -1.0, 0.0, None, _softplus(-2.0)),                       # -log sigmoid(2)
    (1.0, -1.0, 0.1, None, _softplus(-2.0) + 0.1 * (1 + 1)),       # + z (r_c^2 + r_r^2)
    (0.5, 0.25, 0.0, 1.0, _softplus(0.75)),                        # -log sigmoid(0.25 - 1)
    (-2.0, 1.0, 0.01, 0.5, _softplus(3.5) + 0.01 * (4 + 1)),      # a wrong order costs more
])  # fmt: skip
def test_the_pairwise_loss_is_its_formula(chosen, rejected, z_loss, margin, expected):
    terms = reward_loss(torch.tensor([chosen]), torch.tensor([rejected]), z_loss,
                        None if margin is None else torch.tensor([margin]))  # fmt: skip
    assert abs(terms.loss.item() - expected) < 1e-6 * max(1.0, expected)
    assert terms.margins.item() == pytest.approx(chosen - rejected)  # the margin logged is the scores' difference
    assert terms.accuracies.item() == float(chosen > rejected)


def test_the_objective_reads_each_score_at_its_position_and_skips_padding_pairs():
    scores = torch.arange(24, dtype=torch.float32).view(4, 6) / 10  # row r, position t: (6 r + t) / 10
    batch = {"labels": torch.tensor([[5] * 6, [5] * 6, [-100] * 6, [-100] * 6]),  # the second pair is padding
             "position_ids": torch.arange(6).expand(4, 6), "score_position": torch.tensor([4, 2, 0, 0]),
             "margin": torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)}  # fmt: skip
    chosen, rejected = 0.4, 0.8  # rows 0 and 1 at positions 4 and 2
    objective = RewardObjective(z_loss=0.1)
    loss, metrics = objective.loss(scores, batch)
    assert objective.count(batch).item() == 1
    assert loss.item() == pytest.approx(_softplus(-(chosen - rejected - 0.5)) + 0.1 * (chosen**2 + rejected**2),
                                        abs=1e-6)  # fmt: skip
    assert metrics["accuracy"].item() == 0.0 and metrics["margin"].item() == pytest.approx(-0.4, abs=1e-6)
    assert metrics["rewards/chosen"].item() == pytest.approx(0.4, abs=1e-6)
