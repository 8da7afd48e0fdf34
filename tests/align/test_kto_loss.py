"""KTO's loss, KL baseline and objective on fixed log-probs against the KTO paper's formula (eq. 7,
as TRL implements it) worked by hand."""

from __future__ import annotations

import math

import pytest
import torch
from nxd_align import KTOObjective, kl_baseline, kto_loss
from nxd_align.kto import halves_kl
from nxd_models.token_losses import token_cross_entropy


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_kto_loss_is_the_formula_for_both_kinds_and_their_weights():
    # log-ratios 1 (desirable) and -1 (undesirable), baseline 0.4, beta 0.5, weights 1 and 1.5
    terms = kto_loss(
        torch.tensor([-10.0, -12.0]),
        torch.tensor([-11.0, -11.0]),
        torch.tensor([True, False]),
        0.4,
        beta=0.5,
        desirable_weight=1.0,
        undesirable_weight=1.5,
    )
    expected = [1 - _sigmoid(0.5 * (1 - 0.4)), 1.5 * (1 - _sigmoid(0.5 * (0.4 + 1)))]
    assert terms.loss.tolist() == pytest.approx(expected, abs=1e-6)
    assert terms.rewards.tolist() == pytest.approx([0.5, -0.5])


def test_at_the_reference_with_no_baseline_every_example_costs_a_half():
    terms = kto_loss(torch.tensor([-3.0, -7.0]), torch.tensor([-3.0, -7.0]), torch.tensor([True, False]), 0.0, 0.1)
    assert terms.loss.tolist() == pytest.approx([0.5, 0.5])


def test_the_kl_baseline_is_the_clamped_mean_over_valid_rows_of_every_rank():
    policy, reference = torch.tensor([-5.0, -6.5, -9.0]), torch.tensor([-6.0, -6.0, 0.0])
    valid = torch.tensor([True, True, False])  # the third row is padding
    assert kl_baseline(policy, reference, valid).item() == pytest.approx((1.0 - 0.5) / 2)
    assert kl_baseline(reference, policy, valid).item() == 0.0  # a negative mean is clamped at 0
    other_rank = torch.tensor([3.0, 2.0])  # another rank's sum of differences and count
    summed = kl_baseline(policy, reference, valid, lambda sums: sums + other_rank)
    assert summed.item() == pytest.approx((0.5 + 3.0) / 4)


def test_the_kto_objective_sums_the_formula_and_reports_means_per_kind():
    # three rows over a vocabulary of 4: logits are log-probabilities, so each label's log-prob is known
    table = torch.tensor([[0.5, 0.25, 0.125, 0.125], [0.25, 0.5, 0.125, 0.125], [0.125, 0.125, 0.5, 0.25]])
    logits = table.log().expand(4, 3, 4).clone()
    labels = torch.tensor([[0, 1, -100], [1, 2, -100], [0, -100, -100], [-100] * 3])  # the last row is padding
    batch = {
        "labels": labels,
        "reference_log_probs": torch.tensor([-2.0, -3.0, -1.0, 0.0]),
        "kto_label": torch.tensor([1.0, 0.0, 1.0, 0.0]),
        "kto_kl": torch.tensor(0.2, dtype=torch.float64),
    }
    policy = [2 * math.log(0.5), math.log(0.25) + math.log(0.125), math.log(0.5)]
    ratios = [p - r for p, r in zip(policy, [-2.0, -3.0, -1.0], strict=True)]
    beta = 0.5
    expected = [
        1 - _sigmoid(beta * (ratios[0] - 0.2)),
        1 - _sigmoid(beta * (0.2 - ratios[1])),
        1 - _sigmoid(beta * (ratios[2] - 0.2)),
    ]
    objective = KTOObjective(beta=beta)
    loss, metrics = objective.loss(token_cross_entropy(logits, labels), batch)
    count = objective.count(batch).item()
    assert count == 3
    assert loss.item() == pytest.approx(sum(expected), abs=1e-6)
    values = objective.report({name: value.item() / count for name, value in metrics.items()})
    assert values["rewards/chosen"] == pytest.approx(beta * (ratios[0] + ratios[2]) / 2, abs=1e-6)
    assert values["rewards/rejected"] == pytest.approx(beta * ratios[1], abs=1e-6)
    assert values["rewards/margins"] == pytest.approx(values["rewards/chosen"] - values["rewards/rejected"])
    assert values["logps/rejected"] == pytest.approx(policy[1], abs=1e-6)
    assert values["kl"] == pytest.approx(0.2) and values["share/chosen"] == pytest.approx(2 / 3)


