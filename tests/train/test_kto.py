"""KTO through nxd-train in one process: the reference table holds each example's and its KL
sequence's log-probs, equal to an independent forward; step 1 is 0.5 per example with a zero baseline
(policy == reference); the preference is learnt (desirable rewards rise over undesirable ones); the
table is kept with checkpoints and a resume continues exactly; a live reference trains as the table
does; bad records and one-sided data get one message."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from nxd_config import load_config
from nxd_train.checks.preflight import plan_run
from nxd_train.cli import default_config_path, main
from nxd_train.run.corpus import default_cache_dir
from safetensors.torch import load_file

from tests.training_runs import FAST, kto_job, kto_records, losses

TABLE = "reference_log_probs.safetensors"
METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "kl",
    "share/chosen",
    "share/rejected",
)
LEARN = ["trainer.max_steps=24", "model.optim.lr=3e-3", "trainer.val_check_interval=12", "trainer.limit_val_batches=2"]


def _independent_log_probs(job: list[str]) -> torch.Tensor:
    """Each training sample's two rows (example, KL sequence): summed completion log-probs under the
    seeded initial model, by a plain forward and log-softmax gather (not nxd's loss code)."""
    plan = plan_run(load_config(default_config_path(), [*FAST, *job]), default_cache_dir())
    model = plan.family.build(seed=plan.launch.seed).eval()
    rows = []
    with torch.no_grad():
        for index in range(len(plan.data.train)):
            sample = plan.data.train[index]
            log_probs = F.log_softmax(plan.family.logits(model, sample).double(), dim=-1)
            labels = sample["labels"]
            picked = log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            rows.append((picked * (labels != -100)).sum(-1))
    return torch.stack(rows)


def test_kto_learns_from_a_reference_table_equal_to_an_independent_forward(tmp_path, train_here, chat_tokenizer_dir):
    job = kto_job(tmp_path / "data", chat_tokenizer_dir)
    rows = train_here(*job, *LEARN)
    trained = [row for row in rows if "loss" in row]
    assert len(trained) == 24 and all(name in trained[0] for name in METRICS)
    assert trained[0]["loss"] == pytest.approx(0.5, abs=1e-6)  # 1 - sigmoid(0) for every example
    assert trained[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert trained[0]["share/chosen"] + trained[0]["share/rejected"] == pytest.approx(1.0)
    assert losses(rows)[-1] < losses(rows)[0] - 0.1
    assert trained[-1]["rewards/chosen"] > trained[-1]["rewards/rejected"] + 0.5
    assert trained[-1]["rewards/margins"] == pytest.approx(
        trained[-1]["rewards/chosen"] - trained[-1]["rewards/rejected"]
    )
    assert any("val_loss" in row for row in rows)
    table = load_file(tmp_path / "run0" / TABLE)["train"]
    expected = _independent_log_probs(job)
    assert table.shape == expected.shape == (128, 2)
    assert (table - expected).abs().max() < 1e-4 * expected.abs().max()


def test_a_resumed_kto_run_continues_exactly_and_a_live_reference_agrees(tmp_path, train_here, chat_tokenizer_dir):
    save = [
        "exp_manager.create_checkpoint_callback=True",
        "+exp_manager.checkpoint_callback_params.save_top_k=-1",
        "+exp_manager.checkpoint_callback_params.every_n_train_steps=3",
    ]
    job = [*kto_job(tmp_path / "data", chat_tokenizer_dir), "trainer.max_steps=6", "model.optim.lr=3e-3"]
    whole = train_here(*job, *save)
    checkpoint = next((tmp_path / "run0" / "checkpoints").glob("*step=3*"))
    assert (checkpoint / TABLE).exists()
    resumed = train_here(*job, *save, f"+exp_manager.resume_from_checkpoint={checkpoint}")
    keys = ("loss", "kl", "rewards/chosen", "grad_norm")
    for key in keys:
        assert [row[key] for row in whole if key in row][3:] == [row[key] for row in resumed if key in row], key
    live = train_here(
        *kto_job(tmp_path / "data", chat_tokenizer_dir, precompute=False), "trainer.max_steps=6", "model.optim.lr=3e-3"
    )
    for key in keys:
        expected, found = [row[key] for row in whole if key in row], [row[key] for row in live if key in row]
        assert found == pytest.approx(expected, rel=1e-6, abs=1e-9), key


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (
            {"prompt": "a b", "completion": "b a", "label": "yes"},
            "line 2: label: expected true (a desirable completion) or false (an undesirable one), found str 'yes'",
        ),
        (
            {"prompt": "a b", "completion": "b a"},
            "line 2: label: expected true (a desirable completion) or false (an undesirable one), found no label",
        ),
        (
            {"prompt": "a b", "chosen": "b a", "label": True},
            "line 2: expected prompt and completion, found no completion",
        ),
    ],
)
def test_a_bad_kto_record_is_one_message_naming_file_and_line(tmp_path, capsys, chat_tokenizer_dir, record, expected):
    job = kto_job(tmp_path / "data", chat_tokenizer_dir)
    train = tmp_path / "data" / "train.jsonl"
    lines = train.read_text().splitlines()
    train.write_text("\n".join([lines[0], json.dumps(record), *lines[2:]]) + "\n")
    assert main(["--config", str(default_config_path()), *FAST, *job]) == 1
    assert f"data.train_dir: {train} {expected}" in capsys.readouterr().err


def test_one_sided_kto_data_is_refused_with_the_counts(tmp_path, capsys, chat_tokenizer_dir):
    job = kto_job(tmp_path / "data", chat_tokenizer_dir)
    train = tmp_path / "data" / "train.jsonl"
    train.write_text("".join(json.dumps(r | {"label": True}) + "\n" for r in kto_records(40)))
    assert main(["--config", str(default_config_path()), *FAST, *job]) == 1
    assert (
        "expected desirable (label true) and undesirable (label false) completions, found 40 desirable and 0 "
        "undesirable"
    ) in capsys.readouterr().err
