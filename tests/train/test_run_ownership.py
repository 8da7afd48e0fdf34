"""A run owns its log directory: a second run into it is refused with the holder's pid and host, the
lock dies with its process, and a log directory that cannot be written (a name leaving exp_dir or too
long for folder names, a read-only file system, a file in the way) is one message before launch."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from nxd_ckpt import list_checkpoints
from nxd_config import ConfigError, ConfigNotice, load_config
from nxd_train.checks.preflight import PreflightError, plan_run
from nxd_train.cli import default_config_path, main
from nxd_train.logging.log_dir import LOCK_FILE, LogDirLock
from nxd_train.run.corpus import default_cache_dir

from tests.training_runs import FAST, losses, read_metrics, run_command, train_in_process


def test_a_second_run_into_a_held_log_directory_is_refused_naming_the_holder(tmp_path):
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    holder = LogDirLock(log_dir)
    assert holder.acquire()
    try:
        result = run_command(
            *FAST, "trainer.max_steps=2", "trainer.devices=2", f"+exp_manager.explicit_log_dir={log_dir}", cwd=tmp_path
        )
    finally:
        holder.release()
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if "in use by another run" in line]
    assert len(lines) == 1, result.stderr[-3000:]  # one message, from one rank
    assert (
        f"exp_manager.explicit_log_dir: {log_dir} is in use by another run (pid {os.getpid()} on host "
        f"{socket.gethostname()})" in lines[0]
    )
    assert "Traceback" not in result.stderr
    assert sorted(path.name for path in log_dir.iterdir()) == [LOCK_FILE]  # the second run wrote nothing


def test_a_killed_holder_leaves_the_log_directory_free(tmp_path):
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    hold = (
        "import sys, time; from pathlib import Path; from nxd_train.logging.log_dir import LogDirLock; "
        "lock = LogDirLock(Path(sys.argv[1])); assert lock.acquire(); print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(log_dir)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    assert not LogDirLock(log_dir).acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    time.sleep(0.1)
    assert len(losses(train_in_process(log_dir, "trainer.max_steps=2"))) == 2


def _problems(*overrides: str) -> list[str]:
    cfg = load_config(default_config_path(), list(overrides))
    with pytest.raises(PreflightError) as caught:
        plan_run(cfg, default_cache_dir())
    return caught.value.problems


def test_a_log_directory_that_cannot_be_written_is_one_message_before_launch(tmp_path, monkeypatch):
    assert _problems("name=../../outside", f"exp_manager.exp_dir={tmp_path}") == [
        "name: expected a folder name (no '/' and not '..'; the log directory is <exp_dir>/<name>/version_N), "
        "found '../../outside'"
    ]
    assert _problems(f"name={'n' * 300}", f"exp_manager.exp_dir={tmp_path}") == [
        "name: 300 characters are more than a folder name may have on this file system (255 bytes)"
    ]
    assert _problems(
        f"name={'n' * 230}", f"exp_manager.exp_dir={tmp_path}", "exp_manager.create_checkpoint_callback=True"
    ) == [
        "name: 230 characters leave no room in a checkpoint's folder name (at most 255 bytes on this file system, 64 "
        "of them for the step and samples); expected at most 191"
    ]
    (tmp_path / "file").write_text("not a folder")
    assert _problems(f"+exp_manager.explicit_log_dir={tmp_path / 'file' / 'run'}") == [
        f"exp_manager.explicit_log_dir: expected a folder for the log directory {tmp_path / 'file' / 'run'}, found "
        f"a file at {tmp_path / 'file'}"
    ]
    read_only = tmp_path / "mounted"
    read_only.mkdir()
    real_access, real_statvfs = os.access, os.statvfs

    class ReadOnly:
        def __init__(self, result):
            self.f_flag = result.f_flag | os.ST_RDONLY
            self.f_namemax = result.f_namemax

    monkeypatch.setattr(
        os, "access", lambda path, mode: False if str(path) == str(read_only) else real_access(path, mode)
    )
    monkeypatch.setattr(
        os, "statvfs", lambda path: ReadOnly(real_statvfs(path)) if str(path) == str(read_only) else real_statvfs(path)
    )
    assert _problems(f"+exp_manager.explicit_log_dir={read_only / 'run'}") == [
        f"exp_manager.explicit_log_dir: cannot create the log directory {read_only / 'run'}: {read_only} is on a "
        "read-only file system"
    ]


def test_config_check_names_a_log_directory_it_cannot_write(tmp_path, capsys):
    assert main(["config", "check", str(default_config_path()), "name=a/b"]) == 1
    assert "name: expected a folder name" in capsys.readouterr().err


def test_runs_one_after_another_into_one_log_directory_each_hold_it_in_turn(tmp_path):
    """The lock goes with the run, not the process: a resume in the same process takes it again."""
    log_dir, saving = tmp_path / "run", ["exp_manager.create_checkpoint_callback=True"]
    assert len(losses(train_in_process(log_dir, "trainer.max_steps=2", *saving))) == 2
    train_in_process(log_dir, "trainer.max_steps=3", *saving, "exp_manager.resume_if_exists=True")
    assert [row["step"] for row in read_metrics(log_dir) if "loss" in row] == [1, 2, 3]


CHECKPOINTS = [
    "exp_manager.create_checkpoint_callback=True",
    "+exp_manager.checkpoint_callback_params.every_n_train_steps=1",
]


def _saved(log_dir) -> dict[str, int]:
    return {info.path.name: info.step for info in list_checkpoints(log_dir / "checkpoints") if info.complete}


def _run(log_dir, *overrides: str) -> list[float]:
    return losses(train_in_process(log_dir, *CHECKPOINTS, *overrides))


def test_a_roll_back_keeps_every_checkpoint_it_did_not_write(tmp_path):
    """Resuming from an earlier checkpoint of a run with save_top_k 1 once deleted that run's later
    checkpoints and the one resumed from: the roll-back is a new lineage, which weighs only its own."""
    log_dir = tmp_path / "run"
    _run(log_dir, "trainer.max_steps=4", "+exp_manager.checkpoint_callback_params.save_top_k=-1")
    first = _saved(log_dir)
    assert sorted(first.values()) == [1, 2, 3, 4]
    step_2 = next(name for name, step in first.items() if step == 2)
    _run(
        log_dir,
        "trainer.max_steps=4",
        "+exp_manager.checkpoint_callback_params.save_top_k=1",
        f"+exp_manager.resume_from_checkpoint={log_dir / 'checkpoints' / step_2}",
    )
    after = _saved(log_dir)
    assert first.items() <= after.items()  # every checkpoint of the first run, the one resumed from included
    assert sorted(step for name, step in after.items() if name not in first) == [4]  # its own best, by step


def test_a_fresh_run_in_a_folder_with_checkpoints_deletes_none_of_them(tmp_path):
    log_dir = tmp_path / "run"
    _run(log_dir, "trainer.max_steps=2", "+exp_manager.checkpoint_callback_params.save_top_k=-1")
    first = _saved(log_dir)
    _run(
        log_dir,
        "trainer.max_steps=3",
        "+exp_manager.checkpoint_callback_params.save_top_k=1",
        "+exp_manager.require_empty_log_dir=False",
    )  # written False: a new run there, beside what is there
    after = _saved(log_dir)
    assert first.items() <= after.items() and len(after) == len(first) + 1


def test_a_continued_run_keeps_its_top_k_and_the_checkpoint_it_resumed_from(tmp_path):
    log_dir, keep_one = tmp_path / "run", "+exp_manager.checkpoint_callback_params.save_top_k=1"
    _run(log_dir, "trainer.max_steps=2", keep_one)
    assert sorted(_saved(log_dir).values()) == [2]
    _run(log_dir, "trainer.max_steps=4", keep_one, "exp_manager.resume_if_exists=True")
    assert sorted(_saved(log_dir).values()) == [2, 4]  # step 2 was resumed from
    _run(log_dir, "trainer.max_steps=5", keep_one, "exp_manager.resume_if_exists=True")
    assert sorted(_saved(log_dir).values()) == [4, 5]  # the same run's older checkpoint goes


def test_both_resume_keys_follow_nemo_the_log_directorys_newest_checkpoint_wins(tmp_path):
    """resume_from_checkpoint with resume_if_exists once resumed from the former and then deleted the log
    directory's newer checkpoint."""
    log_dir = tmp_path / "run"
    whole = _run(log_dir, "trainer.max_steps=4", "+exp_manager.checkpoint_callback_params.save_top_k=-1")
    _run(tmp_path / "first", "trainer.max_steps=3", "+exp_manager.checkpoint_callback_params.save_top_k=-1")
    for name, step in _saved(log_dir).items():
        if step == 4:
            shutil.rmtree(log_dir / "checkpoints" / name)
    older = next(path for path, step in _saved(tmp_path / "first").items() if step == 1)
    with pytest.warns(
        ConfigNotice,
        match="exp_manager.resume_from_checkpoint: .* passed over: with resume_if_exists "
        "the log directory's newest checkpoint, .*step=3.*, is where the run continues",
    ):
        resumed = _run(
            log_dir,
            "trainer.max_steps=4",
            "+exp_manager.checkpoint_callback_params.save_top_k=1",
            "exp_manager.resume_if_exists=True",
            f"+exp_manager.resume_from_checkpoint={tmp_path / 'first' / 'checkpoints' / older}",
        )
    assert resumed == whole  # its metrics through step 3, then step 4 as the whole run computed it
    assert sorted(_saved(log_dir).values()) == [3, 4]


