"""Exact resume after SIGKILL and resharding, with real processes on gloo launched by nxd-train.

Each layout trains 10 steps uninterrupted, saving at steps 5 and 10. A second run of the same job is
killed with SIGKILL once its step-5 checkpoint is complete, then resumed (resume_if_exists in the
same log directory) to step 10: the losses of steps 6-10 and every model and optimizer tensor of the
final checkpoints are identical. The killed run validates after every step only to slow it down, so
the kill lands mid-run; validation changes nothing in training (no dropout, no shuffling). The TP2 case (with
asynchronous saves) runs by default; DP2 and DP2+zero1 run with --runslow.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nxd_ckpt import list_checkpoints

from tests.training_runs import FAST, assert_identical, read_metrics, saved_state

JOB = [
    *FAST,
    "trainer.max_steps=10",
    "data.micro_batch_size=2",
    "data.global_batch_size=8",
    "exp_manager.create_checkpoint_callback=True",
    "+exp_manager.checkpoint_callback_params.every_n_train_steps=5",
    "+exp_manager.checkpoint_callback_params.save_top_k=-1",
]
SLOW = ["trainer.val_check_interval=1", "trainer.limit_val_batches=6"]
"""Validation after every step: it slows the run to be killed, so the kill lands mid-run."""
LAYOUTS = {
    "dp2": ["trainer.devices=2"],
    "tp2": ["trainer.devices=2", "distributed_strategy.tensor_model_parallel_size=2"],
    "dp2_zero1": ["trainer.devices=2", "distributed_strategy.zero1=True"],
}
RESHARDED = {"pp2": ["trainer.devices=2", "distributed_strategy.pipeline_model_parallel_size=2"]}
"""Layouts whose checkpoints are only resumed at another layout."""


def command(log_dir: Path, *overrides: str) -> list[str]:
    return [
        str(Path(sys.executable).with_name("nxd-train")),
        *JOB,
        *overrides,
        f"+exp_manager.explicit_log_dir={log_dir}",
    ]


def run(log_dir: Path, *overrides: str) -> None:
    result = subprocess.run(
        command(log_dir, *overrides), cwd=log_dir.parent, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]


def run_and_kill_after_step_5(log_dir: Path, *overrides: str) -> None:
    """Start the job in its own process group and SIGKILL all of it once the step-5 checkpoint is complete."""
    process = subprocess.Popen(
        command(log_dir, *overrides, *SLOW),
        cwd=log_dir.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while not any(i.complete and i.step == 5 for i in list_checkpoints(log_dir / "checkpoints")):
            assert process.poll() is None, "the run ended before its step-5 checkpoint"
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def step_losses(log_dir: Path) -> dict[int, float]:
    """The loss of every step (the last record of a step wins: a resumed run logs it again)."""
    return {int(row["step"]): row["loss"] for row in read_metrics(log_dir) if "loss" in row}


def final_state(log_dir: Path) -> dict:
    (final,) = [i.path for i in list_checkpoints(log_dir / "checkpoints") if i.step == 10]
    return saved_state(final, "model", "optimizer")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Each layout's uninterrupted run, made once for the module."""
    made: dict[str, Path] = {}

    def get(layout: str) -> Path:
        if layout not in made:
            made[layout] = tmp_path_factory.mktemp(f"{layout}_whole") / "run"
            run(made[layout], *(LAYOUTS | RESHARDED)[layout])
        return made[layout]

    return get


@pytest.mark.slow  # the default suite kills a worker under torchrun (test_cluster_life) and resumes TP2 at TP1/DP2
@pytest.mark.parametrize(
    "layout", [pytest.param(name, marks=[] if name == "tp2" else [pytest.mark.slow]) for name in LAYOUTS]
)  # tp2 by default; all three with --runslow
def test_sigkill_then_resume_is_exact(tmp_path, uninterrupted, layout):
    whole = uninterrupted(layout)
    broken = tmp_path / "run"
    saving = ["+exp_manager.async_checkpointing=True"] if layout == "tp2" else []  # the interrupted run saves async
    run_and_kill_after_step_5(broken, *LAYOUTS[layout], *saving)
    assert 10 not in step_losses(broken), "the kill came after the run had finished"
    assert [i.step for i in list_checkpoints(broken / "checkpoints") if i.complete] == [5]
    run(broken, *LAYOUTS[layout], *saving, "exp_manager.resume_if_exists=True")
    expected, resumed = step_losses(whole), step_losses(broken)
    assert [resumed[step] for step in range(6, 11)] == [expected[step] for step in range(6, 11)]
    assert_identical(final_state(broken), final_state(whole))


