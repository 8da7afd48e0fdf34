"""nxd-train's checkpoint keys in one process: exact resume under each kind of weights, starting from
weights only (nxd checkpoints and Hugging Face directories), the resume keys' errors, `ckpt list`."""

from __future__ import annotations

import pytest
import torch
from nxd_ckpt import MARKER, list_checkpoints
from nxd_config import ConfigNotice, load_config
from nxd_train.checks.preflight import PreflightError, plan_run
from nxd_train.cli import default_config_path, main
from nxd_train.run.corpus import default_cache_dir
from safetensors.torch import load_file

from tests.training_runs import assert_identical, saved_state

SAVE = ["exp_manager.create_checkpoint_callback=True", "+exp_manager.checkpoint_callback_params.save_top_k=-1"]


def checkpoints(log_dir):
    return {info.step: info.path for info in list_checkpoints(log_dir / "checkpoints")}


def saved(path, key: str) -> dict:
    return saved_state(path, key)[key]


@pytest.mark.parametrize("precision", ["fp32", "mixed_precision", "bf16SR"])
def test_resume_continues_exactly(tmp_path, train_here, precision):
    job = [
        "trainer.max_steps=6",
        *SAVE,
        "+exp_manager.checkpoint_callback_params.every_n_train_steps=3",
        f"precision.type={precision}",
    ]
    whole = train_here(*job)
    whole_dir = tmp_path / "run0"
    resumed = train_here(*job, f"+exp_manager.resume_from_checkpoint={checkpoints(whole_dir)[3]}")
    assert [row["loss"] for row in resumed] == [row["loss"] for row in whole[3:]]
    assert_identical(
        saved_state(checkpoints(whole_dir)[6], "model", "optimizer"),
        saved_state(checkpoints(tmp_path / "run1")[6], "model", "optimizer"),
    )


def test_exit_interval_stops_with_a_checkpoint_and_resumes_exactly(tmp_path, train_here):
    """GPT-NeoX's exit_interval: each run stops after a multiple of it (exit code 0) with a checkpoint there, even
    between the checkpoint cadence's saves; resuming from it gives the uninterrupted losses."""
    job = ["trainer.max_steps=5", *SAVE, "+exp_manager.checkpoint_callback_params.every_n_train_steps=5"]
    whole = [row["loss"] for row in train_here(*job)]
    first = [row["loss"] for row in train_here(*job, "+trainer.exit_interval=2")]
    assert first == whole[:2] and sorted(checkpoints(tmp_path / "run1")) == [2]
    second = train_here(
        *job, "+trainer.exit_interval=2", f"+exp_manager.resume_from_checkpoint={checkpoints(tmp_path / 'run1')[2]}"
    )
    assert [row["loss"] for row in second] == whole[2:4] and sorted(checkpoints(tmp_path / "run2")) == [4]
    last = train_here(
        *job, "+trainer.exit_interval=2", f"+exp_manager.resume_from_checkpoint={checkpoints(tmp_path / 'run2')[4]}"
    )
    assert [row["loss"] for row in last] == whole[4:]  # step 5 ends the run: no exit after it


def test_master_weights_in_checkpoint(tmp_path, train_here):
    job = [
        "trainer.max_steps=2",
        *SAVE,
        "+exp_manager.checkpoint_callback_params.every_n_train_steps=2",
        "precision.type=mixed_precision",
    ]
    train_here(*job, "+exp_manager.checkpoint_callback_params.use_master_weights_in_ckpt=True")
    train_here(*job)
    with_masters, without = checkpoints(tmp_path / "run0")[2], checkpoints(tmp_path / "run1")[2]
    assert saved(with_masters, "model")["model.norm.weight"].dtype == torch.float32
    assert saved(without, "model")["model.norm.weight"].dtype == torch.bfloat16
    assert "masters" in saved(without, "optimizer") and "masters" not in saved(with_masters, "optimizer")


def test_save_bf16_stores_bf16_weights(tmp_path, train_here):
    train_here(
        "trainer.max_steps=1",
        *SAVE,
        "+exp_manager.checkpoint_callback_params.every_n_train_steps=1",
        "+exp_manager.save_bf16=True",
    )
    weights = saved(checkpoints(tmp_path / "run0")[1], "model")
    assert {tensor.dtype for tensor in weights.values()} == {torch.bfloat16}