def test_batch_halves_measures_each_half_against_the_other_and_scales_beta_by_the_reward():
    """GPT-NeoX's KL estimate (megatron/training.py, train_impl kto) in the KTO formula, worked by hand on
    four rows: halves [0, 1] and [2, 3]; each half's baseline is the mean of max(0, summed log-ratio) over
    the other half; the loss is the mean over rows of w (1 - sigmoid(beta r (ratio - baseline))), w the
    row's own kind's weight, a reward within 0.001 of 0 weighing nothing."""
    table = torch.tensor([[0.5, 0.25, 0.125, 0.125], [0.25, 0.5, 0.125, 0.125], [0.125, 0.125, 0.5, 0.25]])
    logits = table.log().expand(4, 3, 4).clone()
    labels = torch.tensor([[0, 1, -100], [1, 2, -100], [0, -100, -100], [2, 2, -100]])
    policy = [2 * math.log(0.5), math.log(0.25) + math.log(0.125), math.log(0.5), 2 * math.log(0.125)]
    reference = [-2.0, -2.0, -1.0, -4.5]
    rewards = [1.0, -1.0, 2.0, 0.0]
    ratios = [p - r for p, r in zip(policy, reference, strict=True)]  # 0.614, -1.466, 0.307, 0.341
    first_half_kl = (max(0.0, ratios[0]) + max(0.0, ratios[1])) / 2
    second_half_kl = (max(0.0, ratios[2]) + max(0.0, ratios[3])) / 2
    beta, desirable_weight, undesirable_weight = 0.5, 1.0, 1.5
    expected = [
        desirable_weight * (1 - _sigmoid(beta * 1.0 * (ratios[0] - second_half_kl))),
        undesirable_weight * (1 - _sigmoid(beta * -1.0 * (ratios[1] - second_half_kl))),
        desirable_weight * (1 - _sigmoid(beta * 2.0 * (ratios[2] - first_half_kl))),
        0.0,
    ]
    batch = {
        "labels": labels,
        "reference_log_probs": torch.tensor(reference, dtype=torch.float64),
        "kto_reward": torch.tensor(rewards, dtype=torch.float64),
        "kto_label": torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64),
    }
    objective = KTOObjective(
        beta=beta, desirable_weight=desirable_weight, undesirable_weight=undesirable_weight, kl_estimate="batch_halves"
    )
    loss, metrics = objective.loss(token_cross_entropy(logits, labels), batch)
    count = objective.count(batch).item()
    assert count == 4  # the zero-reward row counts in the mean, as in NeoX's loss.mean()
    assert loss.item() / count == pytest.approx(sum(expected) / 4, abs=1e-6)
    assert halves_kl(torch.tensor(policy), torch.tensor(reference), torch.ones(4)).tolist() == pytest.approx(
        [second_half_kl] * 2 + [first_half_kl] * 2, abs=1e-6
    )
    values = objective.report({name: value.item() / count for name, value in metrics.items()})
    assert values["kl"] == pytest.approx((first_half_kl + second_half_kl) / 2, abs=1e-6)
    assert values["share/chosen"] == 0.5 and values["share/rejected"] == 0.25  # the zero-reward row is neither
