"""DPO's (each loss type) and ORPO's losses on fixed log-probs against their published formulas
worked by hand, and ORPO's odds-ratio term finite as the average log-prob nears 0."""

from __future__ import annotations

import math

import pytest
import torch
from nxd_align.preference import dpo_loss, log1mexp, orpo_loss, sequence_log_probs
from nxd_models.token_losses import token_cross_entropy


@pytest.mark.parametrize(
    "beta, chosen, rejected, ref_chosen, ref_rejected, expected",
    [
        (0.1, -4.0, -6.0, -4.0, -6.0, math.log(2)),  # policy == reference: ln 2 whatever the log-probs
        (0.1, -1.0, -2.0, -1.5, -1.5, 0.6443966600735709),  # rewards 0.05, -0.05: ln(1 + e^-0.1)
        (0.5, -3.0, -1.0, -2.0, -2.0, 1.3132616875182228),  # rewards -0.5, 0.5: ln(1 + e)
        (1.0, -10.0, -30.0, -20.0, -20.0, 2.061153620314381e-09),  # margin 20: ln(1 + e^-20)
    ],
)
def test_dpo_sigmoid_loss_is_the_published_formula(beta, chosen, rejected, ref_chosen, ref_rejected, expected):
    terms = dpo_loss(*(torch.tensor([value]) for value in (chosen, rejected, ref_chosen, ref_rejected)), beta)
    assert abs(terms.loss.item() - expected) < 1e-6 * max(1.0, expected)
    assert terms.chosen_rewards.item() == pytest.approx(beta * (chosen - ref_chosen))
    assert terms.rejected_rewards.item() == pytest.approx(beta * (rejected - ref_rejected))
    assert terms.accuracies.item() == float(terms.margins.item() > 0)


def _softplus(x: float) -> float:
    """-log sigmoid(-x) = log(1 + e^x), by hand."""
    return math.log(1 + math.exp(x))


# policy chosen -10, rejected -12; reference -11, -11: log-ratios 1 and -1, h = 2
@pytest.mark.parametrize(
    "loss_type, beta, smoothing, expected",
    [
        ("sigmoid", 0.5, 0.0, _softplus(-1)),  # -log sigmoid(beta h), beta h = 1
        ("sigmoid", 0.5, 0.1, 0.9 * _softplus(-1) + 0.1 * _softplus(1)),  # cDPO: labels flipped 10% of the time
        ("robust", 0.5, 0.1, (0.9 * _softplus(-1) - 0.1 * _softplus(1)) / 0.8),  # the flip divided out
        ("robust", 0.5, 0.0, _softplus(-1)),  # no flips: sigmoid
        ("hinge", 0.25, 0.0, 0.5),  # max(0, 1 - 0.25 x 2)
        ("hinge", 0.5, 0.0, 0.0),  # max(0, 1 - 1)
        ("ipo", 0.5, 0.0, (1 / 4 + 1 / 2 - 1) ** 2),  # (1/4 - (-1)/2 - 1/(2 x 0.5))^2
        ("ipo", 0.1, 0.0, (1 / 4 + 1 / 2 - 5) ** 2),  # 1/(2 x 0.1) = 5
    ],
)
def test_each_dpo_loss_type_is_its_formula(loss_type, beta, smoothing, expected):
    values = (torch.tensor([value]) for value in (-10.0, -12.0, -11.0, -11.0))
    lengths = (torch.tensor([4]), torch.tensor([2]))  # response tokens, which ipo averages over
    terms = dpo_loss(*values, beta, loss_type, smoothing, lengths)
    assert abs(terms.loss.item() - expected) < 1e-6 * max(1.0, expected)
    assert terms.chosen_rewards.item() == pytest.approx(beta) and terms.rejected_rewards.item() == pytest.approx(-beta)


def test_reference_free_dpo_counts_the_reference_as_zero():
    from nxd_align import DPOObjective

    logits, batch = _pair_batch()
    chosen, rejected = 2 * math.log(0.5), math.log(0.25) + math.log(0.5)
    loss, metrics = DPOObjective(beta=0.1, reference_free=True).loss(
        token_cross_entropy(logits, batch["labels"]), batch
    )
    assert loss.item() == pytest.approx(_softplus(-0.1 * (chosen - rejected)), abs=1e-6)
    assert metrics["rewards/chosen"].item() == pytest.approx(0.1 * chosen, abs=1e-6)


def test_the_ipo_objective_averages_each_response_over_its_tokens():
    from nxd_align import DPOObjective

    logits, batch = _pair_batch()  # two counted labels per response
    chosen, rejected = (2 * math.log(0.5) + 1.5) / 2, (math.log(0.25) + math.log(0.5) + 2.5) / 2
    loss, _ = DPOObjective(beta=0.5, loss_type="ipo").loss(token_cross_entropy(logits, batch["labels"]), batch)
    assert loss.item() == pytest.approx((chosen - rejected - 1) ** 2, abs=1e-6)


def test_an_unknown_dpo_loss_type_is_named():
    with pytest.raises(ValueError, match="loss_type: expected one of sigmoid, ipo, hinge, robust, found 'exo'"):
        dpo_loss(*(torch.zeros(1) for _ in range(4)), 0.1, "exo")


