"""Supervised fine-tuning through nxd-train in one process: training and validation on responses,
exact resume mid-epoch, fine-tuning a Hugging Face directory exported from a pretraining run (the
README's example), and one clear message for each kind of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from nxd_train.cli import main

from tests.training_runs import losses, read_metrics, saved_state, sft_job

ROOT = Path(__file__).resolve().parents[2]
SAVE = ["exp_manager.create_checkpoint_callback=True", "+exp_manager.checkpoint_callback_params.save_top_k=-1"]


def checkpoints(log_dir: Path) -> dict[int, Path]:
    from nxd_ckpt import list_checkpoints

    return {info.step: info.path for info in list_checkpoints(log_dir / "checkpoints")}


def test_sft_trains_on_responses_and_validates(tmp_path, train_here, chat_tokenizer_dir):
    rows = train_here(
        *sft_job(tmp_path / "data", chat_tokenizer_dir),
        "trainer.max_steps=12",
        "trainer.val_check_interval=6",
        "trainer.limit_val_batches=2",
        "model.optim.lr=3e-3",
    )
    trained = losses(rows)
    assert len(trained) == 12 and trained[-1] < trained[0] - 0.5
    assert [row["step"] for row in rows if "val_loss" in row] == [6.0, 12.0]
    log = (tmp_path / "run0" / "nxd_log_globalrank-0_localrank-0.txt").read_text()
    assert ", sft, global batch 8" in log
    assert "data.train_dir: 256 records (" in log and "rows of 64 tokens" in log and "filled" in log


def test_sft_resumes_mid_epoch_exactly(tmp_path, train_here, chat_tokenizer_dir):
    job = [
        *sft_job(tmp_path / "data", chat_tokenizer_dir),
        "trainer.max_steps=6",
        *SAVE,
        "+exp_manager.checkpoint_callback_params.every_n_train_steps=3",
    ]
    whole = train_here(*job)
    step_3 = checkpoints(tmp_path / "run0")[3]
    assert saved_state(step_3, "sampler")["sampler"]["consumed_samples"] == 24  # mid-epoch: 100+ rows
    resumed = train_here(*job, f"+exp_manager.resume_from_checkpoint={step_3}")
    assert [row["loss"] for row in resumed if "loss" in row] == [row["loss"] for row in whole if "loss" in row][3:]


def test_fine_tune_a_model_you_have(tmp_path, train_here, monkeypatch, capsys):
    """The README's example: pretrain the default job, export it (weights, config.json, tokenizer), then
    fine-tune the export with configs/tiny_sft.yaml; the export's weights are where fine-tuning starts."""
    train_here("trainer.max_steps=40", *SAVE)
    monkeypatch.chdir(tmp_path)
    assert main(["ckpt", "export-hf", str(tmp_path / "run0"), "tiny_hf"]) == 0
    assert "tokenizer.json" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "tiny_hf").iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    runs = {}
    for name, start in (
        ("fine-tuned", []),
        ("from-scratch", ["~exp_manager.resume_from_checkpoint", "model.weight_init_only=False"]),
    ):
        assert (
            main(
                [
                    "-c",
                    str(ROOT / "configs" / "tiny_sft.yaml"),
                    "trainer.max_epochs=1",
                    "trainer.log_every_n_steps=1",
                    f"data.train_dir={ROOT / 'configs/data/sft_train.jsonl'}",
                    f"data.val_dir={ROOT / 'configs/data/sft_validation.jsonl'}",
                    f"+exp_manager.explicit_log_dir={tmp_path / name}",
                    *start,
                ]
            )
            == 0
        )
        runs[name] = losses(read_metrics(tmp_path / name))
    assert runs["fine-tuned"][0] < runs["from-scratch"][0] - 0.5  # the pretrained weights were loaded
    # the same start from the nxd checkpoint itself, with the Megatron-style model it was trained as
    nxd_start = train_here(
        "trainer.max_steps=3",
        "+model_alignment_strategy.sft.packing=True",
        f"+data.train_dir={ROOT / 'configs/data/sft_train.jsonl'}",
        f"+data.tokenizer.type={tmp_path / 'tiny_hf'}",
        "+model.weight_init_only=True",
        f"+exp_manager.resume_from_checkpoint={checkpoints(tmp_path / 'run0')[40]}",
    )
    # the same weights and the same first batch: transformers' Llama and nxd's compute the same loss
    assert abs(losses(nxd_start)[0] - runs["fine-tuned"][0]) < 1e-5


def _train_error(capsys, *overrides: str) -> str:
    assert main(list(overrides)) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_a_bad_record_is_one_message_naming_file_and_line(tmp_path, capsys, chat_tokenizer_dir):
    job = sft_job(tmp_path / "data", chat_tokenizer_dir)
    with open(tmp_path / "data" / "train.jsonl", "a") as handle:
        handle.write(json.dumps({"input": "pack my box", "response": "with jugs"}) + "\n")
    before = (tmp_path / "data" / "train.jsonl").read_bytes()
    err = _train_error(capsys, *job, f"+exp_manager.explicit_log_dir={tmp_path / 'run'}")
    assert err.strip().endswith(
        f"data.train_dir: {tmp_path / 'data' / 'train.jsonl'} line 257: expected input and "
        "output strings (or messages), found keys input, response"
    )
    assert (tmp_path / "data" / "train.jsonl").read_bytes() == before and not (tmp_path / "run").exists()


def test_pretraining_flags_are_refused_in_fine_tuning(tmp_path, capsys, chat_tokenizer_dir):
    job = sft_job(tmp_path / "data", chat_tokenizer_dir)
    err = _train_error(capsys, *job, "+data.reset_attention_mask=True", "+data.data_prefix=corpus_text_document")
    assert "data.reset_attention_mask: applies to pretraining samples; fine-tuning records carry their own" in err
    assert "data.data_prefix: applies to pretraining data (Megatron indexed datasets); fine-tuning reads" in err
    no_tokenizer = [override for override in job if not override.startswith("+data.tokenizer")]
    err = _train_error(capsys, *no_tokenizer)
    assert "data.tokenizer: expected the tokenizer of the model being fine-tuned" in err


def test_example_configs_point_at_the_shipped_data(capsys):
    config = yaml.safe_load((ROOT / "configs" / "tiny_sft.yaml").read_text())
    for key in ("train_dir", "val_dir"):
        assert (ROOT / config["data"][key]).is_file()
    assert main(["config", "check", str(ROOT / "configs" / "tiny_sft.yaml")]) == 1
    problems = capsys.readouterr().err.split("would stop a run on this machine:\n")[1].splitlines()
    assert problems and all("tiny_hf" in line for line in problems)  # only the model the README exports first
