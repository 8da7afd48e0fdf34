"""exp_manager.log_gradient_zeros, log_optimizer_states and gradient_noise_scale (GPT-NeoX's log_grad_pct_zeros,
log_optimizer_states and log_gradient_noise_scale), logged under NeoX's names."""

from __future__ import annotations

import math

STATISTICS = [
    "+exp_manager.log_gradient_zeros=True",
    "+exp_manager.log_optimizer_states=True",
    "+exp_manager.gradient_noise_scale.enabled=True",
    "+exp_manager.gradient_noise_scale.n_batches=2",
]


def columns(row: dict[str, float], prefix: str) -> dict[str, float]:
    return {name[len(prefix) :]: value for name, value in row.items() if name.startswith(prefix)}


def test_each_statistic_is_logged_under_neox_names(train_here):
    rows = [
        row for row in train_here("trainer.max_steps=3", "trainer.gradient_clip_val=0", *STATISTICS) if "loss" in row
    ]
    first = rows[0]
    zeros, states = columns(first, "pct_grad_zeros/"), columns(first, "optimizer_state_norms/")
    parameters = sorted(zeros)
    assert len(parameters) == 2 * 9 + 3 and all(0.0 <= value <= 100.0 for value in zeros.values())
    assert zeros["model.embed_tokens.weight"] > 50  # rows of tokens absent from the batch get no gradient
    assert zeros["model.layers.0.mlp.down_proj.weight"] == 0.0
    assert sorted(states) == sorted(f"{name}_{state}" for name in parameters for state in ("exp_avg", "exp_avg_sq"))
    # after AdamW's first step exp_avg = (1 - beta1) g, so its norms add up to 0.1 x the gradient norm
    first_moments = math.sqrt(sum(states[f"{name}_exp_avg"] ** 2 for name in parameters))
    assert math.isclose(first_moments, 0.1 * first["grad_norm"], rel_tol=1e-6)
    # the noise scale needs n_batches steps
    assert "train/noise_scale" not in first and all(math.isfinite(row["train/noise_scale"]) for row in rows[1:])


def assert_same_statistics(expected: list[dict[str, float]], found: list[dict[str, float]]) -> dict[str, float]:
    """Two runs' statistics (rows of metrics.csv) agree: the same names at the same steps, percents to 1e-6, norms and
    the noise scale relatively; returns the worst difference of each kind."""
    worst = {"pct_grad_zeros/": 0.0, "optimizer_state_norms/": 0.0, "train/noise_scale": 0.0}
    for a, b in zip(expected, found, strict=True):
        names = sorted(name for name in a if name.startswith(tuple(worst)))
        assert names and names == sorted(name for name in b if name.startswith(tuple(worst)))
        for name in names:
            kind = next(prefix for prefix in worst if name.startswith(prefix))
            difference = abs(a[name] - b[name]) / (1.0 if kind == "pct_grad_zeros/" else max(abs(a[name]), 1e-12))
            worst[kind] = max(worst[kind], difference)
    assert worst["pct_grad_zeros/"] < 1e-6 and worst["optimizer_state_norms/"] < 1e-5, worst
    assert worst["train/noise_scale"] < 1e-3, worst
    return worst
