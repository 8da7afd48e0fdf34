"""GPT-NeoX's four post-training configs (post-training/configs/llama3-8b-{sft,dpo,kto,rm}.yml, shrunk in
tests/train/neox_post) train as written, in two gloo processes (tensor parallel 2), on data this test
writes as NeoX's preprocess_data_with_chat_template.py does, fine-tuning (`finetune` from `load`) the
small Llama it saves where the configs' `load` points. NeoX's precomputed reference files replace the
reference model; bad post-training files and settings get one message naming the key."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from nxd_data import IndexedDataset, IndexedDatasetWriter
from nxd_train.cli import main

from tests.neox_post_training import converted_model, write_neox_reference, write_post_training_data
from tests.training_runs import losses, read_metrics, run_command

CONFIGS = Path(__file__).parent / "neox_post"
DEFAULT = ("dpo",)
"""Configs trained in the default suite; sft and rm, NeoX's reference files (whose reading the data tests
check) and the data errors found once training has started run with --runslow."""


@pytest.fixture(scope="module")
def neox_root(tmp_path_factory, chat_tokenizer_dir) -> Path:
    """A folder laid out as the configs expect: data/{sft,pairwise,kto}/... and the converted model."""
    root = tmp_path_factory.mktemp("neox_post")
    write_post_training_data(root, chat_tokenizer_dir)
    converted_model(root, chat_tokenizer_dir)
    return root


def _run(root: Path, name: str, *overrides: str) -> list[dict]:
    result = run_command(str(CONFIGS / f"{name}.yml"), "num_gpus=2", *overrides, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    save = next(
        (o.split("=", 1)[1] for o in overrides if o.startswith("save=")),
        f"checkpoints/{name}/llama3/llama3-8b-instruct",
    )
    rows = read_metrics(root / save)
    rows[0]["log"] = result.stdout + result.stderr
    return rows


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=() if name in DEFAULT else pytest.mark.slow) for name in ("sft", "dpo", "kto", "rm")],
)
def test_neox_post_training_configs_train_as_written(neox_root, name):
    rows = _run(neox_root, name)
    found = losses(rows)
    assert len(found) == 3 and all(math.isfinite(loss) for loss in found), found
    assert any("val_loss" in row for row in rows) and any("test_loss" in row for row in rows)
    log = rows[0]["log"]
    assert f"initial weights from {neox_root}/checkpoints/neox_converted/llama3-8b-instruct" in log
    trained = [row for row in rows if "loss" in row]
    if name == "dpo":  # policy == reference at step 1 (the reference log-probs come from the loaded weights)
        assert found[0] == pytest.approx(math.log(2), abs=1e-6)
        assert "reference log-probs of 48 train samples, 48 validation samples, 48 test samples computed" in log
    elif name == "kto":  # 1 - sigmoid(0) for every example, a zero KL from either half
        assert found[0] == pytest.approx(0.5, abs=1e-6) and trained[0]["kl"] == pytest.approx(0.0, abs=1e-6)
        assert "48 KTO examples, 24 desirable, 24 undesirable" in log
    elif name == "rm":
        assert 0.0 <= trained[0]["accuracy"] <= 1.0 and "margin" in trained[0]
        assert "reward_model" in log
    else:
        assert found[0] == pytest.approx(math.log(320), abs=1.0)  # a random model over the 320-token vocabulary


def _reference_files(root: Path, prefixes: list[str], name: str, value: float) -> None:
    """NeoX's precompute output `{prefix}_{name}` (NeoX's float32 code, seq_length values a document,
    the count rounded up past the data's), here `value` everywhere."""
    for prefix in prefixes:
        documents = len(IndexedDataset(root / prefix))
        write_neox_reference(root / f"{prefix}_{name}", [[value] * 64], 64, documents + 8)


@pytest.mark.slow
def test_neox_precomputed_reference_files_replace_the_reference_model(neox_root, tmp_path):
    """precompute_model_name: every pos/neg prefix's `{prefix}_{name}` file, as NeoX's precompute writes
    it, gives the reference; with 0 everywhere the reference is 0, so DPO's chosen reward is beta times
    the policy's log-prob, and no reference pass runs."""
    prefixes = [
        f"data/pairwise/llama3_dpo_{split}_{side}_document"
        for split in ("train", "val")
        for side in ("chosen", "rejected")
    ]
    _reference_files(neox_root, prefixes, "zero", 0.0)
    save = str(tmp_path / "dpo_zero")
    rows = _run(neox_root, "dpo", "+precompute_model_name=zero", f"save={save}")
    first = next(row for row in rows if "loss" in row)
    assert "reference log-probs of" not in rows[0]["log"]
    assert first["rewards/chosen"] == pytest.approx(0.01 * first["logps/chosen"], rel=1e-6)  # dpo_beta 0.01
    assert first["rewards/rejected"] == pytest.approx(0.01 * first["logps/rejected"], rel=1e-6)


