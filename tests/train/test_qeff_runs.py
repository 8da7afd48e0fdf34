"""QEfficient fine-tuning files trained by nxd-train on a tiny local model and local dataset folders laid out
like the hub repositories they name: the reference's dataset examples and QEfficient's own example files
run, and the adapters they leave load in peft; the loss covers exactly the completion and EOS (transformers'
own loss with the labels masked by hand); schedules, early stopping and resume match values worked by hand."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from nxd_train.cli import main
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.qeff_fixtures import EXAMPLES, REFERENCE_EXAMPLES, hub_datasets, local_config, tiny_model
from tests.training_runs import read_metrics

TRAINING = {
    "torch_dtype": "fp32",
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 1,
    "num_train_epochs": 1,
    "logging_steps": 1,
}
MODEL = {
    "use_peft": True,
    "peft_config": {
        "lora_r": 4,
        "lora_alpha": 8,
        "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj", "o_proj", "down_proj"],
    },
}
OPTIMIZER = {"optimizer_name": "adamw", "lr": 1e-2}
SCHEDULER = {"scheduler_name": "constant", "warmup_steps": 0, "warmup_ratio": 0.0}


@pytest.fixture(scope="module")
def place(tmp_path_factory, chat_tokenizer_dir) -> Path:
    """A working folder holding the tiny model and the dataset folders (and the grammar one under the name the
    reference gives it)."""
    root = tmp_path_factory.mktemp("qeff")
    tiny_model(root / "tiny", chat_tokenizer_dir)
    hub_datasets(root / "hub")
    return root


@pytest.fixture
def inside(place, monkeypatch) -> Path:
    monkeypatch.chdir(place)
    return place


def _datasets(place: Path) -> dict[str, Path]:
    names = {
        "yahma/alpaca-cleaned": "alpaca-cleaned",
        "knkarthick/samsum": "samsum",
        "openai/gsm8k": "gsm8k",
        "grammar": "grammar",
        "hallisky/DiSC": "DiSC",
        "Salesforce/wikitext": "wikitext",
    }
    return {name: place / "hub" / folder for name, folder in names.items()}


def _write(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _config(place: Path, out: Path, dataset: dict, **sections: dict) -> dict:
    config = {
        "model": {"model_name": str(place / "tiny"), **MODEL},
        "dataset": {"max_seq_length": 128, **dataset},
        "training": {"output_dir": str(out), **TRAINING},
        "optimizers": dict(OPTIMIZER),
        "scheduler": dict(SCHEDULER),
    }
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    return config


@torch.no_grad()
def _adapter_moves_logits(base: Path, adapter: Path) -> None:
    from peft import PeftModel

    ids = torch.tensor([[1, 40, 41, 42, 43, 44, 45]])
    model = AutoModelForCausalLM.from_pretrained(base)
    before = model(ids).logits
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)(ids).logits
    assert before.shape == adapted.shape and (before - adapted).abs().max() > 1e-7


REFERENCE = yaml.safe_load(REFERENCE_EXAMPLES.read_text())


@pytest.mark.parametrize("example", ["samsum", "alpaca", "gsm8k", "grammar"])
def test_the_references_dataset_examples_train_and_leave_an_adapter_peft_loads(inside, example):
    dataset = dict(REFERENCE[example])
    dataset["tokenizer_name"] = str(inside / "tiny")
    if dataset["dataset_name"] != "grammar":  # the reference's grammar example names a folder here
        dataset["dataset_name"] = str(_datasets(inside)[dataset["dataset_name"]])
    else:
        shutil.copytree(_datasets(inside)["grammar"], inside / "grammar", dirs_exist_ok=True)
    out = inside / f"out-{example}"
    assert main([str(_write(inside / f"{example}.yaml", _config(inside, out, dataset)))]) == 0
    assert (out / "adapter_model.safetensors").is_file() and list(out.glob("checkpoint-*/trainer_state.json"))
    _adapter_moves_logits(inside / "tiny", out)


QEFF_EXAMPLES = [
    "sft_single_device_gsm8k_config.yaml",
    "sft_single_device_alpaca_config.yaml",
    "sft_single_device_custom_dataset_config.yaml",
    "sft_ddp_config.yaml",
    "example_config.yaml",
    pytest.param("test_config.yaml", marks=pytest.mark.slow),
]  # torch_compile: 35 s here


TEMPLATES = {"test_config.yaml": {"prompt_template": "{dialogue}"}}
"""QEfficient's tests/test_config.yaml names no text for its seq_completion records: QEfficient's
SeqCompletionDataset stops on it too ("Either provide input_template or input_func"), as nxd does."""


@pytest.mark.parametrize("name", QEFF_EXAMPLES)
def test_qefficients_example_files_train_as_written(inside, name):
    """Only the model, the dataset and the output folder are pointed here; the rest is as QEfficient wrote it
    (fp16, 100 warmup steps, early stopping, test_config.yaml's keys QEfficient ignores ...)."""
    out = inside / f"out-{name}"
    config = local_config(
        EXAMPLES / name,
        inside / name,
        inside / "tiny",
        _datasets(inside),
        out,
        dataset={"max_seq_length": 128, **TEMPLATES.get(name, {})},
    )
    assert main([str(config), "--max_steps", "6"]) == 0
    assert (out / "adapter_model.safetensors").is_file()
    _adapter_moves_logits(inside / "tiny", out)


def test_the_loss_covers_the_completion_and_eos_as_transformers_computes_it(inside):
    """Step 1's loss (LoRA's B starts at 0, so the model is the base) equals transformers' loss on BOS + prompt
    + completion + EOS with the labels of BOS and the prompt masked by hand."""
    template = "Summarize:\n{dialogue}\nSummary:\n"
    dataset = {
        "dataset_name": str(_datasets(inside)["knkarthick/samsum"]),
        "prompt_template": template,
        "completion_template": "{summary}",
        "data_seed": None,
        "dataset_num_samples": 2,
    }
    out = inside / "out-loss"
    assert main([str(_write(inside / "loss.yaml", _config(inside, out, dataset, training={"max_steps": 1})))]) == 0
    nxd_loss = read_metrics(out)[0]["loss"]

    tokenizer = AutoTokenizer.from_pretrained(inside / "tiny")
    rows = [
        yaml.safe_load(line)
        for line in (_datasets(inside)["knkarthick/samsum"] / "train.jsonl").read_text().splitlines()[:2]
    ]
    sequences, labels = [], []
    for row in rows:
        prompt = tokenizer(template.format(**row), add_special_tokens=False).input_ids
        completion = tokenizer(row["summary"], add_special_tokens=False).input_ids
        ids = [tokenizer.bos_token_id, *prompt, *completion, tokenizer.eos_token_id]
        sequences.append(ids)
        labels.append([-100] * (1 + len(prompt)) + ids[1 + len(prompt) :])
    width = max(map(len, sequences))
    ids = torch.tensor([s + [0] * (width - len(s)) for s in sequences])
    label = torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels])
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(inside / "tiny")(ids, labels=label).loss.item()
    assert nxd_loss == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    ("kind", "warmup", "formula"),
    [
        ("cosine", 2, lambda s: 1e-3 * s / 2 if s < 2 else 1e-3 * 0.5 * (1 + math.cos(math.pi * (s - 2) / 6))),
        ("linear", 0.25, lambda s: 1e-3 * s / 2 if s < 2 else 1e-3 * (8 - s) / 6),
    ],
)
def test_schedules_equal_values_worked_by_hand(inside, kind, warmup, formula):
    """8 steps: the update of step s (from 0) uses formula(s); metrics.csv logs it at step s + 1."""
    dataset = {
        "dataset_name": str(_datasets(inside)["knkarthick/samsum"]),
        "prompt_template": "{dialogue}",
        "completion_template": "{summary}",
    }
    out = inside / f"out-{kind}"
    config = _config(
        inside,
        out,
        dataset,
        training={"max_steps": 8, "do_eval": False, "save_strategy": "no"},
        optimizers={"lr": 1e-3},
        scheduler={"scheduler_name": kind, "warmup_steps": warmup},
    )
    assert main([str(_write(inside / f"{kind}.yaml", config))]) == 0
    logged = [row["lr"] for row in read_metrics(out) if "lr" in row]
    assert logged == pytest.approx([formula(s) for s in range(8)], rel=1e-9, abs=1e-15)