def test_a_ranking_by_loss_keeps_the_lowest_and_max_is_refused(tmp_path):
    """monitor: loss with NxDT's default mode max once kept the worst checkpoint and deleted the better
    ones; mode now follows the monitor unless given, and loss with max is refused."""
    log_dir = tmp_path / "run"
    trained = train_in_process(
        log_dir,
        *CHECKPOINTS,
        "trainer.max_steps=4",
        "+exp_manager.checkpoint_callback_params.monitor=loss",
        "+exp_manager.checkpoint_callback_params.save_top_k=1",
    )
    by_step = {row["step"]: row["loss"] for row in trained if "loss" in row}
    best = min(by_step, key=by_step.get)
    assert sorted(_saved(log_dir).values()) == sorted({best, 4})  # the lowest loss, and the last step
    with pytest.raises(ConfigError) as caught:
        load_config(
            default_config_path(),
            [
                "+exp_manager.checkpoint_callback_params.monitor=val_loss",
                "+exp_manager.checkpoint_callback_params.mode=max",
            ],
        )
    assert (
        "exp_manager.checkpoint_callback_params.mode: expected min (or null) with monitor 'val_loss': max keeps "
        "the 1 worst checkpoints and deletes the better ones, found max" in str(caught.value)
    )


def test_a_run_that_keeps_checkpoints_ends_with_one_of_its_last_step(tmp_path):
    log_dir = tmp_path / "run"
    train_in_process(
        log_dir,
        "exp_manager.create_checkpoint_callback=True",
        "trainer.max_steps=3",
        "+exp_manager.checkpoint_callback_params.every_n_train_steps=10",
    )
    assert sorted(_saved(log_dir).values()) == [3]


