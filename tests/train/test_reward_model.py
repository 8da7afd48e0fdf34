"""Reward models through nxd-train in one process: a score head learns separable pairs (accuracy above
0.7); `ckpt export-hf` writes a transformers sequence classifier whose scores equal nxd's (1e-5); a
Hugging Face causal LM starts a reward model (all but its LM head), and the two never mix the other
way: a reward model's weights refused as a causal LM's start, a causal LM's checkpoint refused as a
reward model to continue."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from nxd_ckpt import MODEL_KEY, list_checkpoints
from nxd_config import load_config
from nxd_train.checks.preflight import plan_run
from nxd_train.cli import default_config_path, main
from nxd_train.run.corpus import default_cache_dir
from transformers import AutoModelForSequenceClassification

from tests.train.test_lora import ROOT, hf_base  # noqa: F401 - the fixture
from tests.training_runs import FAST, read_metrics, reward_job, saved_state, sft_job

SAVE = [
    "exp_manager.create_checkpoint_callback=True",
    "+exp_manager.checkpoint_callback_params.save_top_k=-1",
    "+exp_manager.checkpoint_callback_params.every_n_train_steps=10",
]


def _nxd_scores(job: list[str], checkpoint, split: str) -> tuple[torch.Tensor, list[dict]]:
    """Each row's score under the checkpoint's weights through nxd's own model, and the samples."""
    plan = plan_run(load_config(default_config_path(), [*FAST, *job]), default_cache_dir())
    model = plan.family.build(seed=plan.launch.seed).eval()
    model.load_state_dict(saved_state(checkpoint, MODEL_KEY)[MODEL_KEY])
    dataset = plan.data.validation if split == "validation" else plan.data.train
    samples = [dataset[index] for index in range(len(dataset))]
    scores = []
    with torch.no_grad():
        for sample in samples:
            token_scores = plan.family.token_losses(model, sample)
            scores.append(token_scores.gather(-1, sample["score_position"].unsqueeze(-1)).squeeze(-1))
    return torch.stack(scores), samples


def test_a_reward_model_learns_and_exports_a_classifier_that_scores_as_nxd(tmp_path, train_here, chat_tokenizer_dir):
    job = reward_job(tmp_path / "data", chat_tokenizer_dir, z_loss=0.01)
    rows = train_here(
        *job,
        *SAVE,
        "trainer.max_steps=30",
        "model.optim.lr=3e-3",
        "trainer.val_check_interval=15",
        "trainer.limit_val_batches=2",
    )
    trained = [row for row in rows if "loss" in row]
    assert all(name in trained[0] for name in ("accuracy", "margin", "rewards/chosen", "rewards/rejected"))
    assert sum(row["accuracy"] for row in trained[-5:]) / 5 > 0.7
    assert trained[-1]["loss"] < trained[0]["loss"] - 0.2
    checkpoint = max(list_checkpoints(tmp_path / "run0" / "checkpoints"), key=lambda info: info.step).path
    assert main(["ckpt", "export-hf", str(checkpoint), str(tmp_path / "hf")]) == 0
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert classifier.config.num_labels == 1 and classifier.config.pad_token_id is not None
    expected, samples = _nxd_scores(job, checkpoint, "validation")
    with torch.no_grad():
        found = torch.stack([classifier(input_ids=sample["input_ids"]).logits.squeeze(-1) for sample in samples])
    assert found.shape == expected.shape == (16, 2)
    assert (found - expected).abs().max() < 1e-5, (found - expected).abs().max()


def _reward_config(base, tmp_path) -> str:
    """configs/tiny_sft.yaml on `base`, training a reward model on pairs instead of SFT."""
    config = yaml.safe_load((ROOT / "configs" / "tiny_sft.yaml").read_text())
    config["model_alignment_strategy"] = {"reward_model": {"max_prompt_length": 32}}
    path = tmp_path / "reward.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_a_causal_lm_starts_a_reward_model_and_a_reward_model_never_starts_a_causal_lm(tmp_path, capsys, hf_base):  # noqa: F811
    pairs = [item.lstrip("+") for item in reward_job(tmp_path / "data", hf_base)[2:4]]  # train_dir, val_dir
    common = [
        *FAST,
        "trainer.max_steps=2",
        "precision.type=fp32",
        f"data.tokenizer.type={hf_base}",
        f"model.model_config={hf_base}",
        "+exp_manager.checkpoint_callback_params.every_n_train_steps=2",
    ]
    start = [f"exp_manager.resume_from_checkpoint={hf_base}"]
    assert (
        main(
            [
                "-c",
                _reward_config(hf_base, tmp_path),
                *common,
                *start,
                *pairs,
                f"+exp_manager.explicit_log_dir={tmp_path / 'rm'}",
            ]
        )
        == 0
    )
    assert f"initial weights from {hf_base}" in (tmp_path / "rm" / "nxd_log_globalrank-0_localrank-0.txt").read_text()
    first = read_metrics(tmp_path / "rm")[0]
    assert 0.0 <= first["accuracy"] <= 1.0 and math.isfinite(first["loss"])  # the score head was drawn
    reward_checkpoint = list_checkpoints(tmp_path / "rm" / "checkpoints")[-1].path
    capsys.readouterr()
    sft = [item.lstrip("+") for item in sft_job(tmp_path / "sft_data", hf_base)[1:3]]
    assert (
        main(
            [
                "-c",
                str(ROOT / "configs" / "tiny_sft.yaml"),
                *common,
                *sft,
                f"exp_manager.resume_from_checkpoint={reward_checkpoint}",
                f"+exp_manager.explicit_log_dir={tmp_path / 'sft'}",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert (
        f"{reward_checkpoint}: holds a reward model (its output layer is a score head); expected a causal LM's" in err
    )
    assert "Traceback" not in err
    assert (
        main(
            [
                "-c",
                str(ROOT / "configs" / "tiny_sft.yaml"),
                *common,
                *sft,
                f"+exp_manager.explicit_log_dir={tmp_path / 'lm'}",
                f"exp_manager.resume_from_checkpoint={hf_base}",
            ]
        )
        == 0
    )
    lm_checkpoint = list_checkpoints(tmp_path / "lm" / "checkpoints")[-1].path
    capsys.readouterr()
    assert (
        main(
            [
                "-c",
                _reward_config(hf_base, tmp_path),
                *common,
                *pairs,
                "model.weight_init_only=False",
                f"exp_manager.resume_from_checkpoint={lm_checkpoint}",
            ]
        )
        == 1
    )
    assert f"{lm_checkpoint}: holds a causal LM, which a reward model cannot continue" in capsys.readouterr().err


@pytest.mark.parametrize("margin", ["wide", float("nan")])
def test_a_bad_margin_is_one_message_naming_file_and_line(tmp_path, capsys, chat_tokenizer_dir, margin):
    import json

    job = reward_job(tmp_path / "data", chat_tokenizer_dir)
    train = tmp_path / "data" / "train.jsonl"
    lines = train.read_text().splitlines()
    record = json.loads(lines[1]) | {"margin": margin}
    train.write_text("\n".join([lines[0], json.dumps(record), *lines[2:]]) + "\n")
    assert main([*FAST, *job]) == 1
    assert f"data.train_dir: {train} line 2: margin: expected a finite number" in capsys.readouterr().err