def test_early_stopping_stops_at_the_step_worked_by_hand(inside, capsys):
    """Validation at steps 2, 4, 6 ...; patience 1 and a threshold no change reaches: step 2 sets the best,
    step 4 does not improve on it by 100, so the run ends after step 4, with its checkpoint."""
    dataset = {
        "dataset_name": str(_datasets(inside)["knkarthick/samsum"]),
        "prompt_template": "{dialogue}",
        "completion_template": "{summary}",
        "test_split": "test",
    }
    out = inside / "out-early"
    config = _config(
        inside,
        out,
        dataset,
        training={"max_steps": 10, "eval_strategy": "steps", "eval_steps": 2},
        callbacks={"early_stopping": {"early_stopping_patience": 1, "early_stopping_threshold": 100.0}},
    )
    assert main([str(_write(inside / "early.yaml", config))]) == 0
    rows = read_metrics(out)
    assert max(row["step"] for row in rows) == 4 and [r["step"] for r in rows if "val_loss" in r] == [2, 4]
    assert "early stopping after step 4 of 10" in capsys.readouterr().out
    assert (out / "checkpoint-4" / "trainer_state.json").is_file()


def test_resume_from_a_trainer_checkpoint_continues_the_uninterrupted_losses(inside):
    dataset = {
        "dataset_name": str(_datasets(inside)["knkarthick/samsum"]),
        "prompt_template": "{dialogue}",
        "completion_template": "{summary}",
        "test_split": "test",
    }
    out = inside / "out-resume"
    training = {"max_steps": 6, "save_strategy": "steps", "save_steps": 3, "eval_strategy": "no"}
    assert main([str(_write(inside / "whole.yaml", _config(inside, out, dataset, training=training)))]) == 0
    whole = {row["step"]: row["loss"] for row in read_metrics(out) if "loss" in row}
    assert main([str(inside / "whole.yaml"), "--resume_from_checkpoint", str(out / "checkpoint-3")]) == 0
    resumed = {row["step"]: row["loss"] for row in read_metrics(out) if "loss" in row}
    assert [resumed[s] for s in (4, 5, 6)] == [whole[s] for s in (4, 5, 6)]
    assert "resumed from" in (out / "nxd_log_globalrank-0_localrank-0.txt").read_text()


