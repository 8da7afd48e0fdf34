"""ORPO through nxd-train in one process: it learns the preference, logs what preference tools log,
validates, and names a bad record in one clear message."""

from __future__ import annotations

from nxd_train.cli import main

from tests.training_runs import losses, orpo_job

METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "nll_loss",
    "log_odds_ratio",
)


def test_orpo_learns_the_preference_and_logs_its_parts(tmp_path, train_here, chat_tokenizer_dir):
    rows = train_here(
        *orpo_job(tmp_path / "data", chat_tokenizer_dir),
        "trainer.max_steps=24",
        "model.optim.lr=3e-3",
        "trainer.val_check_interval=12",
        "trainer.limit_val_batches=2",
    )
    trained = [row for row in rows if "loss" in row]
    assert len(trained) == 24 and all(name in trained[0] for name in METRICS)
    assert losses(rows)[-1] < losses(rows)[0] - 0.5
    assert trained[-1]["rewards/margins"] > trained[0]["rewards/margins"]  # chosen pulls away from rejected
    for row in trained:  # the loss is the NLL plus beta x -log sigmoid(log odds), as logged
        assert abs(row["loss"] - (row["nll_loss"] - 0.2 * row["log_odds_ratio"])) < 1e-5
    assert [row["step"] for row in rows if "val_loss" in row] == [12.0, 24.0]
    log = (tmp_path / "run0" / "nxd_log_globalrank-0_localrank-0.txt").read_text()
    assert ", orpo, global batch 8" in log and "data.train_dir: 128 preference pairs" in log


def test_orpo_names_a_bad_record(tmp_path, capsys, chat_tokenizer_dir):
    job = orpo_job(tmp_path / "data", chat_tokenizer_dir)
    with open(tmp_path / "data" / "train.jsonl", "a") as handle:
        handle.write('{"prompt": "a", "chosen": "b"}\n')
    assert main(job) == 1
    err = capsys.readouterr().err
    assert (
        "Traceback" not in err
        and "train.jsonl line 129: expected prompt, chosen and rejected, found no rejected" in err
    )