@pytest.mark.parametrize("target", ["tp1", pytest.param("dp2", marks=pytest.mark.slow)])
def test_a_tp2_checkpoint_resumes_at_tp1_or_dp2(tmp_path, uninterrupted, train_here, target):
    """Resharded by the load: one process; with --runslow two data-parallel ones too (the default suite resumes a
    data-parallel checkpoint on another number of processes in test_cluster_life)."""
    whole = uninterrupted("tp2")
    (step_5,) = [i.path for i in list_checkpoints(whole / "checkpoints") if i.step == 5]
    expected = step_losses(whole)[6]
    if target == "tp1":
        single = train_here(
            *JOB[len(FAST) :],
            f"+exp_manager.resume_from_checkpoint={step_5}",
            "exp_manager.create_checkpoint_callback=False",
        )
        assert abs(single[0]["loss"] - expected) < 1e-6 and single[0]["step"] == 6
        return
    dp2 = tmp_path / "dp2"
    run(
        dp2,
        "trainer.devices=2",
        f"+exp_manager.resume_from_checkpoint={step_5}",
        "exp_manager.create_checkpoint_callback=False",
    )
    assert abs(step_losses(dp2)[6] - expected) < 1e-6


@pytest.mark.slow  # the default suite resumes TP2 at TP1 and DP2, and a run on another number of processes
def test_pp2_checkpoint_resumes_in_one_process(uninterrupted, train_here):
    """Each pipeline stage saved its own layers under whole-model names; one process loads them all."""
    whole = uninterrupted("pp2")
    (step_5,) = [i.path for i in list_checkpoints(whole / "checkpoints") if i.step == 5]
    single = train_here(
        *JOB[len(FAST) :],
        f"+exp_manager.resume_from_checkpoint={step_5}",
        "exp_manager.create_checkpoint_callback=False",
    )
    assert single[0]["step"] == 6 and abs(single[0]["loss"] - step_losses(whole)[6]) < 1e-6


