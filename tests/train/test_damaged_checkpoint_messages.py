"""A run whose checkpoints are all damaged or half written: generate, eval's loader, a resume and ckpt export-hf
each name the checkpoint and what is wrong with it (as ckpt verify does), in one nxd line, never a Python warning;
with an older usable checkpoint, export-hf says which newer one it passed over and exports the older."""

from __future__ import annotations

import shutil

from nxd_train.cli import default_config_path, main

from tests.train.test_generate import _train


def test_each_command_names_the_damaged_checkpoint(tmp_path, capsys):
    log_dir = tmp_path / "run"
    _train(
        log_dir,
        "trainer.max_steps=2",
        "+exp_manager.checkpoint_callback_params.every_n_train_steps=1",
        "+exp_manager.checkpoint_callback_params.save_top_k=-1",
    )
    first, second = sorted((log_dir / "checkpoints").iterdir(), key=lambda p: "step=2" in p.name)
    shard = next(second.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated
    capsys.readouterr()
    assert main(["ckpt", "export-hf", str(log_dir), str(tmp_path / "hf")]) == 0
    err = capsys.readouterr().err
    assert f"notice: skipping a checkpoint: {second}: damaged checkpoint: {shard} is" in err
    assert f"using {first.name}" in err and "CheckpointWarning" not in err and "warnings.warn" not in err
    config, where = str(default_config_path()), f"+exp_manager.explicit_log_dir={log_dir}"
    assert main(["generate", config, where, f"+generate.sample_output_file={tmp_path / 'o.jsonl'}"]) == 0
    assert f"notice: skipping a checkpoint: {second}: damaged checkpoint: {shard} is" in capsys.readouterr().err
    shutil.rmtree(first)
    for command, expected in (
        (["generate", config, where, "+generate.sample_output_file=null"], "no usable checkpoint to load under"),
        (
            [config, where, "exp_manager.resume_if_exists=True", "trainer.max_steps=3"],
            "exp_manager.resume_if_exists: expected a complete, undamaged checkpoint in",
        ),
        (
            [config, f"{where}2", f"+exp_manager.resume_from_checkpoint={log_dir}", "trainer.max_steps=3"],
            f"exp_manager.resume_from_checkpoint: {log_dir} is a run directory whose checkpoints folder holds none "
            "usable",
        ),
        (
            ["ckpt", "export-hf", str(log_dir), str(tmp_path / "hf2")],
            "expected a checkpoint or a log directory holding one, found none usable",
        ),
    ):
        assert main(command) == 1, command
        err = capsys.readouterr().err
        assert expected in err and f"{second}: damaged checkpoint: {shard} is" in err, err
        assert "Traceback" not in err and "Warning:" not in err, err
