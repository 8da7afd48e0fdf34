"""What a run shows on a console: each logged step as a line that stays on screen, under a live progress bar on
a terminal with a size; the lines alone on a pseudo-terminal without one (`script -qfc`, schedulers' wrappers)
or a pipe; an ETA from the steps this process ran."""

import fcntl
import os
import pty
import struct
import termios
from pathlib import Path

import pytest
from nxd_train.logging import monitor as monitor_module
from nxd_train.logging.monitor import Monitor


def _terminal(columns: int) -> tuple[int, int]:
    """A pseudo-terminal (master, slave) whose size is `columns` x 24, or no size at all for 0."""
    master, slave = pty.openpty()
    if columns:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    return master, slave


def _drain(master: int) -> str:
    os.set_blocking(master, False)
    out = b""
    try:
        while chunk := os.read(master, 65536):
            out += chunk
    except (BlockingIOError, OSError):
        pass
    return out.decode(errors="replace")


def _log(tmp_path: Path, monkeypatch, columns: int, capsys) -> tuple[str, str, Monitor]:
    master, slave = _terminal(columns)
    with open(slave, "w", closefd=True) as terminal:
        monkeypatch.setattr(monitor_module.sys, "stderr", terminal)
        monitor = Monitor(
            tmp_path, global_rank=0, local_rank=0, total_steps=4, local_rank_0_only=True, tensorboard=False
        )
        monitor.begin(0)
        for step in (1, 2, 3, 4):
            monitor.advance()
            if step % 2 == 0:
                monitor.metrics(step, {"loss": 10.0 - step, "lr": 1e-3})
        monitor.close()
        terminal.flush()
        drawn = _drain(master)
    os.close(master)
    return drawn, capsys.readouterr().out, monitor


def test_a_terminal_with_a_size_keeps_every_logged_line_above_the_bar(tmp_path, monkeypatch, capsys) -> None:
    drawn, lines, _ = _log(tmp_path, monkeypatch, 100, capsys)
    assert "step 2/4 | loss 8.0000 | lr 1.00e-03" in lines and "step 4/4 | loss 6.0000 | lr 1.00e-03" in lines
    assert "train: 100%" in drawn and "4/4" in drawn and "loss 6.0000" in drawn  # the live bar, latest loss


def test_a_terminal_without_a_size_gets_the_lines_and_no_bar(tmp_path, monkeypatch, capsys) -> None:
    drawn, lines, monitor = _log(tmp_path, monkeypatch, 0, capsys)
    assert monitor.bar is None and "train:" not in drawn
    assert [line.split(" | eta")[0] for line in lines.splitlines()] == [
        "step 2/4 | loss 8.0000 | lr 1.00e-03",
        "step 4/4 | loss 6.0000 | lr 1.00e-03",
    ]


def test_the_eta_counts_only_the_steps_this_process_ran(tmp_path, monkeypatch, capsys) -> None:
    """Resumed at step 90 of 100: 5 steps in 10 s leave 5 steps, 10 s (not 5 / 95 of the elapsed time)."""
    clock = iter([0.0, 100.0, 110.0])
    monkeypatch.setattr(monitor_module.time, "perf_counter", lambda: next(clock))
    monitor = Monitor(tmp_path, global_rank=0, local_rank=0, total_steps=100, local_rank_0_only=True, tensorboard=False)
    monitor.begin(90)
    monitor.metrics(95, {"loss": 1.0})
    monitor.close()
    assert capsys.readouterr().out.strip().endswith("| eta 0:00:10")


@pytest.mark.parametrize("columns", [0, 80])
def test_the_terminal_width_is_read_from_stderr(monkeypatch, columns) -> None:
    master, slave = _terminal(columns)
    with open(slave, "w") as terminal:
        monkeypatch.setattr(monitor_module.sys, "stderr", terminal)
        assert monitor_module._terminal_width() == columns
    os.close(master)