def test_export_onto_a_file_and_resume_from_a_folder_without_checkpoints_are_one_message(tmp_path, capsys):
    log_dir = tmp_path / "run"
    train_in_process(log_dir, "exp_manager.create_checkpoint_callback=True", "trainer.max_steps=1")
    (tmp_path / "file").write_text("mine")
    assert main(["ckpt", "export-hf", str(log_dir), str(tmp_path / "file")]) == 1
    assert main(["ckpt", "export-hf", str(log_dir), str(tmp_path / "file" / "hf")]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'file'}: expected a new or empty directory for the export, found a file" in err
    assert (
        f"{tmp_path / 'file' / 'hf'}: expected a folder path for the export, found a file at {tmp_path / 'file'}" in err
        and "Traceback" not in err
    )
    assert (tmp_path / "file").read_text() == "mine"
    train_in_process(tmp_path / "plain", "trainer.max_steps=1")  # a log directory of a run that saved nothing
    (tmp_path / "empty").mkdir()
    for folder, found in (
        (tmp_path / "empty", "an empty folder"),
        (tmp_path / "plain", "a log directory without a checkpoints folder"),
    ):
        message = "; ".join(_problems(f"+exp_manager.resume_from_checkpoint={folder}"))
        assert (
            f"exp_manager.resume_from_checkpoint: expected an nxd checkpoint (a folder with nxd-checkpoint.json), "
            f"a run's log directory with a checkpoints folder, a Hugging Face model directory or a GPT-NeoX "
            f"checkpoint, found {found} at {folder}"
            in message
            and "half written" not in message
        )


def test_preprocess_refuses_an_existing_prefix_and_cleans_what_a_killed_run_left(tmp_path, tokenizer_file, capsys):
    source = tmp_path / "docs.jsonl"
    source.write_text('{"text": "the quick brown fox"}\n{"text": "jumps over the lazy dog"}\n')
    command = [
        "data",
        "preprocess",
        "--input",
        str(source),
        "--output-prefix",
        str(tmp_path / "d"),
        "--tokenizer",
        str(tokenizer_file),
        "--no-progress",
    ]
    assert main(command) == 0
    written = {path.name: path.read_bytes() for path in tmp_path.glob("d_text_document.*")}
    other = tmp_path / "other.jsonl"
    other.write_text('{"text": "pack my box"}\n')
    command[3] = str(other)
    assert main(command) == 1
    assert (
        f"--output-prefix: {tmp_path / 'd_text_document.idx'}, {tmp_path / 'd_text_document.bin'} exist already "
        "(another data set, or an earlier run of this one); expected a new prefix, or --overwrite to replace them"
        in capsys.readouterr().err
    )
    assert {path.name: path.read_bytes() for path in tmp_path.glob("d_text_document.*")} == written
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid no process has now
    abandoned = tmp_path / f".d_text_document.bin.{socket.gethostname()}.{dead.pid}.x1y2"
    abandoned.write_bytes(b"half")
    live = tmp_path / f".d_text_document.bin.{socket.gethostname()}.{os.getpid()}.x3y4"  # a writer still running
    live.write_bytes(b"busy")
    assert main([*command, "--overwrite"]) == 0
    assert not abandoned.exists() and live.exists()
    assert {path.name: path.read_bytes() for path in tmp_path.glob("d_text_document.*")} != written


