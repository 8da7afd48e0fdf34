"""DPO through nxd-train in one process: the reference table equals an independent forward of the
initial weights, step 1 is ln 2 (policy == reference), the preference is learnt; the table is kept
with every checkpoint and read back on resume (never recomputed from trained weights), a table made
for another run is recomputed (fresh run) or refused (resume); a live reference (the frozen copy, or
LoRA's adapters switched off) trains exactly as the precomputed one."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
import torch.nn.functional as F
from nxd_ckpt import MARKER, list_checkpoints, read_info
from nxd_ckpt.marker import write_marker
from nxd_config import load_config
from nxd_train.checks.preflight import plan_run
from nxd_train.cli import default_config_path, main
from nxd_train.run.corpus import default_cache_dir
from safetensors.torch import load_file, save_file
from transformers import LlamaForCausalLM

from tests.train.test_lora import _job, hf_base  # noqa: F401 - the fixture
from tests.training_runs import FAST, dpo_job, losses, orpo_job, read_metrics

TABLE = "reference_log_probs.safetensors"
SAVE = [
    "exp_manager.create_checkpoint_callback=True",
    "+exp_manager.checkpoint_callback_params.save_top_k=-1",
    "+exp_manager.checkpoint_callback_params.every_n_train_steps=3",
]
SHORT = ["trainer.max_steps=6", "model.optim.lr=3e-3", "trainer.val_check_interval=3", "trainer.limit_val_batches=2"]
COMPARED = ("loss", "val_loss", "grad_norm", "rewards/chosen", "rewards/margins", "logps/rejected")


def _log(log_dir) -> str:
    return (log_dir / "nxd_log_globalrank-0_localrank-0.txt").read_text()


def _same(a: list[dict], b: list[dict]) -> None:
    for key in COMPARED:
        assert [row[key] for row in a if key in row] == [row[key] for row in b if key in row], key


def _independent_log_probs(job: list[str], split: str) -> torch.Tensor:
    """Each pair's summed response log-probs under the seeded initial model, by a plain forward and
    log-softmax gather (not nxd's loss code)."""
    plan = plan_run(load_config(default_config_path(), [*FAST, *job]), default_cache_dir())
    model = plan.family.build(seed=plan.launch.seed).eval()
    dataset = plan.data.train if split == "train" else plan.data.validation
    rows = []
    with torch.no_grad():
        for index in range(len(dataset)):
            sample = dataset[index]
            log_probs = F.log_softmax(plan.family.logits(model, sample).double(), dim=-1)
            labels = sample["labels"]
            counted = labels != -100
            picked = log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            rows.append((picked * counted).sum(-1))
    return torch.stack(rows)


def test_dpo_learns_from_a_reference_table_equal_to_an_independent_forward(tmp_path, train_here, chat_tokenizer_dir):
    job = dpo_job(tmp_path / "data", chat_tokenizer_dir)
    rows = train_here(
        *job,
        "trainer.max_steps=24",
        "model.optim.lr=3e-3",
        "trainer.val_check_interval=12",
        "trainer.limit_val_batches=2",
    )
    trained = [row for row in rows if "loss" in row]
    assert abs(trained[0]["loss"] - math.log(2)) < 1e-6  # the policy is the reference at step 1
    assert trained[0]["rewards/chosen"] == trained[0]["rewards/margins"] == 0.0
    assert losses(rows)[-1] < losses(rows)[0] - 0.2 and trained[-1]["rewards/accuracies"] > 0.7
    assert [row["step"] for row in rows if "val_loss" in row] == [12.0, 24.0]
    table = load_file(tmp_path / "run0" / TABLE)
    for split in ("train", "validation"):
        expected = _independent_log_probs(job, split)
        assert table[split].shape == expected.shape and (table[split] - expected).abs().max() < 1e-4, split
    log = _log(tmp_path / "run0")
    assert "reference log-probs of 128 train samples, 16 validation samples computed in" in log and ", dpo, " in log


@pytest.mark.parametrize(
    ("settings", "first"),
    [
        (["loss_type=ipo"], 1.0),  # (0 - 1 / (2 x 0.5))^2
        (["loss_type=hinge"], 1.0),  # max(0, 1 - 0)
        (
            ["loss_type=robust", "+model_alignment_strategy.dpo.label_smoothing=0.1"],
            math.log(2),
        ),  # (0.9 - 0.1) ln 2 / 0.8
    ],
)
def test_each_dpo_loss_type_starts_at_its_formula_and_learns(tmp_path, train_here, chat_tokenizer_dir, settings, first):
    settings = [item if item.startswith("+") else f"+model_alignment_strategy.dpo.{item}" for item in settings]
    rows = train_here(
        *dpo_job(tmp_path / "data", chat_tokenizer_dir), *settings, "trainer.max_steps=12", "model.optim.lr=3e-3"
    )
    trained = [row for row in rows if "loss" in row]
    assert abs(trained[0]["loss"] - first) < 1e-6  # the policy is the reference at step 1: h = 0
    assert trained[-1]["rewards/margins"] > trained[0]["rewards/margins"] + 0.1


def test_reference_free_dpo_runs_no_reference(tmp_path, train_here, chat_tokenizer_dir):
    rows = train_here(
        *dpo_job(tmp_path / "data", chat_tokenizer_dir),
        "+model_alignment_strategy.dpo.reference_free=True",
        "trainer.max_steps=12",
        "model.optim.lr=3e-3",
    )
    trained = [row for row in rows if "loss" in row]
    assert trained[0]["rewards/chosen"] == pytest.approx(0.5 * trained[0]["logps/chosen"])  # beta (pi - 0)
    assert trained[-1]["rewards/margins"] > trained[0]["rewards/margins"] + 0.1
    assert not (tmp_path / "run0" / TABLE).exists() and "reference log-probs" not in _log(tmp_path / "run0")


def test_a_resumed_run_reads_the_checkpoint_table_and_continues_exactly(tmp_path, train_here, chat_tokenizer_dir):
    job = [*dpo_job(tmp_path / "data", chat_tokenizer_dir), *SHORT, *SAVE]
    whole = train_here(*job)
    step_3 = next(info.path for info in list_checkpoints(tmp_path / "run0" / "checkpoints") if info.step == 3)
    assert torch.equal(load_file(step_3 / TABLE)["train"], load_file(tmp_path / "run0" / TABLE)["train"])
    (tmp_path / "resumed" / "checkpoints").mkdir(parents=True)  # the run killed after step 3: its table is gone
    shutil.copytree(step_3, tmp_path / "resumed" / "checkpoints" / step_3.name)
    resumed = read_metrics_of(tmp_path / "resumed", *job, "exp_manager.resume_if_exists=True")
    _same([row for row in whole if row["step"] > 3], [row for row in resumed if row["step"] > 3])
    log = _log(tmp_path / "resumed")
    copied = tmp_path / "resumed" / "checkpoints" / step_3.name
    assert f"reference log-probs from {copied}/{TABLE}" in log and "computed in" not in log


def read_metrics_of(log_dir, *overrides: str) -> list[dict]:
    assert main([*FAST, *overrides, f"+exp_manager.explicit_log_dir={log_dir}"]) == 0
    return read_metrics(log_dir)


def test_a_table_of_another_run_is_recomputed_fresh_and_refused_on_resume(tmp_path, capsys, chat_tokenizer_dir):
    job = [*dpo_job(tmp_path / "data", chat_tokenizer_dir), *SHORT, *SAVE]
    log_dir = tmp_path / "run"
    read_metrics_of(log_dir, *job)
    again = read_metrics_of(tmp_path / "again", *job)
    shutil.copy(log_dir / TABLE, tmp_path / "again" / TABLE)  # a fresh run in a directory holding a table reuses it
    shutil.rmtree(tmp_path / "again" / "checkpoints")
    _same(
        again,
        read_metrics_of(
            tmp_path / "again",
            *job,
            "exp_manager.resume_if_exists=True",
            "+exp_manager.resume_ignore_no_checkpoint=True",
        ),
    )
    assert f"reference log-probs from {tmp_path / 'again'}/{TABLE}" in _log(tmp_path / "again")
    other = [*dpo_job(tmp_path / "other", chat_tokenizer_dir, records=96), *SHORT, *SAVE]
    read_metrics_of(log_dir, *other, "+exp_manager.require_empty_log_dir=False")  # another dataset there: recomputed
    assert "reference log-probs made for another model, data, tokenizer or precision" in _log(log_dir)
    step_3 = max(
        (info.path for info in list_checkpoints(log_dir / "checkpoints") if info.step == 3), key=lambda path: path.name
    )  # the second run's (-v1): resumed with its own data
    tables = load_file(step_3 / TABLE)
    save_file(tables, step_3 / TABLE, metadata={"digest": "0" * 64})
    capsys.readouterr()
    assert main([*FAST, *other, f"+exp_manager.resume_from_checkpoint={step_3}"]) == 1
    assert f"{step_3}/{TABLE} has xxh3_64:" in capsys.readouterr().err  # first, the checkpoint's own digests
    info = read_info(step_3)  # sealed again, as if saved with that table: now the table's own digest refuses it
    (step_3 / MARKER).unlink()
    write_marker(step_3, step=info.step, consumed_samples=info.consumed_samples, metrics=info.metrics, extra=info.extra)
    assert main([*FAST, *other, f"+exp_manager.resume_from_checkpoint={step_3}"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"{step_3}/{TABLE}: reference log-probs made for another model" in err
    (step_3 / TABLE).unlink()  # the completion marker lists the table: a checkpoint without it is damaged
    assert main([*FAST, *other, f"+exp_manager.resume_from_checkpoint={step_3}"]) == 1
    assert f"{step_3}/{TABLE} is missing (the completion marker lists it" in capsys.readouterr().err
    orpo = [*orpo_job(tmp_path / "other", chat_tokenizer_dir, records=96), *SHORT, *SAVE]
    read_metrics_of(tmp_path / "orpo", *orpo)  # a checkpoint saved without a table cannot continue as DPO
    orpo_step_3 = next(info.path for info in list_checkpoints(tmp_path / "orpo" / "checkpoints") if info.step == 3)
    assert main([*FAST, *other, f"+exp_manager.resume_from_checkpoint={orpo_step_3}"]) == 1
    assert (
        f"{orpo_step_3}: expected the reference log-probs saved with the checkpoint (they are never "
        "recomputed from trained weights), found no reference_log_probs table" in capsys.readouterr().err
    )


@pytest.mark.parametrize("lora", [False, True], ids=["frozen_copy", "lora_adapters_off"])
def test_a_live_reference_trains_exactly_as_the_precomputed_one(tmp_path, train_here, chat_tokenizer_dir, lora):
    adapters = ["+model_alignment_strategy.peft.lora_rank=4", "model.optim.lr=1e-2"] if lora else []
    precomputed = train_here(*dpo_job(tmp_path / "data", chat_tokenizer_dir), *SHORT, *adapters)
    live = train_here(*dpo_job(tmp_path / "data", chat_tokenizer_dir, precompute=False), *SHORT, *adapters)
    _same(precomputed, live)
    assert not (tmp_path / "run1" / TABLE).exists()


def test_a_hugging_face_model_with_lora_gets_the_reference_transformers_computes(tmp_path, hf_base):  # noqa: F811
    """The HF family, started from a model directory, LoRA on: the table is the base model's log-probs as
    transformers' own LlamaForCausalLM gives them (adapters off), and DPO trains the adapters."""
    data = tmp_path / "data"
    dpo = dpo_job(data, hf_base)[:3]  # the dpo keys; the data files replace tiny_sft's
    job = _job(
        hf_base,
        tmp_path / "run",
        "~model_alignment_strategy.sft",
        *dpo,
        f"data.train_dir={data / 'train.jsonl'}",
        f"data.val_dir={data / 'validation.jsonl'}",
        "+model_alignment_strategy.peft.lora_rank=4",
        "model.optim.lr=1e-2",
    )
    assert main(job) == 0
    rows = read_metrics(tmp_path / "run")
    # the policy starts as its reference (log 2 exactly) and then moves: at lr 1e-2 the last steps may overshoot
    assert abs(losses(rows)[0] - math.log(2)) < 1e-6 and min(losses(rows)[1:]) < losses(rows)[0] - 1e-3
    plan = plan_run(
        load_config(job[1], [item for item in job[2:] if not item.startswith("+exp_manager")]), default_cache_dir()
    )
    model = LlamaForCausalLM.from_pretrained(hf_base).eval()
    table = load_file(tmp_path / "run" / TABLE)["train"]
    with torch.no_grad():
        for index in range(0, len(plan.data.train), 9):
            sample = plan.data.train[index]
            log_probs = F.log_softmax(model(input_ids=sample["input_ids"]).logits.double(), dim=-1)
            labels = sample["labels"]
            picked = log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            assert torch.allclose(table[index], (picked * (labels != -100)).sum(-1), rtol=1e-6, atol=1e-5), index


def test_an_unknown_dpo_loss_type_is_one_message_naming_the_key(tmp_path, capsys, chat_tokenizer_dir):
    job = [*dpo_job(tmp_path / "data", chat_tokenizer_dir), "+model_alignment_strategy.dpo.loss_type=exo_pair"]
    assert main([*FAST, *job]) != 0
    err = capsys.readouterr().err
    assert (
        "model_alignment_strategy.dpo.loss_type: expected one of 'sigmoid', 'ipo', 'hinge' or 'robust', found "
        "'exo_pair'"
        in err
        and "Traceback" not in err
    )
