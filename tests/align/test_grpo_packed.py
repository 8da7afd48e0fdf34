"""A rollout batch packed as documents of rows (nxd-data's `completion_rows`) gives GRPO the loss, gradients and
logged values of the same completions one a row: the reference is the unpacked batch (whose loss TRL's own
computation pins in test_grpo_loss.py), through one tiny Megatron-style Llama, fp64 objective over fp32 losses."""

from __future__ import annotations

import copy

import pytest
import torch
from nxd_align import IGNORE_INDEX
from nxd_align.grpo import ADVANTAGE_KEY, OLD_KEY, REFERENCE_TOKENS_KEY, GRPOObjective
from nxd_data import completion_rows
from nxd_models import AttentionKernel, GPTConfig, build_causal_lm
from nxd_models.causal_lm_losses import causal_lm_token_losses

PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11, 12]]
COMPLETIONS = [[20, 21, 22, 23, 24], [25, 26], [27], [28, 29, 30, 31]]
ADVANTAGES = torch.tensor([0.9, -0.6, 0.4, -1.1])


def _model(kernel: AttentionKernel) -> torch.nn.Module:
    config = GPTConfig(
        vocab_size=64,
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_kv_heads=2,
        seq_length=16,
        ffn_hidden_size=48,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    torch.manual_seed(3)
    return build_causal_lm(config, attention=kernel)


def _rows(packed: bool) -> dict[str, torch.Tensor]:
    sequences = [prompt + completion for prompt, completion in zip(PROMPTS, COMPLETIONS, strict=True)]
    labels = [
        [IGNORE_INDEX] * (len(prompt) - 1) + completion + [IGNORE_INDEX]
        for prompt, completion in zip(PROMPTS, COMPLETIONS, strict=True)
    ]
    rows = completion_rows(sequences, labels, width=16 if packed else 8, pad_id=0, packed=packed)
    generator = torch.Generator().manual_seed(11)
    trained = rows["labels"] != IGNORE_INDEX
    # old and reference log-probs near the model's own (log 1/64), the same per token in both layouts
    noise = {key: torch.randn(64, generator=generator) for key in (OLD_KEY, REFERENCE_TOKENS_KEY)}
    for key, values in noise.items():
        rows[key] = torch.where(trained, -4.16 + 0.3 * values[rows["input_ids"].roll(-1, dims=1)], 0.0)
    return rows | {ADVANTAGE_KEY: ADVANTAGES}


def _run(model: torch.nn.Module, objective: GRPOObjective, packed: bool):
    model = copy.deepcopy(model)
    batch = _rows(packed)
    total, metrics = objective.loss(causal_lm_token_losses(model, batch), batch)
    count = objective.count(batch)
    (total / count).backward()
    values = objective.report({name: (value / count).item() for name, value in metrics.items()})
    return (total / count).item(), {name: p.grad for name, p in model.named_parameters()}, values


@pytest.mark.parametrize(
    "loss_type,level,beta",
    [("grpo", "sequence", 0.04), ("dapo", "token", 0.0), ("dr_grpo", "token", 0.04), ("bnpo", "sequence", 0.0)],
)
@pytest.mark.parametrize("kernel", [AttentionKernel.FLASH, AttentionKernel.UNFUSED])
def test_packed_completions_give_the_loss_and_gradients_of_rows(kernel, loss_type, level, beta):
    model = _model(kernel)
    objective = GRPOObjective(6, loss_type=loss_type, importance_sampling=level, beta=beta)
    packed = _rows(True)
    assert len(packed["input_ids"]) < len(PROMPTS) and "document_ids" in packed  # the comparison packs
    loss, grads, values = _run(model, objective, packed=True)
    their_loss, their_grads, their_values = _run(model, objective, packed=False)
    assert loss == pytest.approx(their_loss, abs=1e-6)
    for name, grad in their_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    assert values == pytest.approx(their_values, abs=1e-6)