def test_a_folder_of_someone_elses_files_is_refused_naming_them(tmp_path, capsys):
    log_dir = tmp_path / "mine"
    log_dir.mkdir()
    (log_dir / "config.yaml").write_text("my: own\n")
    (log_dir / "metrics.csv").write_text("a,b\n1,2\n")
    (log_dir / "notes.txt").write_text("kept\n")
    assert main([*FAST, "trainer.max_steps=1", f"+exp_manager.explicit_log_dir={log_dir}"]) == 1
    err = capsys.readouterr().err
    assert (
        f"exp_manager.explicit_log_dir: {log_dir.resolve()} holds config.yaml, metrics.csv, which no nxd run wrote"
        in err
        and "Traceback" not in err
    )
    assert (log_dir / "config.yaml").read_text() == "my: own\n" and (
        log_dir / "metrics.csv"
    ).read_text() == "a,b\n1,2\n"
    assert sorted(path.name for path in log_dir.iterdir()) == ["config.yaml", "metrics.csv", "notes.txt"]


@pytest.mark.parametrize("planted", ["config.yaml", "nxd_log_globalrank-0_localrank-0.txt"])
def test_a_link_planted_in_a_log_directory_is_never_written_through(tmp_path, capsys, planted):
    log_dir, target = tmp_path / "run", tmp_path / "elsewhere.txt"
    train_in_process(log_dir, "trainer.max_steps=1")
    (log_dir / planted).unlink()
    (log_dir / planted).symlink_to(target)
    assert (
        main(
            [
                *FAST,
                "trainer.max_steps=1",
                f"+exp_manager.explicit_log_dir={log_dir}",
                "+exp_manager.require_empty_log_dir=False",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert f"{log_dir.resolve() / planted} is a symbolic link (to {target}); expected a file nxd wrote there" in err
    assert not target.exists() and "Traceback" not in err


def test_files_a_run_writes_follow_the_umask(tmp_path):
    previous = os.umask(0o022)
    try:
        log_dir = tmp_path / "run"
        train_in_process(log_dir, "trainer.max_steps=2", "exp_manager.create_checkpoint_callback=True")
        assert (log_dir / "config.yaml").stat().st_mode & 0o777 == 0o644
        (checkpoint,) = list_checkpoints(log_dir / "checkpoints")
        out = tmp_path / "hf"
        assert main(["ckpt", "export-hf", str(checkpoint.path), str(out)]) == 0
        assert out.stat().st_mode & 0o777 == 0o755
        assert all(file.stat().st_mode & 0o777 == 0o644 for file in out.iterdir())
    finally:
        os.umask(previous)


def test_a_new_run_into_an_earlier_runs_folder_is_refused_naming_the_changed_keys(tmp_path, capsys):
    """A run that does not resume what its explicit log directory holds would write over the earlier run's
    config.yaml and metrics.csv: refused before launch naming the folder and the keys that changed; resuming it,
    or require_empty_log_dir written False, starts."""
    log_dir = tmp_path / "run"
    train_in_process(log_dir, "trainer.max_steps=2")
    kept = {name: (log_dir / name).read_bytes() for name in ("config.yaml", "metrics.csv")}
    job = [
        str(default_config_path()),
        *FAST,
        "trainer.max_steps=3",
        "model.optim.lr=0.001",
        f"+exp_manager.explicit_log_dir={log_dir}",
    ]
    assert main(job) == 1
    err = capsys.readouterr().err
    assert (
        f"exp_manager.explicit_log_dir: {log_dir} holds an earlier run's config.yaml, metrics.csv (keys changed "
        "since: trainer.max_steps (2 there, 3 now); model.optim.lr (0.003 there, 0.001 now); "
        "model.optim.sched.max_steps (2 there, 3 now)); this run does not resume it"
    ) in err, err
    assert {name: (log_dir / name).read_bytes() for name in kept} == kept
    assert main(["plan", *job]) == 0  # a memory plan writes nothing there
    assert (
        main([str(default_config_path()), *FAST, "trainer.max_steps=2", f"+exp_manager.explicit_log_dir={log_dir}"])
        == 1
    )
    assert "holds an earlier run's config.yaml, metrics.csv (the same config)" in capsys.readouterr().err
    assert main([*job, "+exp_manager.require_empty_log_dir=False"]) == 0
    assert [row["step"] for row in read_metrics(log_dir) if "loss" in row] == [1, 2, 3]
