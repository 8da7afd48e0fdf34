"""nxd under a real Slurm (Debian's slurm-wlm and munge: one controller and one node daemon on this host, see
tests/slurm_cluster.py): jobs whose srun starts the processes train and match one process (fp32, 1e-6); a job
warned with USR1 saves, is requeued and ends with the uninterrupted losses; the scripts `nxd-train launch`
writes from NxDT, GPT-NeoX and QEfficient files are accepted by sbatch and train.

Where Slurm cannot start these tests skip saying why; under CI (CI=true) that is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.slurm_cluster import SlurmUnavailable, start_cluster
from tests.training_runs import CLUSTER_JOB, CLUSTER_STEPS, SLOWED, step_losses

PYTHON = sys.executable
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    try:
        cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    except SlurmUnavailable as why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Slurm is needed under CI and cannot start: {why}")
        pytest.skip(f"Slurm cannot start here: {why}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict[int, float]:
    """The job's losses in one process (gradient accumulation 4 for the same global batch of 8)."""
    log_dir = tmp_path_factory.mktemp("one") / "run"
    command = [PYTHON, "-m", "nxd_train", *CLUSTER_JOB, f"+exp_manager.explicit_log_dir={log_dir}"]
    result = subprocess.run(command, cwd=log_dir.parent, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return step_losses(log_dir)


def _script(path: Path, options: list[str], body: str) -> Path:
    path.write_text("#!/bin/bash\n" + "".join(f"#SBATCH {option}\n" for option in options) + body)
    return path


def _train_line(log_dir: Path, *overrides: str) -> str:
    return " ".join(
        [
            PYTHON,
            "-m",
            "nxd_train",
            *CLUSTER_JOB,
            "trainer.devices=2",
            *overrides,
            f"+exp_manager.explicit_log_dir={log_dir}",
        ]
    )


def _differ(found: dict[int, float], expected: dict[int, float]) -> list[str]:
    return [
        f"step {s}: {found.get(s)!r} against {expected[s]!r}"
        for s in range(1, CLUSTER_STEPS + 1)
        if s not in found or abs(found[s] - expected[s]) > 1e-6
    ]


def _finished(slurm, job: str, output: Path) -> None:
    state = slurm.wait(job, timeout=600)
    assert state == "COMPLETED", f"job {job} {state}: {output.read_text()[-3000:] if output.exists() else ''}"


def test_srun_ntasks_trains_like_one_process_and_a_usr1_warning_requeues_it_to_the_same_losses(
    slurm, one_process, tmp_path
):
    """`#SBATCH --ntasks=2` (no --ntasks-per-node, which Lightning's own Slurm support requires); mid-run,
    `scancel --signal=USR1` (what `--signal=USR1@N` sends before the time limit): every rank stops after the
    same step, the checkpoint of that step is written, the job requeues itself and resumes from it."""
    log_dir, output = tmp_path / "run", tmp_path / "job.out"
    script = _script(
        tmp_path / "job.sh",
        ["--ntasks=2", "--requeue", "--open-mode=append", f"--output={output}"],
        f"cd {tmp_path}\nsrun {_train_line(log_dir, *SLOWED)}\n",
    )
    job = slurm.submit(script)
    deadline = time.monotonic() + 300
    while not (log_dir / "metrics.csv").exists() or max(step_losses(log_dir), default=0) < 6:
        assert slurm.state(job) in ("PENDING", "RUNNING"), output.read_text()[-3000:]
        assert time.monotonic() < deadline, "the job did not reach step 6"
        time.sleep(0.1)
    slurm.run("scancel", "--signal=USR1", job)
    _finished(slurm, job, output)
    said = output.read_text()
    assert "stopped by SIGUSR1 after step" in said and f"Slurm job {job} requeued" in said, said[-3000:]
    assert f"Slurm requeue 1 of job {job}: resumed at step" in said, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    assert not _differ(step_losses(log_dir), one_process)


@pytest.mark.slow
def test_srun_inside_an_allocation_and_ntasks_per_node(slurm, one_process, tmp_path):
    output = tmp_path / "alloc.out"
    inside = _script(
        tmp_path / "alloc.sh",
        ["--nodes=1", "--ntasks-per-node=2", f"--output={output}"],
        f"cd {tmp_path}\nsrun {_train_line(tmp_path / 'per_node')}\n",
    )
    _finished(slurm, slurm.submit(inside), output)
    assert not _differ(step_losses(tmp_path / "per_node"), one_process)
    result = slurm.run(
        "salloc", "--ntasks=2", "srun", *_train_line(tmp_path / "salloc").split(), timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not _differ(step_losses(tmp_path / "salloc"), one_process)


def _launch(slurm, tmp_path: Path, *items: str) -> tuple[str, str]:
    """`nxd-train launch ITEMS --submit` from tmp_path; the job id once it has completed, and what it printed."""
    result = subprocess.run(
        [PYTHON, "-m", "nxd_train", "launch", *items, "--submit"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=slurm.env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    job = result.stdout.strip().splitlines()[-1].removeprefix("submitted job ")
    output = tmp_path / f"slurm-{job}.out"
    _finished(slurm, job, output)
    return job, output.read_text()


def test_sbatch_reads_back_each_value_launch_writes_into_a_directive(slurm, tmp_path):
    """Quotes, backslashes, '#', '$()' and spaces in the job name and comment reach Slurm as they are (a held job,
    cancelled once read)."""
    comment, job_name = """it's "quoted" \\ # $(touch PWN) `x`""", "a b\\c"
    result = subprocess.run(
        [
            PYTHON,
            "-m",
            "nxd_train",
            "launch",
            str(REPO / "configs/tiny.yaml"),
            f"+trainer.cluster.comment={json.dumps(comment)}",
            f"+trainer.cluster.job_name={json.dumps(job_name)}",
            "--output",
            "job.sbatch",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=slurm.env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    job = slurm.submit(tmp_path / "job.sbatch", "--hold")
    try:
        shown = slurm.run("squeue", "-h", "-j", job, "-o", "%j|%k").stdout.rstrip("\n")
    finally:
        slurm.run("scancel", job, check=False)
    assert shown.split("|", 1) == [job_name, comment]
    assert not (tmp_path / "PWN").exists()


@pytest.mark.slow
def test_the_sbatch_script_launch_writes_from_an_nxdt_file_trains(slurm, one_process, tmp_path):
    log_dir = tmp_path / "run"
    _, said = _launch(
        slurm,
        tmp_path,
        str(REPO / "configs/tiny.yaml"),
        *CLUSTER_JOB,
        "trainer.devices=2",
        f"+exp_manager.explicit_log_dir={log_dir}",
    )
    script = next(tmp_path.glob("*.sbatch")).read_text()
    assert "#SBATCH --ntasks-per-node=2" in script and "#SBATCH --signal=USR1@120" in script
    assert f"done: {CLUSTER_STEPS} steps" in said and not _differ(step_losses(log_dir), one_process)


@pytest.mark.slow
def test_the_sbatch_script_launch_writes_from_neox_and_qefficient_files_trains(slurm, tmp_path, chat_tokenizer_dir):
    """A NeoX file with a hostfile and launcher: slurm (one host of two slots here), and a QEfficient file
    with ddp_degree 2."""
    repo = REPO
    (tmp_path / "hostfile").write_text(f"{os.uname().nodename} slots=2\n")
    (tmp_path / "cluster.yml").write_text('{"hostfile": "hostfile", "launcher": "slurm", "comment": "nxd test"}\n')
    _, said = _launch(
        slurm,
        tmp_path,
        str(repo / "configs/neox/pythia_tiny.yml"),
        str(repo / "configs/neox/local_setup.yml"),
        "cluster.yml",
        "train_micro_batch_size_per_gpu=4",
        "train_iters=20",
    )
    assert "2 process(es) (dp 2)" in said and "done: 20 steps" in said, said[-3000:]
    assert '#SBATCH --comment="nxd test"' in next(tmp_path.glob("*.sbatch")).read_text()

    from tests.qeff_fixtures import hub_datasets, local_config, tiny_model

    qeff = tmp_path / "qeff"
    qeff.mkdir()
    config = local_config(
        repo / "configs/qeff/sft_ddp_config.yaml",
        qeff / "sft.yaml",
        tiny_model(qeff / "model", chat_tokenizer_dir),
        hub_datasets(qeff / "hub"),
        qeff / "out",
        dataset={"max_seq_length": 128},
        training={"ddp_degree": 2, "max_steps": 4},
    )
    _, said = _launch(slurm, qeff, str(config))
    assert "2 process(es) (dp 2)" in said and "done: 4 steps" in said, said[-3000:]