def test_json_log_and_save_total_limit(inside):
    dataset = {
        "dataset_name": str(_datasets(inside)["knkarthick/samsum"]),
        "prompt_template": "{dialogue}",
        "completion_template": "{summary}",
    }
    out = inside / "out-json"
    config = _config(
        inside,
        out,
        dataset,
        training={
            "max_steps": 6,
            "save_strategy": "steps",
            "save_steps": 2,
            "save_total_limit": 2,
            "eval_strategy": "no",
        },
        callbacks={"json_logger": None},
    )
    assert main([str(_write(inside / "json.yaml", config))]) == 0
    lines = [yaml.safe_load(line) for line in (out / "training_logs.jsonl").read_text().splitlines()]
    assert [line["global_step"] for line in lines] == [1, 2, 3, 4, 5, 6] and all("loss" in line for line in lines)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    assert len(list((out / "checkpoints").iterdir())) == 2


@pytest.mark.slow  # torchrun's launch in the default suite: tests/integration/test_data_parallel.py
def test_ddp_over_two_processes_under_torchrun_matches_one_process(inside):
    """QEfficient's DDP file as its users launch it (`torchrun --nproc-per-node 2 -m ...`): per-device batch 1 on
    2 processes is the global batch of 2 that one process takes with per-device batch 2."""
    import subprocess
    import sys

    overrides = ["--max_steps", "4", "--torch_dtype", "fp32", "--warmup_steps", "0", "--logging_steps", "1"]
    single_out, double_out = inside / "out-ddp1", inside / "out-ddp2"
    config = local_config(
        EXAMPLES / "sft_ddp_config.yaml",
        inside / "ddp.yaml",
        inside / "tiny",
        _datasets(inside),
        single_out,
        dataset={"max_seq_length": 128},
    )
    assert main([str(config), *overrides, "--per_device_train_batch_size", "2", "--output_dir", str(single_out)]) == 0
    torchrun = Path(sys.executable).with_name("torchrun")
    result = subprocess.run(
        [
            str(torchrun),
            "--nproc-per-node",
            "2",
            "-m",
            "nxd_train",
            str(config),
            *overrides,
            "--output_dir",
            str(double_out),
        ],
        cwd=inside,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ddp_backend" in result.stderr  # qccl, QAIC's, is noticed: gloo here
    single = [row["loss"] for row in read_metrics(single_out) if "loss" in row]
    double = [row["loss"] for row in read_metrics(double_out) if "loss" in row]
    assert len(single) == 4 and max(abs(a - b) for a, b in zip(single, double, strict=True)) < 1e-6


def _preference_folder(place: Path) -> Path:
    folder = place / "hub" / "pairs"
    if not folder.exists():
        from tests.qeff_fixtures import phrase

        rows = [
            {"question": f"which {phrase(i, 3)} {i}", "good": f"{phrase(i + 1, 4)} yes", "bad": f"{phrase(i, 2)} no"}
            for i in range(24)
        ]
        folder.mkdir(parents=True)
        for split, part in (("train", rows[:20]), ("test", rows[20:])):
            (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return folder


def _ultrafeedback_folder(place: Path) -> Path:
    """trl-lib/ultrafeedback_binarized as PR 964's file reads it: prompt, chosen and rejected columns."""
    folder = place / "hub" / "ultrafeedback_binarized"
    if not folder.exists():
        rows = [
            {"prompt": row["question"], "chosen": row["good"], "rejected": row["bad"]}
            for row in map(json.loads, (_preference_folder(place) / "train.jsonl").read_text().splitlines())
        ]
        folder.mkdir(parents=True)
        (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def test_pr_964s_dpo_file_trains_with_nxds_dpo_and_says_which_keys_qefficient_ignores(inside, capsys):
    """PR 964's dpo_single_device_config.yaml as written (fp16, its dpo section, the Trainer keys QEfficient keeps
    in extra_params), its lengths shrunk to the tiny model: the first step's loss is -log sigmoid(0) = ln 2 (the
    policy is the reference, LoRA's B being 0), the adapter loads in peft, and each key QEfficient ignores gets a
    notice."""
    out = inside / "out-dpo"
    config = local_config(
        EXAMPLES / "dpo_single_device_config.yaml",
        inside / "dpo.yaml",
        inside / "tiny",
        {"trl-lib/ultrafeedback_binarized": _ultrafeedback_folder(inside)},
        out,
        dpo={"max_length": 64, "max_prompt_length": 32},
        training={"max_steps": 3},
    )
    assert main([str(config)]) == 0
    err = capsys.readouterr().err
    assert read_metrics(out)[0]["loss"] == pytest.approx(math.log(2), abs=1e-3)
    _adapter_moves_logits(inside / "tiny", out)
    ignored = sorted(re.findall(r": ([\w.]+): not a QEfficient key", err))
    assert ignored == ["dataset.split", "dpo.ref_model", "training.fp16", "training.learning_rate", "training.optim"]


def test_a_sequence_classifier_trains_as_a_reward_model(inside):
    from transformers import AutoModelForSequenceClassification

    dataset = {
        "dataset_type": "dpo_dataset",
        "dataset_name": str(_preference_folder(inside)),
        "prompt_column": "question",
        "chosen_column": "good",
        "rejected_column": "bad",
    }
    out = inside / "out-reward"
    config = _config(
        inside,
        out,
        dataset,
        model={"auto_class_name": "AutoModelForSequenceClassification", "use_peft": False},
        training={"max_steps": 3},
    )
    assert main([str(_write(inside / "reward.yaml", config))]) == 0
    assert read_metrics(out)[0]["loss"] == pytest.approx(math.log(2), abs=0.05)  # scores start near each other
    scorer = AutoModelForSequenceClassification.from_pretrained(out)
    assert scorer(torch.tensor([[1, 40, 41, 42]])).logits.shape == (1, 1)


def test_early_stopping_counts_on_across_a_resume(inside):
    """Patience 2: validations at 2 (best), 4 and 6 (no improvement by 100) stop the run after step 6. Resumed from
    checkpoint-4, the count (1 at step 4) goes on, so the resumed run stops after step 6 too."""
    dataset = {
        "dataset_name": str(_datasets(inside)["knkarthick/samsum"]),
        "prompt_template": "{dialogue}",
        "completion_template": "{summary}",
        "test_split": "test",
    }
    out = inside / "out-patience"
    config = _config(
        inside,
        out,
        dataset,
        training={
            "max_steps": 10,
            "eval_strategy": "steps",
            "eval_steps": 2,
            "save_strategy": "steps",
            "save_steps": 2,
        },
        callbacks={"early_stopping": {"early_stopping_patience": 2, "early_stopping_threshold": 100.0}},
    )
    assert main([str(_write(inside / "patience.yaml", config))]) == 0
    assert max(row["step"] for row in read_metrics(out)) == 6
    assert main([str(inside / "patience.yaml"), "--resume_from_checkpoint", str(out / "checkpoint-4")]) == 0
    assert max(row["step"] for row in read_metrics(out)) == 6


def test_trainer_folders_of_others_are_never_replaced_or_pruned(inside):
    dataset = {
        "dataset_name": str(_datasets(inside)["knkarthick/samsum"]),
        "prompt_template": "{dialogue}",
        "completion_template": "{summary}",
    }
    out = inside / "out-others"
    (out / "checkpoint-2").mkdir(parents=True)
    (out / "checkpoint-2" / "mine.txt").write_text("the user's")
    (out / "checkpoint-1").mkdir()
    (out / "checkpoint-1" / "trainer_state.json").write_text('{"nxd_checkpoint": "checkpoints/gone"}')
    config = _config(
        inside,
        out,
        dataset,
        training={
            "max_steps": 4,
            "save_strategy": "steps",
            "save_steps": 2,
            "save_total_limit": 1,
            "eval_strategy": "no",
            "overwrite_output_dir": True,
        },
    )
    assert main([str(_write(inside / "others.yaml", config))]) == 0
    assert (out / "checkpoint-2" / "mine.txt").read_text() == "the user's"
    assert (out / "checkpoint-1" / "trainer_state.json").is_file()  # another run's, its checkpoint gone: kept
    assert not (out / "checkpoint-2-v1").exists()  # this run's step 2, pruned with its checkpoint
    assert (out / "checkpoint-4" / "adapter_model.safetensors").is_file()


def test_generate_samples_a_qefficient_runs_adapter_on_its_base(inside):
    """nxd-train generate on a QEfficient file: its newest checkpoint's LoRA adapter on the base model, greedy
    tokens as peft's model (the adapter folder the run left, on the same base) generates them."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    out = inside / "out-generate"
    config = local_config(
        EXAMPLES / "sft_single_device_gsm8k_config.yaml",
        inside / "gen.yaml",
        inside / "tiny",
        _datasets(inside),
        out,
        dataset={"max_seq_length": 128},
    )
    assert main([str(config), "--max_steps", "6", "--lr", "0.05"]) == 0
    (inside / "prompts.txt").write_text("the quick brown\nfox jumps over the\n")
    assert (
        main(
            [
                "generate",
                str(config),
                "generate.text_gen_type=input-file",
                "generate.maximum_tokens=12",
                f"generate.sample_input_file={inside / 'prompts.txt'}",
                f"generate.sample_output_file={inside / 'qeff.jsonl'}",
                "generate.return_logits=true",
            ]
        )
        == 0
    )
    records = [json.loads(line) for line in (inside / "qeff.jsonl").read_text().splitlines()]
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(inside / "tiny"), out).eval()
    tokenizer = AutoTokenizer.from_pretrained(inside / "tiny")
    for record in records:
        ids = torch.tensor([tokenizer.encode(record["context"], add_special_tokens=False)])
        with torch.no_grad():
            generated = model.generate(
                input_ids=ids, max_new_tokens=12, do_sample=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=0
            )[0, ids.shape[1] :].tolist()
        if generated and generated[-1] == tokenizer.eos_token_id:
            generated = generated[:-1]
        assert tokenizer.decode(generated) == (record["text"] or ""), record
    ids = torch.tensor([tokenizer.encode(records[0]["context"], add_special_tokens=False)])
    ours = torch.tensor(records[0]["logits"][0])
    with torch.no_grad():
        adapted = model(ids).logits[0, -1]
        plain = AutoModelForCausalLM.from_pretrained(inside / "tiny").eval()(ids).logits[0, -1]
    # the run's precision (fp16 compute here) against peft's fp32: close to the adapted model, far from the base
    assert (ours - adapted).abs().max() < 1e-3 < (ours - plain).abs().max()