@pytest.mark.slow  # the default suite checks the bf16 sum itself (tests/precision) and the translation
def test_dpo_with_bf16_gradient_accumulation_trains_as_neoxs_benchmarking_files_ask(neox_root, tmp_path):
    """post-training/configs/benchmarking/mistral-dpo.yml and llama-13b-dpo.yml accumulate gradients in bf16
    (data_types.grad_accum_dtype bf16, fp32_allreduce false): the same DPO run trains, from ln 2."""
    save = str(tmp_path / "dpo_bf16_sum")
    rows = _run(
        neox_root,
        "dpo",
        "data_types.grad_accum_dtype=bf16",
        "fp32_allreduce=false",
        "gradient_accumulation_steps=4",
        f"save={save}",
    )
    found = losses(rows)
    assert len(found) == 3 and all(math.isfinite(loss) for loss in found)
    assert found[0] == pytest.approx(math.log(2), abs=1e-6)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train_impl=reinforce"], "pos_train_data_paths: expected none with train_impl reinforce"),
        pytest.param(
            ["+precompute_model_name=missing"], "data.pair_documents.train: data prefix ", marks=pytest.mark.slow
        ),
        pytest.param(["pack_impl=packed"], "expected unpacked with data.pair_documents", marks=pytest.mark.slow),
        pytest.param(
            ["dataset_impl=gpt2"], "dataset_impl: expected pairwise with train_impl dpo", marks=pytest.mark.slow
        ),
    ],
)
def test_bad_post_training_settings_get_one_message(neox_root, overrides, message, monkeypatch, capsys):
    """Refused before any process starts: the command's code, in this process."""
    monkeypatch.chdir(neox_root)
    assert main([str(CONFIGS / "dpo.yml"), "num_gpus=2", *overrides]) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err[-2000:]


@pytest.mark.slow
def test_kto_reward_documents_that_do_not_line_up_are_named(neox_root, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(neox_root / "data", root / "data")
    shutil.copytree(neox_root / "checkpoints" / "neox_converted", root / "checkpoints" / "neox_converted")
    rewards = root / "data" / "kto" / "llama3_train_messages_reward_document"
    with IndexedDatasetWriter(rewards, np.int32) as writer:
        for _ in range(5):
            writer.add_document(np.array([1], dtype=np.int32))
    result = run_command(str(CONFIGS / "kto.yml"), "num_gpus=2", cwd=root)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert (
        "data.example_documents.train.rewards: data/kto/llama3_train_messages_reward_document: expected one "
        "reward document per document of data/kto/llama3_train_messages_document (48), found 5"
    ) in result.stderr


def test_neox_reinforce_trains_on_two_processes_once_its_translation_names_rewards(neox_root, tmp_path):
    """post-training/configs/llama3-8b-reinforce.yml (shrunk): nxd samples the completions itself (no data server),
    its prompts the label documents' unlabelled starts. A NeoX file cannot name rewards (NeoX's server scored the
    completions), so run as written it is refused by that key; its translation takes them, and trains."""
    config = str(CONFIGS / "reinforce.yml")
    refused = run_command(config, "num_gpus=2", cwd=neox_root)
    assert refused.returncode != 0 and "model_alignment_strategy.grpo.rewards: expected at least one reward" in (
        refused.stderr
    )
    translated = run_command("config", "translate", config, "num_gpus=2", cwd=neox_root)
    assert translated.returncode == 0, translated.stderr[-3000:]
    nxd_file = tmp_path / "reinforce.yaml"
    nxd_file.write_text(translated.stdout)
    save = neox_root / "checkpoints" / "reinforce" / "llama3" / "llama3-8b-instruct"
    shutil.rmtree(save, ignore_errors=True)
    result = run_command(
        str(nxd_file),
        "+model_alignment_strategy.grpo.rewards=[{builtin: regex, pattern: '[a-z]', name: words}]",
        "+model_alignment_strategy.grpo.num_generations=4",
        "model_alignment_strategy.grpo.max_new_tokens=16",  # half of seq_length, 64, leaves too little for the chats
        cwd=neox_root,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    rows = [row for row in read_metrics(save) if "loss" in row]
    assert len(rows) == 3 and all(math.isfinite(row["loss"]) and 0 <= row["rewards/words/mean"] <= 1 for row in rows)
    assert all("kl" in row for row in rows)  # kl_div_beta 0.1 against the loaded weights (kl_impl abs)
    assert "initial weights from" in result.stdout + result.stderr
