"""The reward model's pairwise loss (with GPT-NeoX's z_loss and TRL's margin) on fixed scores against
the formula worked by hand, and its objective reading each row's score at its score position."""

from __future__ import annotations

import math

import pytest
import torch
from nxd_align import RewardObjective, reward_loss


def _softplus(x: float) -> float:
    return math.log(1 + math.exp(x))


@pytest.mark.parametrize(
    "chosen, rejected, z_loss, margin, expected",
    [
        (1.0, -1.0, 0.0, None, _softplus(-2.0)),  # -log sigmoid(2)
        (1.0, -1.0, 0.1, None, _softplus(-2.0) + 0.1 * (1 + 1)),  # + z (r_c^2 + r_r^2)
        (0.5, 0.25, 0.0, 1.0, _softplus(0.75)),  # -log sigmoid(0.25 - 1)
        (-2.0, 1.0, 0.01, 0.5, _softplus(3.5) + 0.01 * (4 + 1)),  # a wrong order costs more
    ],
)
def test_the_pairwise_loss_is_its_formula(chosen, rejected, z_loss, margin, expected):
    terms = reward_loss(
        torch.tensor([chosen]), torch.tensor([rejected]), z_loss, None if margin is None else torch.tensor([margin])
    )
    assert abs(terms.loss.item() - expected) < 1e-6 * max(1.0, expected)
    assert terms.margins.item() == pytest.approx(chosen - rejected)  # the margin logged is the scores' difference
    assert terms.accuracies.item() == float(chosen > rejected)


def test_the_objective_reads_each_score_at_its_position_and_skips_padding_pairs():
    scores = torch.arange(24, dtype=torch.float32).view(4, 6) / 10  # row r, position t: (6 r + t) / 10
    batch = {
        "labels": torch.tensor([[5] * 6, [5] * 6, [-100] * 6, [-100] * 6]),  # the second pair is padding
        "position_ids": torch.arange(6).expand(4, 6),
        "score_position": torch.tensor([4, 2, 0, 0]),
        "margin": torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64),
    }
    chosen, rejected = 0.4, 0.8  # rows 0 and 1 at positions 4 and 2
    objective = RewardObjective(z_loss=0.1)
    loss, metrics = objective.loss(scores, batch)
    assert objective.count(batch).item() == 1
    assert loss.item() == pytest.approx(
        _softplus(-(chosen - rejected - 0.5)) + 0.1 * (chosen**2 + rejected**2), abs=1e-6
    )
    assert metrics["accuracy"].item() == 0.0 and metrics["margin"].item() == pytest.approx(-0.4, abs=1e-6)
    assert metrics["rewards/chosen"].item() == pytest.approx(0.4, abs=1e-6)


def test_packed_pairs_score_as_padded_pairs_through_a_model():
    """nxd-data's packed micro-batch (every sequence a document of one row) gives a Megatron-style
    reward model the same scores, loss and gradient as the padded rows."""
    from nxd_data import collate_packed_pairs, collate_pairs
    from nxd_models import GPTConfig, build_causal_lm, causal_lm_logits

    spec = GPTConfig(
        vocab_size=64,
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_kv_heads=2,
        seq_length=16,
        ffn_hidden_size=64,
        normalization="rmsnorm",
        activation="swiglu",
        position_embedding_type="rope",
        has_bias=False,
        share_embeddings_and_output_weights=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        make_vocab_size_divisible_by=1,
    )
    model = build_causal_lm(spec, seed=0, head="score")
    lengths = [(7, 11), (5, 3), (0, 0)]  # the third pair is padding
    samples = []
    for index, (chosen, rejected) in enumerate(lengths):
        ids = torch.full((2, 16), 63)
        labels = torch.full((2, 16), -100)
        for row, length in enumerate((chosen, rejected)):
            ids[row, :length] = torch.arange(length) + 3 * index + row
            labels[row, 2 : max(length - 1, 2)] = 1
        last = torch.tensor([max(chosen - 1, 0), max(rejected - 1, 0)])
        samples.append(
            {
                "input_ids": ids,
                "labels": labels,
                "position_ids": torch.arange(16).expand(2, 16).clone(),
                "score_position": last,
                "margin": torch.full((2,), 0.25, dtype=torch.float64),
            }
        )
    objective = RewardObjective(z_loss=0.01)
    results = []
    for batch in (collate_pairs(samples, trim_to=8), collate_packed_pairs(samples, multiple_of=8)):
        model.zero_grad()
        scores = causal_lm_logits(model, batch["input_ids"], batch["position_ids"], batch.get("document_ids"))[..., 0]
        loss, metrics = objective.loss(scores, batch)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((loss.item(), objective.count(batch).item(), metrics["rewards/chosen"].item(), grads))
    (padded_loss, padded_count, padded_chosen, padded_grads), (loss, count, chosen, grads) = results
    assert count == padded_count == 2
    assert loss == pytest.approx(padded_loss, abs=1e-6) and chosen == pytest.approx(padded_chosen, abs=1e-6)
    assert (grads - padded_grads).abs().max().item() < 1e-5
