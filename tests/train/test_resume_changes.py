"""Settings changed between a run and its resume: the hyperparameters a user changes on purpose apply
from the first resumed step with one notice (they were once dropped silently: torch's optimizer and
scheduler state bring back the saved ones); what shapes the saved state or the data position (the
architecture with its heads, the sequence length, the tokenizer, the data, the precision type, the
optimizer) is refused naming each key, old and new. A fuzz draws single-key changes at random."""

from __future__ import annotations

import json
import random
import shutil
import warnings
from pathlib import Path

import datasets
import pytest
from nxd_ckpt import list_checkpoints
from nxd_config import ConfigNotice, load_config
from nxd_train.checks.preflight import PreflightError, plan_run
from nxd_train.cli import default_config_path, main
from nxd_train.run.corpus import default_cache_dir

from tests.training_runs import FAST, losses, saved_state, train_in_process

JOB = [
    "trainer.max_steps=4",
    "exp_manager.create_checkpoint_callback=True",
    "+exp_manager.checkpoint_callback_params.every_n_train_steps=1",
    "+exp_manager.checkpoint_callback_params.save_top_k=-1",
    "model.optim.sched.warmup_steps=2",
]
RESUMED_AT = 2


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> Path:
    """A 4-step run saving every step; resumes start from its step-2 checkpoint."""
    log_dir = tmp_path_factory.mktemp("first") / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train_in_process(log_dir, *JOB)
    return log_dir


def _checkpoint(log_dir: Path, step: int) -> Path:
    return next(info.path for info in list_checkpoints(log_dir / "checkpoints") if info.step == step)


def _resume(first_run: Path, log_dir: Path, *changes: str) -> list[dict[str, float]]:
    return train_in_process(
        log_dir, *JOB, *changes, f"+exp_manager.resume_from_checkpoint={_checkpoint(first_run, RESUMED_AT)}"
    )


def _refusal(first_run: Path, *changes: str, source: Path | None = None) -> str:
    cfg = load_config(
        source or default_config_path(),
        [*FAST, *JOB, *changes, f"+exp_manager.resume_from_checkpoint={_checkpoint(first_run, RESUMED_AT)}"],
    )
    with pytest.raises(PreflightError) as caught:
        plan_run(cfg, default_cache_dir())
    return str(caught.value)


APPLIED = [
    "model.optim.lr=1e-3",
    "model.optim.weight_decay=0.2",
    "model.optim.betas=[0.8,0.9]",
    "+model.optim.eps=1e-6",
    "model.optim.sched.warmup_steps=1",
    "model.optim.sched.min_lr=1e-5",
    "trainer.gradient_clip_val=0.01",
]


def test_changed_hyperparameters_apply_from_the_first_resumed_step(first_run, tmp_path):
    with pytest.warns(ConfigNotice) as record:
        changed = _resume(first_run, tmp_path / "changed", *APPLIED)
    (notice,) = [str(w.message) for w in record if "with changed settings" in str(w.message)]
    for change in (
        "model.optim.lr 0.003 -> 0.001",
        "model.optim.weight_decay 0.01 -> 0.2",
        "model.optim.betas [0.9, 0.95] -> [0.8, 0.9]",
        "model.optim.eps 1e-08 -> 1e-06",
        "model.optim.sched.warmup_steps 2 -> 1",
        "model.optim.sched.min_lr 0.0003 -> 1e-05",
        "trainer.gradient_clip_val 1.0 -> 0.01",
    ):
        assert change in notice
    fresh = train_in_process(tmp_path / "fresh", *JOB, *APPLIED)  # the schedule is a function of the step
    step_lr = {row["step"]: row["lr"] for row in fresh if "lr" in row}
    assert [row["lr"] for row in changed if row.get("step", 0) > RESUMED_AT] == [step_lr[3], step_lr[4]]
    groups = saved_state(_checkpoint(tmp_path / "changed", 3), "optimizer")["optimizer"]["param_groups"]
    assert (groups["0"]["weight_decay"], groups["1"]["weight_decay"]) == (0.2, 0.0)
    assert all(tuple(group["betas"]) == (0.8, 0.9) and group["eps"] == 1e-6 for group in groups.values())
    assert all(group["lr"] == step_lr[4] for group in groups.values())  # the next step's rate
    unchanged = _resume(first_run, tmp_path / "unchanged")
    assert losses(changed)[0] == losses(unchanged)[0]  # the first resumed step's forward
    assert losses(changed)[1] != losses(unchanged)[1]  # after its update, which used the new settings


