"""`nxd-train plot`: runs' metrics.csv drawn against the step, several runs overlaid; bad input in one line each."""

from __future__ import annotations

import errno
import sys
from pathlib import Path

import pytest
from nxd_train.cli import main
from nxd_train.logging import plot as plot_module
from nxd_train.logging.plot import Run, panels

PNG = b"\x89PNG\r\n\x1a\n"


def _run_dir(root: Path, name: str, text: str) -> Path:
    folder = root / name / "version_0"
    folder.mkdir(parents=True)
    (folder / "metrics.csv").write_text(text)
    return folder


PRETRAINING = (
    "consumed_samples,loss,lr,step,tokens_per_s,val_loss\n8,8.3,1e-4,1,900,\n16,7.9,2e-4,2,950,\n"
    "16,,,2,,8.0\n24,7.5,3e-4,3,940,\n"
)
DPO = "loss,lr,rewards/accuracies,rewards/margins,step\n0.69,1e-5,0.5,0.0,1\n0.6,1e-5,0.75,0.3,2\n"


def test_runs_are_overlaid_in_one_picture_and_differing_columns_are_said(tmp_path: Path, capsys) -> None:
    first, second = _run_dir(tmp_path, "pretrain", PRETRAINING), _run_dir(tmp_path, "dpo", DPO)
    out = tmp_path / "both.png"
    assert main(["plot", str(first), str(second), "-o", str(out)]) == 0
    assert out.read_bytes().startswith(PNG)
    said = capsys.readouterr()
    assert said.out.strip() == f"nxd-train plot: 2 run(s) drawn in {out}"
    assert said.err.splitlines() == [
        "nxd-train plot: pretrain/version_0: no rewards/accuracies, rewards/margins column(s); those panels show the "
        "other runs",
        "nxd-train plot: dpo/version_0: no tokens/s column(s); those panels show the other runs",
    ]


def test_panels_follow_the_columns_the_runs_have() -> None:
    pretraining = Run(
        "a", {"loss": ([1], [1.0]), "lr": ([1], [1e-3]), "tokens_per_s": ([1], [9.0]), "grad_norm": ([1], [0.5])}
    )
    assert [title for title, _ in panels([pretraining])] == ["loss", "learning rate", "tokens/s"]
    reward = Run("b", {"val_loss": ([1], [1.0]), "accuracy": ([1], [0.5]), "margin": ([1], [0.1])})
    assert panels([reward]) == [("loss", ("loss", "val_loss")), ("accuracy", ("accuracy",)), ("margin", ("margin",))]


def test_a_run_still_writing_its_last_line_is_drawn_from_its_complete_rows(tmp_path: Path, capsys) -> None:
    going = _run_dir(tmp_path, "going", PRETRAINING + "32,7.2,4e-4")  # the row being written, cut short
    out = tmp_path / "going.png"
    assert main(["plot", str(going), "-o", str(out)]) == 0
    assert out.read_bytes().startswith(PNG)
    assert capsys.readouterr().err.strip() == (
        f"nxd-train plot: {going / 'metrics.csv'}: line 6 incomplete or not numbers (a run still writing it?); left out"
    )


def test_a_last_line_cut_inside_its_last_value_is_left_out(tmp_path: Path, capsys) -> None:
    """The last line has every field but no newline yet: its last value may be cut short (step 12 read as 1)."""
    going = _run_dir(tmp_path, "going", DPO + "0.5,1e-5,0.75,0.4,1")
    out = tmp_path / "going.png"
    assert main(["plot", str(going), "-o", str(out)]) == 0
    assert "line 4 incomplete" in capsys.readouterr().err


@pytest.mark.parametrize(
    "case",
    [
        "no metrics.csv",
        "empty",
        "header only",
        "exists",
        "not png",
        "no matplotlib",
        "nothing to draw",
        "infinite step",
        "unwritable folder",
    ],
)
def test_bad_input_gets_one_line_and_exit_1(case: str, tmp_path: Path, capsys, monkeypatch) -> None:
    run = _run_dir(tmp_path, "run", PRETRAINING)
    out = tmp_path / "out.png"
    expected = {
        "no metrics.csv": f"{tmp_path / 'run'}: no metrics.csv; expected a run's log directory, such as "
        "nxd_logs/NAME/version_N (its runs: version_0)",
        "empty": f"{run / 'metrics.csv'}: no rows yet; left out\nnxd-train plot: no run has a complete row to draw",
        "header only": f"{run / 'metrics.csv'}: no complete row yet; left out\nnxd-train plot: no run has a complete "
        "row to draw",
        "exists": f"{out} exists; expected a new file name (-o FILE.png)",
        "not png": f"-o {tmp_path / 'out.pdf'}: expected a .png file",
        "no matplotlib": "needs matplotlib; install it with pip install 'nxd-train[plot]'",
        "nothing to draw": "no column to draw; expected loss, val_loss, lr, tokens_per_s or a reward, accuracy or "
        "margin column, found grad_norm",
        "infinite step": f"{run / 'metrics.csv'}: line 2 incomplete or not numbers (a run still writing it?); left "
        "out\nnxd-train plot: no run has a complete row to draw",
        "unwritable folder": f"{tmp_path / 'locked' / 'out.png'}: cannot be written (Permission denied)",
    }[case]
    target = run
    if case == "no metrics.csv":
        target = tmp_path / "run"
    elif case == "empty":
        (run / "metrics.csv").write_text("")
    elif case == "header only":
        (run / "metrics.csv").write_text("loss,step\n")
    elif case == "exists":
        out.write_bytes(b"someone's picture")
    elif case == "not png":
        out = tmp_path / "out.pdf"
    elif case == "nothing to draw":
        (run / "metrics.csv").write_text("grad_norm,step\n0.5,1\n")
    elif case == "infinite step":
        (run / "metrics.csv").write_text("loss,step\n1.0,inf\n")
    elif case == "unwritable folder":  # what a folder without write permission answers (this test may run as root)
        (tmp_path / "locked").mkdir()
        out = tmp_path / "locked" / "out.png"

        def refuse(source, target) -> None:
            raise PermissionError(errno.EACCES, "Permission denied", str(target))

        monkeypatch.setattr(plot_module.os, "link", refuse)
    else:
        monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["plot", str(target), "-o", str(out)]) == 1
    assert capsys.readouterr().err.strip() == f"nxd-train plot: {expected}"
    if case == "exists":
        assert out.read_bytes() == b"someone's picture"