def _start(log_dir: Path, *overrides: str) -> subprocess.Popen:
    """The command as a terminal starts it: with Ctrl-C's default disposition, whatever this process's is (nxd-train
    keeps a SIGINT its parent ignores, and a test run may leave it ignored here)."""
    return subprocess.Popen(
        command(log_dir, *overrides, *SLOW),
        cwd=log_dir.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _after_step(process: subprocess.Popen, log_dir: Path, step: int) -> None:
    """Wait until the run has logged optimizer step `step`."""
    deadline = time.monotonic() + 600
    while not (log_dir / "metrics.csv").exists() or max(step_losses(log_dir), default=0) < step:
        assert process.poll() is None, process.stderr.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.slow  # the default suite's preemption: Slurm's USR1 warning on two ranks (test_slurm)
def test_sigterm_saves_after_the_step_on_every_rank_and_the_resume_is_exact(tmp_path, uninterrupted):
    """A scheduler's preemption reaching rank 0 alone: both DP ranks finish the same step, a checkpoint of
    it is written, the run exits 143 with one message and no traceback; resuming gives the
    uninterrupted run's losses and final state bit for bit."""
    whole = uninterrupted("dp2")
    broken = tmp_path / "run"
    process = _start(broken, *LAYOUTS["dp2"])
    _after_step(process, broken, 2)
    process.send_signal(signal.SIGTERM)
    stderr = process.communicate(timeout=600)[1]
    assert process.returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr and stderr.count("stopped by SIGTERM after step") == 1, stderr[-3000:]
    stopped = int(stderr.split("stopped by SIGTERM after step ")[1].split()[0])
    assert stopped < 10 and stopped in [i.step for i in list_checkpoints(broken / "checkpoints") if i.complete]
    run(broken, *LAYOUTS["dp2"], "exp_manager.resume_if_exists=True")
    expected, resumed = step_losses(whole), step_losses(broken)
    assert [resumed[step] for step in range(1, 11)] == [expected[step] for step in range(1, 11)]
    assert_identical(final_state(broken), final_state(whole))


def test_ctrl_c_to_two_processes_under_uv_run_stops_both_after_one_step_with_a_checkpoint(tmp_path):
    """A terminal's Ctrl-C reaches the whole foreground group (uv, rank 0 and rank 1) and uv forwards it to rank 0
    once more: one request, acknowledged once; both ranks stop after the same step with a complete checkpoint, no
    `.partial` folder, no rank left running and no C++ stack on the terminal. Where uv is not on this machine the
    test delivers uv's forward itself."""
    uv = os.environ.get("UV") or shutil.which("uv")
    log_dir = tmp_path / "run"
    job = command(log_dir, *LAYOUTS["dp2"], *SLOW, "exp_manager.create_checkpoint_callback=True")
    launcher = (
        [uv, "run", "--no-sync", "--project", str(Path(__file__).parents[2]), "nxd-train", *job[1:]] if uv else job
    )
    process = subprocess.Popen(
        launcher, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    _after_step(process, log_dir, 1)
    os.killpg(process.pid, signal.SIGINT)
    if uv is None:
        process.send_signal(signal.SIGINT)
    stderr = process.communicate(timeout=600)[1]
    time.sleep(1.0)
    left = subprocess.run(["pgrep", "-f", f"explicit_log_dir={log_dir}"], capture_output=True, text=True).stdout
    assert process.returncode == 130 and not left.split(), (left, stderr[-3000:])
    for sign in ("Traceback", "Exception raised from", "frame #", "again: exiting at once"):
        assert sign not in stderr, stderr[-3000:]
    assert stderr.count("SIGINT: stopping after this step with a checkpoint") == 1, stderr[-3000:]
    stopped = int(stderr.split("stopped by SIGINT after step ")[1].split()[0])
    assert stopped < 10 and stopped in [
        info.step for info in list_checkpoints(log_dir / "checkpoints") if info.complete
    ]
    assert not [path for path in (log_dir / "checkpoints").iterdir() if path.name.endswith(".partial")]


def test_ctrl_c_while_starting_is_one_line(tmp_path):
    """A KeyboardInterrupt inside a library's import can leave it half loaded; the command exits at once."""
    process = _start(tmp_path / "run")
    time.sleep(1.0)  # the entry point's handler is in place within milliseconds; set-up lasts seconds more
    process.send_signal(signal.SIGINT)
    stderr = process.communicate(timeout=600)[1]
    assert process.returncode == 130, stderr[-3000:]
    assert (
        stderr.strip() == "nxd-train: SIGINT outside the training steps (setting up or finishing): exiting "
        "now; checkpoints already complete are kept, nothing else was saved"
    )


@pytest.mark.slow
@pytest.mark.parametrize("draw", range(20))
def test_sigterm_at_a_random_moment_resumes_to_the_uninterrupted_losses(tmp_path, uninterrupted, draw):
    """Twenty preemptions of a DP2 run at random steps and moments within them, signalling rank 0
    alone or every rank (as a scheduler does): each saves, exits 143 with no traceback, and its resume
    logs the uninterrupted run's per-step losses bit for bit."""
    rng = random.Random(draw)
    whole = uninterrupted("dp2")
    broken = tmp_path / "run"
    process = subprocess.Popen(
        command(broken, *LAYOUTS["dp2"], *SLOW),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    _after_step(process, broken, rng.randint(1, 7))
    time.sleep(rng.uniform(0.0, 0.1))  # a moment within the next step
    if rng.random() < 0.5:
        process.send_signal(signal.SIGTERM)
    else:
        os.killpg(process.pid, signal.SIGTERM)
    stderr = process.communicate(timeout=600)[1]
    assert process.returncode == 143 and "Traceback" not in stderr, stderr[-3000:]
    run(broken, *LAYOUTS["dp2"], "exp_manager.resume_if_exists=True")
    expected, resumed = step_losses(whole), step_losses(broken)
    assert [resumed[step] for step in range(1, 11)] == [expected[step] for step in range(1, 11)]
