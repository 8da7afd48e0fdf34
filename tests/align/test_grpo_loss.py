"""GRPO's loss and gradients against TRL's GRPOTrainer computing its loss on the same prompts, completions,
advantages and old and reference log-probs (fed to both; nothing is generated), fp32, on one tiny Llama."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F
from nxd_align import IGNORE_INDEX
from nxd_align.grpo import ADVANTAGE_KEY, OLD_KEY, REFERENCE_TOKENS_KEY, GRPOObjective, kl_estimate

pytest.importorskip("trl")

PROMPT, COMPLETION, ROWS, VOCAB, MAX_NEW = 3, 5, 4, 67, 6
MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]])
ADVANTAGES = torch.tensor([1.0, -0.5, 0.3, -0.8])


@pytest.fixture(scope="module")
def trl_trainer(tmp_path_factory):
    """TRL's trainer over a tiny saved Llama, with a word-level tokenizer built here (no download)."""
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    vocabulary = {f"t{i}": i for i in range(64)} | {"<pad>": 64, "<eos>": 65, "<unk>": 66}
    words = Tokenizer(models.WordLevel(vocab=vocabulary, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        pad_token_id=64,
        eos_token_id=65,
        bos_token_id=None,
    )
    folder = tmp_path_factory.mktemp("tiny_llama")
    LlamaForCausalLM(config).save_pretrained(folder)
    args = GRPOConfig(
        output_dir=str(folder / "out"),
        per_device_train_batch_size=ROWS,
        num_generations=ROWS,
        max_completion_length=MAX_NEW,
        bf16=False,
        use_cpu=True,
        report_to="none",
        gradient_checkpointing=False,
    )
    trainer = GRPOTrainer(
        model=str(folder),
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["t1 t2 t3"] * 8}),
        processing_class=tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1  # set by transformers' loop, which this test does not run
    return trainer, LlamaForCausalLM.from_pretrained(folder).float()


def _token_losses(model, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The per-token cross-entropy nxd's objectives receive (position t predicts label t; 0 where ignored)."""
    logits = model(input_ids=ids).logits.float()
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape)


def _case(trl_trainer, loss_type: str, level: str, beta: float, iterations: int):
    trainer, plain = trl_trainer
    generator = torch.Generator().manual_seed(hash((loss_type, level, beta, iterations)) % 2**31)
    prompts = torch.randint(0, 64, (ROWS, PROMPT), generator=generator)
    completions = torch.randint(0, 64, (ROWS, COMPLETION), generator=generator)
    ids = torch.cat([prompts, completions], dim=1)
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, PROMPT - 1 : -1] = torch.where(MASK.bool(), completions, IGNORE_INDEX)
    with torch.no_grad():
        current = -_token_losses(plain, ids, labels)[:, PROMPT - 1 : -1] * MASK
    # the sampling policy a step or two behind, and a reference further off: each token's log-prob moved
    old = current + 0.3 * torch.randn(current.shape, generator=generator) * MASK
    reference = current + 0.2 * torch.randn(current.shape, generator=generator) * MASK
    inputs = {
        "prompt_ids": prompts,
        "prompt_mask": torch.ones_like(prompts),
        "completion_ids": completions,
        "completion_mask": MASK,
        "advantages": ADVANTAGES,
        "num_items_in_batch": MASK.sum().float(),
    }
    if iterations > 1:
        inputs["old_per_token_logps"] = old
    if beta:
        inputs["ref_per_token_logps"] = reference
    trainer.loss_type, trainer.importance_sampling_level, trainer.beta = loss_type, level, beta
    trainer.model.zero_grad(set_to_none=True)
    trainer.model.train()
    trainer._metrics["train"].clear()
    theirs = trainer._compute_loss(trainer.model, inputs)
    theirs.backward()
    their_grads = {name: p.grad.clone() for name, p in trainer.model.named_parameters()}
    their_metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}

    ours_model = copy.deepcopy(plain)
    objective = GRPOObjective(MAX_NEW, loss_type=loss_type, importance_sampling=level, beta=beta)
    placed = torch.zeros(ids.shape, dtype=torch.float32)
    batch = {"labels": labels, ADVANTAGE_KEY: ADVANTAGES}
    if iterations > 1:
        batch[OLD_KEY] = placed.clone()
        batch[OLD_KEY][:, PROMPT - 1 : -1] = old
    if beta:
        batch[REFERENCE_TOKENS_KEY] = placed.clone()
        batch[REFERENCE_TOKENS_KEY][:, PROMPT - 1 : -1] = reference
    total, metrics = objective.loss(_token_losses(ours_model, ids, labels), batch)
    count = objective.count(batch)
    ours = total / count
    ours.backward()
    values = objective.report({name: (value / count).item() for name, value in metrics.items()})
    return theirs, their_grads, their_metrics, ours, dict(ours_model.named_parameters()), values


CASES = list(itertools.product(("grpo", "bnpo", "dr_grpo", "dapo"), ("token", "sequence"), (0.0, 0.04), (1, 2)))
DEFAULT = [
    ("grpo", "sequence", 0.04, 2),
    ("bnpo", "token", 0.0, 1),
    ("dr_grpo", "token", 0.04, 1),
    ("dapo", "sequence", 0.0, 2),
]


@pytest.mark.parametrize(
    "loss_type,level,beta,iterations",
    [pytest.param(*case, marks=() if case in DEFAULT else pytest.mark.slow) for case in CASES],
)
def test_loss_and_gradients_equal_trl(trl_trainer, loss_type, level, beta, iterations):
    theirs, their_grads, their_metrics, ours, our_parameters, values = _case(
        trl_trainer, loss_type, level, beta, iterations
    )
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-5, rel=1e-5)
    for name, grad in their_grads.items():
        torch.testing.assert_close(our_parameters[name].grad, grad, atol=1e-5, rtol=1e-4, msg=name)
    for name in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", *(("kl",) if beta else ())):
        assert values[name] == pytest.approx(their_metrics[name], abs=1e-6), name


def test_kl_estimators_by_hand():
    """k3 = e^(r - p) - (r - p) - 1, k1 = p - r, abs = |p - r|, mse = (p - r)^2 / 2, at p = -1, r = -1.5."""
    p, r = torch.tensor([-1.0]), torch.tensor([-1.5])
    assert kl_estimate(p, r, "k3").item() == pytest.approx(2.718281828**-0.5 + 0.5 - 1)
    assert kl_estimate(p, r, "k1").item() == pytest.approx(0.5)
    assert kl_estimate(p, r, "abs").item() == pytest.approx(0.5)
    assert kl_estimate(p, r, "mse").item() == pytest.approx(0.125)
