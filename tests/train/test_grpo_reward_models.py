"""Reward models as GRPO's rewards: a Hugging Face sequence classifier scores as its own forward does, an nxd
reward-model run scores a GRPO run's completions, and a reward model of another tokenizer is refused by key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from nxd_config import load_config
from nxd_train.checks.preflight import PreflightError, plan_run
from nxd_train.run.corpus import default_cache_dir
from nxd_train.run.loop import train
from nxd_train.run.reward_models import RewardModel, RewardModelSource

from tests.training_runs import FAST, preference_records, read_metrics, reward_job

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "grpo_tiny.yaml"
GRPO = "model_alignment_strategy.grpo"


@pytest.fixture(scope="module")
def hf_reward_model(tmp_path_factory, chat_tokenizer_dir) -> Path:
    """A tiny LlamaForSequenceClassification (one label) with the chat tokenizer's files beside it."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=320,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=0,
    )
    folder = tmp_path_factory.mktemp("reward_model")
    LlamaForSequenceClassification(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((chat_tokenizer_dir / name).read_bytes())
    return folder


def test_a_hugging_face_reward_model_scores_as_its_own_forward(hf_reward_model, tmp_path):
    from transformers import AutoModelForSequenceClassification

    sequences = [[1, 40, 41, 42, 0], [1, 50, 0], [1, 60, 61, 62, 63, 64, 65, 0]]
    ours = RewardModel(RewardModelSource(str(hf_reward_model), False), torch.device("cpu"), tmp_path).scores(sequences)
    theirs = AutoModelForSequenceClassification.from_pretrained(hf_reward_model).eval()
    with torch.no_grad():  # one sequence at a time: no padding, the score at its last token
        alone = [theirs(input_ids=torch.tensor([sequence])).logits[0, 0].item() for sequence in sequences]
    assert ours == pytest.approx(alone, abs=1e-5)


def _prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": record["prompt"]}) + "\n" for record in preference_records(32)))
    return path


def _grpo(tmp_path: Path, tokenizer: Path, reward_model: Path, *overrides: str) -> list[str]:
    return [
        *FAST,
        "trainer.max_steps=2",
        "data.global_batch_size=4",
        "model.encoder_seq_length=64",
        f"data.train_dir={_prompts(tmp_path)}",
        f"data.tokenizer.type={tokenizer}",
        f"{GRPO}.num_generations=4",
        f"{GRPO}.max_new_tokens=8",
        f"{GRPO}.rewards=[{{model: '{reward_model}', name: judge}}]",
        f"+exp_manager.explicit_log_dir={tmp_path / 'grpo'}",
        *overrides,
    ]


def test_a_reward_model_of_another_tokenizer_or_not_a_classifier_is_refused(
    tmp_path, hf_reward_model, chat_tokenizer_dir
):
    from transformers import AutoConfig, LlamaForCausalLM

    addition = ROOT / "configs" / "data" / "addition_tokenizer.json"
    with pytest.raises(PreflightError, match=rf"{GRPO}.rewards\[0\].model: .*tokenizer is not the policy's"):
        plan_run(load_config(EXAMPLE, _grpo(tmp_path, addition, hf_reward_model)), default_cache_dir())
    causal = tmp_path / "causal_lm"
    LlamaForCausalLM(AutoConfig.from_pretrained(hf_reward_model)).save_pretrained(causal)
    with pytest.raises(PreflightError, match=rf"{GRPO}.rewards\[0\].model: .*expected a \*ForSequenceClassification"):
        plan_run(load_config(EXAMPLE, _grpo(tmp_path, chat_tokenizer_dir, causal)), default_cache_dir())


def test_an_nxd_reward_model_run_scores_the_completions(tmp_path, train_here, chat_tokenizer_dir):
    train_here(
        *reward_job(tmp_path / "pairs", chat_tokenizer_dir, records=32),
        "trainer.max_steps=4",
        "exp_manager.create_checkpoint_callback=True",
    )
    reward_run = next(tmp_path.glob("run*"))
    rows = read_metrics(
        train(plan_run(load_config(EXAMPLE, _grpo(tmp_path, chat_tokenizer_dir, reward_run)), default_cache_dir()))
    )
    scored = [row for row in rows if "rewards/judge/mean" in row]
    assert len(scored) == 2 and all(abs(row["rewards/judge/mean"]) < 1e3 for row in scored)
    assert all(row["reward"] == pytest.approx(row["rewards/judge/mean"]) for row in scored)
    assert not list(reward_run.parent.glob("**/.reward-model-*"))  # the export it loaded from is gone