@pytest.mark.parametrize(
    "nll, chosen, rejected, beta, expected",
    [
        (2.0, math.log(0.5), math.log(0.25), 0.1, 2.0 + 0.1 * -math.log(0.75)),  # odds 1 and 1/3: log-odds ln 3
        (1.5, math.log(0.2), math.log(0.2), 0.5, 1.5 + 0.5 * math.log(2)),  # equal odds: -log sigmoid(0)
        (0.0, math.log(0.1), math.log(0.9), 1.0, math.log(1 + 81)),  # odds 1/9 and 9: log-odds -ln 81
    ],
)
def test_orpo_loss_is_the_published_formula(nll, chosen, rejected, beta, expected):
    terms = orpo_loss(torch.tensor([nll]), torch.tensor([chosen]), torch.tensor([rejected]), beta)
    assert terms.loss.item() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_orpo_odds_ratio_stays_finite_near_zero_log_probs(dtype):
    chosen = torch.tensor([-1e-8, -1e-30, 0.0, -3.0], dtype=dtype, requires_grad=True)
    rejected = torch.tensor([-2.0, -1e-8, -1e-8, -1e-8], dtype=dtype, requires_grad=True)
    terms = orpo_loss(torch.zeros(4), chosen, rejected, 0.1)
    terms.loss.sum().backward()
    assert (
        torch.isfinite(terms.loss).all() and torch.isfinite(chosen.grad).all() and torch.isfinite(rejected.grad).all()
    )
    naive = torch.log1p(-torch.exp(torch.tensor(-1e-8, dtype=dtype)))  # what the naive form gives
    assert naive.isinf()


def test_log1mexp_is_accurate_on_both_branches():
    x = torch.tensor([-1e-10, -0.1, -math.log(2), -5.0, -50.0], dtype=torch.float64)
    expected = torch.tensor(
        [
            math.log(1e-10) - 5e-11,
            math.log(1 - math.exp(-0.1)),
            math.log(0.5),
            math.log(1 - math.exp(-5.0)),
            -math.exp(-50.0),
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(log1mexp(x), expected, rtol=1e-12, atol=1e-30)


def test_sequence_log_probs_sum_the_counted_labels():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]]]))
    labels = torch.tensor([[0, -100, 2]])
    total, count = sequence_log_probs(token_cross_entropy(logits, labels), labels)
    assert total.item() == pytest.approx(math.log(0.5) + math.log(0.6)) and count.item() == 2


def _pair_batch() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Two pairs (the second padding) over a vocabulary of 4: logits are log-probabilities, so each
    counted label's log-prob is known. Chosen: labels 1, 2 with p 0.5, 0.5; rejected: 0.25, 0.5."""
    table = torch.tensor([[0.5, 0.25, 0.125, 0.125], [0.25, 0.5, 0.125, 0.125], [0.125, 0.125, 0.5, 0.25]])
    logits = table.log().expand(4, 3, 4).clone()
    labels = torch.tensor([[0, 1, -100], [1, 1, -100], [-100] * 3, [-100] * 3])  # chosen, rejected, padding pair
    return logits, {"labels": labels, "reference_log_probs": torch.tensor([-1.5, -2.5, 0.0, 0.0])}


def test_the_dpo_objective_sums_the_formula_over_real_pairs():
    from nxd_align import DPOObjective

    logits, batch = _pair_batch()
    chosen, rejected = 2 * math.log(0.5), math.log(0.25) + math.log(0.5)
    margin = 0.1 * ((chosen + 1.5) - (rejected + 2.5))
    objective = DPOObjective(beta=0.1)
    loss, metrics = objective.loss(token_cross_entropy(logits, batch["labels"]), batch)
    assert objective.count(batch).item() == 1
    assert loss.item() == pytest.approx(math.log1p(math.exp(-margin)), abs=1e-6)
    assert metrics["rewards/chosen"].item() == pytest.approx(0.1 * (chosen + 1.5), abs=1e-6)
    assert metrics["rewards/margins"].item() == pytest.approx(margin, abs=1e-6)
    assert metrics["logps/rejected"].item() == pytest.approx(rejected, abs=1e-6)
    assert metrics["rewards/accuracies"].item() == float(margin > 0)


def test_the_orpo_objective_uses_average_log_probs():
    from nxd_align import ORPOObjective

    logits, batch = _pair_batch()
    chosen, rejected = math.log(0.5), (math.log(0.25) + math.log(0.5)) / 2
    odds = (chosen - math.log(1 - math.exp(chosen))) - (rejected - math.log(1 - math.exp(rejected)))
    ratio = -math.log(1 / (1 + math.exp(-odds)))
    loss, metrics = ORPOObjective(beta=0.25).loss(token_cross_entropy(logits, batch["labels"]), batch)
    assert loss.item() == pytest.approx(-chosen + 0.25 * ratio, abs=1e-6)
    assert metrics["nll_loss"].item() == pytest.approx(-chosen, abs=1e-6)
    assert metrics["log_odds_ratio"].item() == pytest.approx(-ratio, abs=1e-6)