def test_changes_that_shape_the_state_are_refused_naming_each_key(first_run):
    message = _refusal(
        first_run,
        "model.encoder_seq_length=32",
        "model.num_attention_heads=8",
        "model.num_kv_heads=4",
        "precision.type=bf16SR",
        "model.optim={name: adam, lr: 3e-3, "
        "sched: {name: CosineAnnealing, warmup_steps: 2, min_lr: 3e-4, max_steps: 4}}",
    )
    assert "cannot continue this checkpoint with changed settings that shape its state or data position" in message
    for change in (
        "precision.type: 'fp32' in the checkpoint, 'bf16SR' here",
        "model.optim.name: 'adamw' in the checkpoint, 'adam' here",
        "model.encoder_seq_length: 64 in the checkpoint, 32 here",
        "model.num_attention_heads: 4 in the checkpoint, 8 here",
        "model.num_kv_heads: 2 in the checkpoint, 4 here",
    ):
        assert change in message
    assert "expected the settings it was saved with, or model.weight_init_only: True" in message


def test_another_tokenizer_of_the_same_size_or_replaced_data_is_refused(tokenizer_file, tmp_path):
    rows = [[random.Random(r).randrange(300) for _ in range(65)] for r in range(32)]
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(str(tmp_path / "train"))
    data = [f"+data.tokenizer.type={tokenizer_file}", f"+data.train_dir={tmp_path / 'train'}"]
    train_in_process(tmp_path / "run", *JOB, *data)
    other = json.loads(tokenizer_file.read_text())
    vocab = other["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[260:262]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # the same size, another mapping
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "tokenizer.json").write_text(json.dumps(other))
    message = _refusal(tmp_path / "run", *data, f"data.tokenizer.type={tmp_path / 'other' / 'tokenizer.json'}")
    assert (
        "data.tokenizer: another tokenizer than the checkpoint's (its vocabulary, merges or special ids differ"
        in message
    )
    shutil.copytree(tmp_path / "train", tmp_path / "moved")  # moved data is the same data
    train_in_process(
        tmp_path / "moved_run",
        *JOB,
        f"+data.tokenizer.type={tokenizer_file}",
        f"+data.train_dir={tmp_path / 'moved'}",
        f"+exp_manager.resume_from_checkpoint={_checkpoint(tmp_path / 'run', RESUMED_AT)}",
    )
    shutil.rmtree(tmp_path / "train")
    rows[0] = [(token + 1) % 300 for token in rows[0]]
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(str(tmp_path / "train"))
    assert "data.train_dir: the files there are not those the checkpoint trained on (replaced or changed)" in _refusal(
        tmp_path / "run", *data
    )


def test_hugging_face_weights_whose_config_disagrees_on_heads_are_refused(first_run, tmp_path):
    """Weights of one shape hold 4 query heads of 16 values or 8 of 8: the shapes alone let them load."""
    assert main(["ckpt", "export-hf", str(_checkpoint(first_run, RESUMED_AT)), str(tmp_path / "hf")]) == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config.update(num_attention_heads=8, num_key_value_heads=4, head_dim=8)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    cfg = load_config(
        default_config_path(),
        [*FAST, f"+exp_manager.resume_from_checkpoint={tmp_path / 'hf'}", "+model.weight_init_only=True"],
    )
    with pytest.raises(PreflightError) as caught:
        plan_run(cfg, default_cache_dir())
    assert (
        f"{tmp_path / 'hf' / 'config.json'}: describes another architecture than this run's (num_attention_heads: "
        "8 there, 4 here; num_key_value_heads: 4 there, 2 here; head_dim: 8 there, 16 here)"
    ) in str(caught.value)


