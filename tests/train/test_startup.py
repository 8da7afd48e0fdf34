"""What each command loads and prints as it starts. Every command runs in a fresh interpreter on the tiny config and
records `sys.modules` as it leaves: a library only some runs need (peft, bitsandbytes, transformers' model classes,
datasets, lm-eval, comet_ml, boto3, wandb, torchao, mamba_ssm, Lightning Fabric) is imported only by the run that
uses it, and the commands that launch no process (config, plan, launch, ckpt, data) never load Lightning Fabric, nor
DTensor and torch.distributed.checkpoint (which import sympy) to read a config or a checkpoint's marker.
Every line a command writes is nxd's: with the optional extras installed (this environment has bitsandbytes,
torchao and lm-eval), nothing they say while importing reaches the user."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from nxd_train.cli import default_config_path

from tests.training_runs import FAST, hf_run_config

OPTIONAL = (
    "peft",
    "bitsandbytes",
    "transformers.modeling_utils",
    "datasets",
    "pyarrow",
    "lm_eval",
    "comet_ml",
    "boto3",
    "wandb",
    "torchao",
    "mamba_ssm",
    "lightning_fabric",
    "matplotlib",
)
"""Modules a run loads only when it uses them."""
DRIVER = """
import json, os, sys
def record():
    init = sys.modules.get("transformers.initialization")
    intact = init is None or all(getattr(sys.modules["torch.nn.init"], name) is function
                                 for name, function in init.TORCH_INIT_FUNCTIONS.items())
    with open(os.environ["NXD_MODULES"], "w") as out:
        json.dump(sorted(sys.modules) + ([] if intact else ["torch.nn.init replaced"]), out)
leave = os._exit
def recorded_exit(code):
    record()
    leave(code)
os._exit = recorded_exit
sys.argv = ["nxd-train", *sys.argv[1:]]
from nxd_train.command import main
try:
    code = main()
finally:
    record()
sys.exit(code)
"""
"""The nxd-train command, writing the names of the modules it loaded to $NXD_MODULES as it leaves (also through
the `os._exit` a multi-process run ends with), and "torch.nn.init replaced" if torch's init functions are not the
ones transformers keeps to restore (a meta build stands in for them while it runs)."""


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    record = tmp_path / f"modules-{len(list(tmp_path.glob('modules-*')))}.json"
    environment = {**os.environ, "NXD_MODULES": str(record), "PYTHONUNBUFFERED": "1"}
    environment.pop("PYTHONWARNINGS", None)
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=environment,
        timeout=600,
    )
    return done, set(json.loads(record.read_text()))


def _loaded(modules: set[str]) -> set[str]:
    return {name for name in OPTIONAL if name in modules}


SHARDING = ("torch.distributed.tensor", "torch.distributed.checkpoint", "sympy")
"""What sharding a model or reading a DCP checkpoint needs, and a command reading a config does not."""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess, set[str]]:
    """The default job for one step, with a checkpoint: its log directory, the command's result and its modules."""
    work = tmp_path_factory.mktemp("startup")
    log_dir = work / "run"
    done, modules = _run(
        work,
        *FAST,
        "trainer.max_steps=1",
        "exp_manager.create_checkpoint_callback=True",
        f"+exp_manager.explicit_log_dir={log_dir}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return log_dir, done, modules


def test_training_loads_only_lightning_fabric_of_the_optional_modules_and_says_nothing_it_did_not_write(
    trained,
) -> None:
    _, done, modules = trained
    assert _loaded(modules) == {"lightning_fabric"}
    assert done.stderr == ""
    assert done.stdout.startswith("nxd-train: tiny_llama: ") and "step 1/1 | loss" in done.stdout


TINY = str(default_config_path())
COMMANDS = {
    "config check": ["config", "check", TINY],
    "config show": ["config", "show", TINY],
    "config translate": ["config", "translate", TINY],
    "config keys": ["config", "keys", "trainer"],
    "plan": ["plan", TINY, "--device-memory", "8"],
    "launch": ["launch", TINY, "+trainer.cluster.partition=gpu"],
}
"""Commands that read a config and launch nothing: none of the optional modules, and those that need no model none
of torch either."""


@pytest.mark.parametrize("name", COMMANDS)
def test_commands_that_launch_nothing_load_none_of_the_optional_modules(name: str, tmp_path: Path) -> None:
    done, modules = _run(tmp_path, *COMMANDS[name])
    assert done.returncode == 0, done.stderr[-3000:]
    assert _loaded(modules) == set() and not set(SHARDING) & modules
    assert done.stderr == ""
    if name.startswith(("config show", "config translate", "config keys")):
        assert "torch" not in modules


def test_checkpoint_and_data_commands_load_none_of_the_optional_modules(
    trained, tokenizer_file, tmp_path: Path
) -> None:
    log_dir, _, _ = trained
    listed, modules = _run(tmp_path, "ckpt", "list", str(log_dir))
    assert listed.returncode == 0 and "STEP" in listed.stdout, listed.stderr
    assert _loaded(modules) == set() and not set(SHARDING) & modules and listed.stderr == ""
    (tmp_path / "docs.jsonl").write_text('{"text": "the quick brown fox"}\n{"text": "jumps over the lazy dog"}\n')
    preprocessed, modules = _run(
        tmp_path,
        "data",
        "preprocess",
        "--input",
        "docs.jsonl",
        "--output-prefix",
        "corpus",
        "--tokenizer",
        str(tokenizer_file),
    )
    assert preprocessed.returncode == 0, preprocessed.stderr
    assert _loaded(modules) == set()
    assert (tmp_path / "corpus_text_document.idx").exists()


def test_generation_loads_lightning_fabric_alone(trained, tmp_path: Path) -> None:
    log_dir, _, _ = trained
    done, modules = _run(
        tmp_path,
        "generate",
        TINY,
        *FAST,
        f"+exp_manager.explicit_log_dir={log_dir}",
        "+generate.maximum_tokens=4",
        f"+generate.sample_output_file={tmp_path / 'out.jsonl'}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert _loaded(modules) == {"lightning_fabric"}
    said = done.stderr.splitlines()  # generate's own account goes to stderr, leaving stdout to the completions
    assert len(said) == 2 and said[0].startswith("weights from ") and said[1].startswith("nxd-train generate: 1 ")


def test_plot_loads_matplotlib_and_not_torch(trained, tmp_path: Path) -> None:
    log_dir, _, _ = trained
    done, modules = _run(tmp_path, "plot", str(log_dir), "-o", str(tmp_path / "run.png"))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "matplotlib" in modules and "torch" not in modules and _loaded(modules) == {"matplotlib"}


def test_the_extras_a_run_uses_load_quietly(tmp_path: Path) -> None:
    """A Hugging Face model with LoRA adapters and bitsandbytes' 8-bit Adam: transformers' model classes (which
    import torchao here), peft and bitsandbytes load, and none of their import notices is shown. The first
    Hugging Face build of the process leaves torch.nn.init as transformers found it at import."""
    source = hf_run_config(tmp_path, vocab_size=4096)
    done, modules = _run(
        tmp_path,
        str(source),
        "trainer.max_steps=1",
        "model.optim.name=adam8bit",
        "+model_alignment_strategy.peft.lora_rank=4",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert {"transformers.modeling_utils", "peft", "bitsandbytes", "lightning_fabric"} <= _loaded(modules)
    assert "datasets" not in modules and "lm_eval" not in modules and "torch.nn.init replaced" not in modules
    assert done.stderr == ""