def test_weight_init_only_starts_a_new_run_from_the_weights(tmp_path, train_here):
    train_here("trainer.max_steps=3", *SAVE, "+exp_manager.checkpoint_callback_params.every_n_train_steps=3")
    source = checkpoints(tmp_path / "run0")[3]
    rows = train_here(
        "trainer.max_steps=1",
        *SAVE,
        "+exp_manager.checkpoint_callback_params.every_n_train_steps=1",
        f"+exp_manager.resume_from_checkpoint={source}",
        "+model.weight_init_only=True",
        "model.optim.lr=0",
    )
    assert rows[0]["step"] == 1 and rows[0]["consumed_samples"] == 8  # a new run: step 1, the first batch
    after = saved(checkpoints(tmp_path / "run1")[1], "model")
    assert all(torch.equal(tensor, after[key]) for key, tensor in saved(source, "model").items())


def test_hugging_face_weights_start_a_megatron_run(tmp_path, train_here):
    train_here("trainer.max_steps=2", *SAVE, "+exp_manager.checkpoint_callback_params.every_n_train_steps=2")
    assert main(["ckpt", "export-hf", str(tmp_path / "run0"), str(tmp_path / "hf")]) == 0
    train_here(
        "trainer.max_steps=1",
        *SAVE,
        "+exp_manager.checkpoint_callback_params.every_n_train_steps=1",
        f"+exp_manager.resume_from_checkpoint={tmp_path / 'hf'}",
        "+model.weight_init_only=True",
        "model.optim.lr=0",
    )
    assert main(["ckpt", "export-hf", str(checkpoints(tmp_path / "run1")[1]), str(tmp_path / "again")]) == 0
    before, after = (
        load_file(tmp_path / "hf" / "model.safetensors"),
        load_file(tmp_path / "again" / "model.safetensors"),
    )
    assert all(torch.equal(before[key], after[key]) for key in before)


def plan(tmp_path, *overrides):
    cfg = load_config(default_config_path(), [f"+exp_manager.explicit_log_dir={tmp_path}", *overrides])
    return plan_run(cfg, default_cache_dir())


def test_a_damaged_hugging_face_directory_fails_before_launch(tmp_path, train_here):
    train_here("trainer.max_steps=1", *SAVE, "+exp_manager.checkpoint_callback_params.every_n_train_steps=1")
    assert main(["ckpt", "export-hf", str(tmp_path / "run0"), str(tmp_path / "hf")]) == 0
    run = plan(tmp_path / "next", f"+exp_manager.resume_from_checkpoint={tmp_path / 'run0'}").resume  # a run directory
    assert run.path == checkpoints(tmp_path / "run0")[1].resolve() and not run.weights_only
    weights = tmp_path / "hf" / "model.safetensors"
    start = [f"+exp_manager.resume_from_checkpoint={tmp_path / 'hf'}", "+model.weight_init_only=True"]
    assert plan(tmp_path / "fine", *start).resume.hugging_face
    weights.write_bytes(weights.read_bytes()[:-64])
    with pytest.raises(PreflightError, match=r"hf/model.safetensors: not a readable safetensors file"):
        plan(tmp_path / "damaged", *start)


def test_resume_keys_fail_before_launch(tmp_path):
    with pytest.raises(
        PreflightError,
        match="resume_if_exists: expected a complete, undamaged checkpoint in .*, found none; set .*resume_ignore_no_checkpoint",
    ):
        plan(tmp_path, "exp_manager.resume_if_exists=True")
    with pytest.warns(ConfigNotice, match="starting a new run"):
        assert (
            plan(tmp_path, "exp_manager.resume_if_exists=True", "+exp_manager.resume_ignore_no_checkpoint=True").resume
            is None
        )
    for where in (tmp_path / "missing", tmp_path):  # GPT-NeoX's load: a missing or empty folder starts fresh
        with pytest.warns(ConfigNotice, match="resume_from_checkpoint: .* is (missing|empty); starting a new run"):
            assert (
                plan(
                    tmp_path,
                    f"+exp_manager.resume_from_checkpoint={where}",
                    "+exp_manager.resume_from_checkpoint_optional=True",
                ).resume
                is None
            )
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("no checkpoint here")
    with pytest.warns(ConfigNotice, match="notes holds no checkpoint .*; starting a new run"):
        assert (
            plan(
                tmp_path,
                f"+exp_manager.resume_from_checkpoint={tmp_path / 'notes'}",
                "+exp_manager.resume_from_checkpoint_optional=True",
            ).resume
            is None
        )
    with pytest.raises(PreflightError, match="found no directory at .*missing"):  # NxDT's key is for resume_if_exists
        plan(
            tmp_path,
            f"+exp_manager.resume_from_checkpoint={tmp_path / 'missing'}",
            "+exp_manager.resume_ignore_no_checkpoint=True",
        )
    half = tmp_path / "checkpoints" / "half"
    half.mkdir(parents=True)
    (half / ".metadata").write_bytes(b"")
    with pytest.raises(PreflightError, match="half: no completion marker"):
        plan(tmp_path, f"+exp_manager.resume_from_checkpoint={half}")
    with pytest.raises(PreflightError, match=r"monitor: expected one of step, .* found 'accuracy'"):
        plan(tmp_path, *SAVE, "+exp_manager.checkpoint_callback_params.monitor=accuracy")
    with pytest.raises(PreflightError, match=r"filename: \{acc\} is not a logged value"):
        plan(tmp_path, *SAVE, "+exp_manager.checkpoint_callback_params.filename='m-{acc}'")