APPLIED_CHOICES = {
    "model.optim.lr": [1e-3, 5e-3],
    "model.optim.weight_decay": [0.0, 0.1, 0.3],
    "model.optim.betas": [[0.8, 0.9], [0.9, 0.99]],
    "+model.optim.eps": [1e-6, 1e-7],
    "model.optim.sched.warmup_steps": [0, 1, 3],
    "model.optim.sched.min_lr": [0.0, 1e-5],
    "model.optim.sched.constant_steps": [1],
    "trainer.gradient_clip_val": [0.1, 0.5],
}
REFUSED_CHOICES = {
    "model.encoder_seq_length": [32],
    "model.num_layers": [1, 3],
    "model.hidden_size": [32],
    "model.ffn_hidden_size": [128],
    "model.num_attention_heads": [8],
    "model.num_kv_heads": [1, 4],
    "model.activation": ["gelu"],
    "model.normalization": ["layernorm"],
    "model.has_bias": [True],
    "precision.type": ["bf16SR", "mixed_precision"],
    "model.optim.name": ["adam", "adamax"],
}
FUZZ = random.Random(41)
CASES = [
    case
    for choices in (APPLIED_CHOICES, REFUSED_CHOICES)
    for case in FUZZ.sample([(key, value) for key, values in choices.items() for value in values], 15)
]
"""30 distinct single-key changes, 15 of each kind, drawn once with a fixed seed."""


@pytest.mark.parametrize(
    ("key", "value"),
    [
        pytest.param(key, value, marks=() if index % 6 == 0 else pytest.mark.slow)
        for index, (key, value) in enumerate(CASES)
    ],
)
def test_a_single_changed_key_is_applied_from_the_first_resumed_step_or_refused_by_name(
    key, value, first_run, tmp_path
):
    change = f"{key}={json.dumps(value)}"
    name = key.lstrip("+")
    saved = load_config(default_config_path(), [*FAST, *JOB]).model_dump(mode="json")
    old = saved
    for part in name.split("."):
        old = old.get(part) if isinstance(old, dict) else None
    if key in REFUSED_CHOICES:
        assert f"{name}: {old!r} in the checkpoint, {value!r} here" in _refusal(first_run, change)
        return
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        resumed = _resume(first_run, tmp_path / "resumed", change)
    notices = [str(w.message) for w in record if "with changed settings" in str(w.message)]
    if old == value:  # drawn equal to the file's: nothing changes, nothing is said
        assert notices == []
        return
    assert len(notices) == 1 and f"{name} {old!r} -> {value!r}" in notices[0]
    fresh = {row["step"]: row["lr"] for row in train_in_process(tmp_path / "fresh", *JOB, change) if "lr" in row}
    assert [row["lr"] for row in resumed if "lr" in row] == [fresh[3], fresh[4]]
    groups = saved_state(_checkpoint(tmp_path / "resumed", 3), "optimizer")["optimizer"]["param_groups"]
    option = name.removeprefix("model.optim.")
    if option in ("weight_decay", "betas", "eps"):
        assert json.loads(json.dumps(groups["0"][option])) == value  # the first resumed update used it
    unchanged = _resume(first_run, tmp_path / "unchanged")
    assert losses(resumed)[0] == losses(unchanged)[0]
    first_update_lr = [run[0]["lr"] for run in (resumed, unchanged)]
    if "sched" not in name or first_update_lr[0] != first_update_lr[1]:  # a schedule may agree at this step
        assert losses(resumed)[1] != losses(unchanged)[1]
