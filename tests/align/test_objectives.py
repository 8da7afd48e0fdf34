"""Objectives against values worked by hand."""

from __future__ import annotations

import math

import torch
from nxd_align import TokenObjective, objective_for
from nxd_models.token_losses import token_cross_entropy


def test_token_cross_entropy_of_uniform_logits_is_log_vocab_and_zero_where_ignored():
    losses = token_cross_entropy(torch.zeros(1, 3, 10), torch.tensor([[1, -100, 9]]))
    assert torch.allclose(losses, torch.tensor([[math.log(10), 0.0, math.log(10)]]))


def test_token_objective_sums_the_counted_labels_and_counts_them():
    logits = torch.zeros(2, 3, 4)
    logits[0, 0, 2] = math.log(3.0)  # p(2) = 3 / 6 = 1/2 at that position; elsewhere uniform 1/4
    batch = {"labels": torch.tensor([[2, -100, 1], [-100, -100, 3]])}
    loss, metrics = TokenObjective().loss(token_cross_entropy(logits, batch["labels"]), batch)
    assert loss.dtype == torch.float64 and metrics == {}
    assert math.isclose(loss.item(), math.log(2) + 2 * math.log(4), rel_tol=1e-6)
    assert TokenObjective().count(batch).item() == 3


def test_sft_shares_the_token_objective_under_its_own_name():
    assert objective_for("sft") == TokenObjective("sft")
    assert objective_for(None).name == "pretraining"
    assert objective_for("orpo", beta=0.1).name == "orpo" and objective_for("orpo", beta=0.1).beta == 0.1
