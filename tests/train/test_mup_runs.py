"""muP runs (model.mup): the base-shape file written without training, an exact resume with muP's optimizer groups,
and the coordinate check's files."""

from __future__ import annotations

import csv

import mup
from nxd_train.cli import default_config_path, main

from tests.train.test_checkpointing import SAVE, checkpoints


def test_mup_base_shapes_are_written_without_training_and_a_mup_run_resumes_exactly(tmp_path, train_here, capsys):
    """save_base_shapes writes mup's file (here of the model at half its width) and trains nothing; a run with muP's
    groups (each with its own learning rate and weight decay) resumes to the uninterrupted losses and logs the
    schedule's learning rate."""
    base, unused = tmp_path / "base.bsh", tmp_path / "unused"
    assert (
        main(
            [
                str(default_config_path()),
                "model.hidden_size=32",
                f"+model.mup.base_shapes_file={base}",
                "+model.mup.save_base_shapes=true",
                f"+exp_manager.explicit_log_dir={unused}",
            ]
        )
        == 0
    )
    assert f"muP base shapes written to {base}" in capsys.readouterr().out and not unused.exists()
    assert mup.load_base_shapes(str(base))["model.layers.0.self_attn.q_proj.weight"].base_shape() == [32, 32]
    other = tmp_path / "other.bsh"  # a model of three layers
    assert (
        main(
            [
                str(default_config_path()),
                "model.num_layers=3",
                f"+model.mup.base_shapes_file={other}",
                "+model.mup.save_base_shapes=true",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                str(default_config_path()),
                f"+model.mup.base_shapes_file={other}",
                f"+exp_manager.explicit_log_dir={unused}",
            ]
        )
        == 1
    )
    assert (
        "model.mup.base_shapes_file: expected the base shapes of this model's parameters; not in the model: "
        "model.layers.2."
        in capsys.readouterr().err
        and not unused.exists()
    )
    job = ["trainer.max_steps=4", *SAVE, "+exp_manager.checkpoint_callback_params.every_n_train_steps=2"]
    muP = [f"+model.mup.base_shapes_file={base}", "+model.mup.attention_temperature=2.0"]
    plain = train_here(*job)
    whole = train_here(*job, *muP)
    resumed = train_here(*job, *muP, f"+exp_manager.resume_from_checkpoint={checkpoints(tmp_path / 'run1')[2]}")
    assert [row["loss"] for row in resumed] == [row["loss"] for row in whole[2:]]
    assert [row["loss"] for row in whole] != [row["loss"] for row in plain]
    assert [row["lr"] for row in whole] == [row["lr"] for row in plain]


def test_coord_check_writes_mups_records_and_plots_without_training(tmp_path, monkeypatch, capsys):
    """GPT-NeoX's coord_check: the check's records and plots for muP and the standard parametrisation in the working
    directory, at the widths asked; nothing trains, and a second run refuses to write over them."""
    base = tmp_path / "base.bsh"
    assert (
        main([str(default_config_path()), f"+model.mup.base_shapes_file={base}", "+model.mup.save_base_shapes=true"])
        == 0
    )
    monkeypatch.chdir(tmp_path)
    check = [
        str(default_config_path()),
        f"+model.mup.base_shapes_file={base}",
        "+model.mup.coord_check=true",
        "+model.mup.coord_check_widths=[32,64,128]",
        f"+exp_manager.explicit_log_dir={tmp_path / 'unused'}",
    ]
    assert main(check) == 0
    assert "muP coordinate check written to" in capsys.readouterr().out and not (tmp_path / "unused").exists()
    for label in ("up", "sp"):
        rows = list(csv.DictReader((tmp_path / f"coord_check_{label}.csv").open()))
        assert {int(row["width"]) for row in rows} == {32, 64, 128} and {row["t"] for row in rows} == {
            "1",
            "2",
            "3",
            "4",
        }
        assert (tmp_path / f"coord_check_{label}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    up = {
        (row["width"], row["module"], row["t"]): float(row["l1"])
        for row in csv.DictReader((tmp_path / "coord_check_up.csv").open())
    }
    sp = {
        (row["width"], row["module"], row["t"]): float(row["l1"])
        for row in csv.DictReader((tmp_path / "coord_check_sp.csv").open())
    }
    # the first MLP's output after three updates: muP keeps its size across widths, the standard parametrisation's grows
    key = "model.layers.0.mlp.down_proj"
    assert up[("128", key, "4")] / up[("32", key, "4")] < 2 < sp[("128", key, "4")] / sp[("32", key, "4")]
    assert main(check) == 1
    assert "coord_check_up.csv, " in (err := capsys.readouterr().err) and "already there; expected none" in err