def test_hugging_face_directory_needs_weight_init_only(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"")
    with pytest.raises(PreflightError, match="is a Hugging Face model .* expected model.weight_init_only: True"):
        plan(tmp_path / "log", f"+exp_manager.resume_from_checkpoint={tmp_path / 'hf'}")


def test_ckpt_list_shows_complete_incomplete_and_damaged(tmp_path, train_here, capsys):
    train_here("trainer.max_steps=3", *SAVE, "+exp_manager.checkpoint_callback_params.every_n_train_steps=1")
    found = checkpoints(tmp_path / "run0")
    (found[2] / MARKER).unlink()
    shard = next(found[3].glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    capsys.readouterr()
    assert main(["ckpt", "list", str(tmp_path / "run0")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:5] == ["NAME", "STEP", "SAMPLES", "SIZE", "STATE"]
    rows = {line.split()[0].split("--")[1]: line for line in lines[2:]}
    assert rows["step=1-consumed_samples=8"].rstrip().endswith("complete")
    assert "INCOMPLETE: no completion marker" in rows["step=2-consumed_samples=16"]
    assert f"DAMAGED: {shard} is 100 bytes" in rows["step=3-consumed_samples=24"]


def test_a_resumed_run_keeps_its_metrics_and_records_each_step_once(tmp_path, train_here):
    """Killed after step 5 (rows 1-5 written, the step-6 checkpoint never made), then resumed in its own
    directory from step 3: metrics.csv holds every step exactly once, rows 1-3 as first written."""
    import csv
    import shutil

    from tests.training_runs import read_metrics, train_in_process

    job = ["trainer.max_steps=6", *SAVE, "+exp_manager.checkpoint_callback_params.every_n_train_steps=3"]
    whole = train_here(*job)
    log_dir = tmp_path / "run0"
    shutil.rmtree(checkpoints(log_dir)[6])
    with open(log_dir / "metrics.csv", newline="") as handle:
        reader = csv.DictReader(handle)
        fields, rows = reader.fieldnames, [row for row in reader if float(row["step"]) <= 5]
    with open(log_dir / "metrics.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    train_in_process(log_dir, *job, "exp_manager.resume_if_exists=True")
    found = read_metrics(log_dir)
    assert [row["step"] for row in found if "loss" in row] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert [row["loss"] for row in found if "loss" in row] == [row["loss"] for row in whole if "loss" in row]
    assert found[:3] == whole[:3]


def test_a_resume_without_the_optimizer_state_starts_it_and_the_schedule_afresh(tmp_path, train_here):
    """resume_optimizer / resume_rng False (GPT-NeoX's no_load_optim / no_load_rng): the step and data go on, the
    learning rate starts its warmup over; resume_schedule picks whose schedule, or refuses a changed one."""
    job = ["trainer.max_steps=6", *SAVE, "+exp_manager.checkpoint_callback_params.every_n_train_steps=3"]
    whole = train_here(*job)
    middle = checkpoints(tmp_path / "run0")[3]
    resumed = train_here(
        *job,
        f"+exp_manager.resume_from_checkpoint={middle}",
        "+exp_manager.resume_optimizer=False",
        "+exp_manager.resume_rng=False",
    )
    assert [row["step"] for row in resumed] == [4, 5, 6]
    assert [row["consumed_samples"] for row in resumed] == [row["consumed_samples"] for row in whole[3:]]
    assert [row["lr"] for row in resumed] == [row["lr"] for row in whole[:3]] != [row["lr"] for row in whole[3:]]
    start = [f"+exp_manager.resume_from_checkpoint={middle}", "model.optim.sched.warmup_steps=10"]
    with pytest.raises(
        PreflightError,
        match=r"resume_schedule: same: the learning-rate schedule differs .*"
        r"model.optim.sched: .*'warmup_steps': 10.* here",
    ):
        plan(tmp_path / "same", *start, "+exp_manager.resume_schedule=same")
    with pytest.warns(ConfigNotice, match=r"resume_schedule: checkpoint: model.optim sched from"):
        taken = plan(tmp_path / "taken", *start, "+exp_manager.resume_schedule=checkpoint")
    assert taken.update.schedule_options["warmup_steps"] == 30
    assert plan(tmp_path / "config", *start).update.schedule_options["warmup_steps"] == 10
