"""QEfficient's fine-tuning config read as nxd's typed config: every key of its reference and code is
mapped, noticed or refused; keys QEfficient ignores get a notice; overrides in its spelling and nxd's; the
batch arithmetic of a torchrun launch."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from nxd_config import ConfigError, load_config
from nxd_config.neox.keys import KeyStatus
from nxd_config.qeff import QEFF_KEYS
from nxd_config.qeff.translate import translate
from nxd_train.cli import flag_overrides, main

EXAMPLES = Path(__file__).parents[2] / "configs" / "qeff"


def _file(tmp_path: Path, **sections: dict) -> dict:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    base = {
        "model": {"model_name": str(model)},
        "dataset": {"dataset_name": str(tmp_path / "data"), "prompt_template": "{q}", "completion_template": "{a}"},
        "training": {"output_dir": str(tmp_path / "out"), "torch_dtype": "fp32"},
    }
    for section, values in sections.items():
        base.setdefault(section, {}).update(values)
    return base


def _load(values: dict, *overrides: str):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = load_config(values, list(overrides))
    return config, [str(w.message) for w in caught]


def _error(values: dict, *overrides: str) -> str:
    with pytest.raises(ConfigError) as raised:
        _load(values, *overrides)
    return str(raised.value)


def test_every_key_at_its_default_loads_and_means_what_qeff_defaults_mean(tmp_path):
    """A file that writes every key of the table at QEfficient's default is accepted without a notice."""
    values = _file(tmp_path)
    for name, entry in QEFF_KEYS.items():
        section, _, rest = name.partition(".")
        if entry.default is None or name in ("dataset.dataset_name", "model.model_name", "training.output_dir"):
            continue
        node = values.setdefault(section, {})
        *parents, leaf = rest.split(".")
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else node
        node[leaf] = entry.default
    values["training"]["torch_dtype"] = "fp32"
    config, notices = _load(values)
    assert notices == []
    assert config.model_alignment_strategy.peft.lora_rank == 8 and config.model_alignment_strategy.peft.lora_alpha == 16
    assert config.model.optim.name == "adamw" and config.model.optim.lr == 5e-5
    assert config.model.optim.sched.type == "cosine" and config.model.optim.sched.warmup_steps == 100
    assert config.data.dataset.split_ratio == 0.8 and config.data.dataset.seed == 42
    assert config.data.seq_length == 512 and not config.data.dataset.loss_on_prompt


def test_each_status_of_the_table_is_what_a_value_off_default_gets(tmp_path):
    statuses = {entry.status for entry in QEFF_KEYS.values()}
    assert statuses == {KeyStatus.MAPPED, KeyStatus.NOTICE, KeyStatus.REFUSED}
    config, notices = _load(_file(tmp_path, model={"use_cache": True}, dataset={"collate_fn": "default"}))
    assert any("model.use_cache: accepted, changes nothing here" in n for n in notices)
    assert any("dataset.collate_fn" in n for n in notices) and config.data.group_by_length
    config, _ = _load(_file(tmp_path, dataset={"group_by_length": False}))
    assert not config.data.group_by_length
    message = _error(_file(tmp_path, training={"deepspeed_config": {"zero_optimization": {"stage": 2}}}))
    assert "training.deepspeed_config" in message and "distributed_strategy.zero1" in message


def test_choices_in_any_case_and_the_reference_spellings(tmp_path):
    config, _ = _load(
        _file(
            tmp_path,
            optimizers={"optimizer": "AdamW", "lr": "1e-4"},
            scheduler={"scheduler": "Linear", "warmup_steps": 0.05},
            training={"dtype": "bf16", "torch_dtype": "bf16"},
        )
    )
    assert config.model.optim.name == "adamw" and config.model.optim.lr == 1e-4
    assert config.model.optim.sched.type == "linear" and config.model.optim.sched.warmup_ratio == 0.05
    assert config.precision.type == "mixed_precision"
    assert "found both" in _error(_file(tmp_path, training={"dtype": "bf16"}))


def test_keys_qefficient_ignores_are_ignored_with_a_notice_naming_what_does_their_job(tmp_path):
    """QEfficient keeps a key its config classes lack in extra_params and never reads it: the file runs there, and
    here, as if the key were absent; each gets one notice with the key that does its job or a did-you-mean."""
    plain, quiet = _load(_file(tmp_path))
    config, notices = _load(
        _file(
            tmp_path,
            model={"peft_config": {"lora_rr": 4}},
            trainig={"seed": 1},
            callbacks={"early_stoping": {}},
            training={"learning_rate": 1e-5, "optim": "adamw", "fp16": True},
            dataset={"split": "train", "torch_dtype": "fp16"},
        )
    )
    assert config.model_dump() == plain.model_dump()
    said = [notice for notice in notices if notice not in quiet]
    expected = {
        "model.peft_config.lora_rr": "did you mean 'model.peft_config.lora_r'?",
        "trainig": "(did you mean 'training'?)",
        "callbacks.early_stoping": "did you mean 'callbacks.early_stopping'?",
        "training.learning_rate": "optimizers.lr sets the learning rate",
        "training.optim": "optimizers.optimizer_name chooses the optimizer",
        "training.fp16": "training.torch_dtype (fp16, bf16 or fp32) sets the precision",
        "dataset.split": "dataset.train_split and dataset.test_split choose the splits",
        "dataset.torch_dtype": "training.torch_dtype (fp16, bf16 or fp32) sets the precision",
    }
    for key, hint in expected.items():
        (notice,) = [notice for notice in said if f": {key}: not a QEfficient " in notice]
        assert "QEfficient keeps it in extra_params and never reads it, and nxd ignores it too" in notice
        assert hint in notice, notice
    assert len(said) == len(expected)


def test_the_trainer_and_trl_field_table_covers_the_installed_versions():
    """The README's table of Trainer and TRL fields is the one the installed transformers gives (a new release's
    fields make it stale); TRL's fields are those of the release uv.lock holds (TRL installs only with the bench
    group), and with TRL installed, of that installation."""
    import dataclasses
    import importlib.util
    import re

    from nxd_config.qeff.table import FIELDS_END, FIELDS_START
    from nxd_config.qeff.trainer_fields import TRL_DPO_FIELDS, TRL_SFT_FIELDS, TRL_VERSION, field_table
    from transformers import TrainingArguments

    text = (Path(__file__).resolve().parents[2] / "docs" / "config-reference.md").read_text()
    assert text.split(FIELDS_START)[1].split(FIELDS_END)[0].strip() == field_table().strip(), (
        "run: uv run python -m nxd_config.qeff.table --update docs/config-reference.md"
    )
    lock = (Path(__file__).resolve().parents[2] / "uv.lock").read_text()
    assert re.search(r'name = "trl"\nversion = "([^"]+)"', lock).group(1) == TRL_VERSION
    if importlib.util.find_spec("trl") is not None:
        from trl import DPOConfig, SFTConfig

        base = {f.name for f in dataclasses.fields(TrainingArguments)}
        assert set(TRL_SFT_FIELDS) == {f.name for f in dataclasses.fields(SFTConfig)} - base
        assert set(TRL_DPO_FIELDS) == {f.name for f in dataclasses.fields(DPOConfig)} - base


def test_the_json_log_is_a_file_of_its_own_in_output_dir(tmp_path):
    config, _ = _load(_file(tmp_path, callbacks={"json_logger": {"log_path": "train.jsonl"}}))
    assert config.exp_manager.json_log_file == "train.jsonl"
    assert "a file name in training.output_dir" in _error(
        _file(tmp_path, callbacks={"json_logger": {"log_path": "/etc/x.jsonl"}})
    )
    assert "nxd's own files" in _error(_file(tmp_path, callbacks={"json_logger": {"log_path": "metrics.csv"}}))


def test_refused_by_name(tmp_path):
    assert "IA3" in _error(_file(tmp_path, model={"peft_config": {"peft_type": "IA3"}}))
    message = _error(_file(tmp_path, model={"load_in_4bit": True}))
    assert "model.load_in_4bit" in message and "bitsandbytes" in message
    assert "training.fsdp_config" in _error(_file(tmp_path, training={"fsdp_config": {"x": 1}}))
    assert "expected fp16, bf16 or fp32" in _error(_file(tmp_path, training={"torch_dtype": "int8"}))
    assert "expected one of adamw, adam, sgd" in _error(_file(tmp_path, optimizers={"optimizer_name": "lion"}))


def test_templates_as_the_reference_writes_them(tmp_path):
    config, notices = _load(_file(tmp_path, dataset={"prompt_template": "Summarize:\n\n{'dialogue'}\n\nSummary:\n"}))
    assert config.data.dataset.prompt_template == "Summarize:\n\n{dialogue}\n\nSummary:\n"
    assert any("{'dialogue'} read as the column(s) dialogue" in n for n in notices)
    grammar = "f\"Correct:\\n\\n{'input'}\\n\\nCorrected:\\n\""
    config, notices = _load(_file(tmp_path, dataset={"prompt_template": grammar}))
    assert config.data.dataset.prompt_template == "Correct:\n\n{input}\n\nCorrected:\n"
    assert any("f-string" in n for n in notices)


def test_qefficients_alpaca_function_is_nxds(tmp_path):
    for spec in (
        "QEfficient.finetune.experimental.preprocessing.alpaca_func:create_alpaca_prompt",
        "preprocess/alpaca_func:create_alpaca_prompt",
    ):
        config, notices = _load(_file(tmp_path, dataset={"prompt_template": None, "prompt_func": spec}))
        assert config.data.dataset.prompt_func == "nxd_data.formatters:alpaca_prompt"
        assert any("QEfficient's Alpaca prompt" in n for n in notices)


def test_objectives_and_losses(tmp_path):
    config, _ = _load(_file(tmp_path))
    assert config.model_alignment_strategy.sft is not None and not config.data.dataset.loss_on_prompt
    config, _ = _load(_file(tmp_path, training={"packing": True}))
    assert config.model_alignment_strategy.sft.packing
    config, _ = _load(_file(tmp_path, training={"completion_only_loss": False}))
    assert config.data.dataset.loss_on_prompt
    config, _ = _load(_file(tmp_path, training={"type": "base"}))
    assert config.data.dataset.loss_on_prompt
    config, _ = _load(_file(tmp_path, dataset={"dataset_type": "seq_completion", "completion_template": None}))
    assert config.data.dataset.kind == "text"
    dpo_file = _file(
        tmp_path,
        training={"type": "dpo"},
        dataset={"dataset_type": "dpo_dataset"},
        dpo={"beta": 0.2, "loss_type": ["ipo"]},
    )
    assert "dpo_dataset reads its prompt_column" in _error(dpo_file)
    for key in ("prompt_template", "completion_template"):
        del dpo_file["dataset"][key]
    config, _ = _load(dpo_file)
    dpo = config.model_alignment_strategy.dpo
    assert dpo.kl_beta == 0.2 and dpo.loss_type == "ipo" and config.data.dataset.kind == "preference"
    assert "dpo_dataset" in _error(_file(tmp_path, training={"type": "dpo"}))
    assert "applies to training.type dpo" in _error(_file(tmp_path, dpo={"beta": 0.3}))


def test_overrides_dotted_flat_and_as_flags(tmp_path):
    values = _file(tmp_path)
    config, _ = _load(values, "optimizers.lr=3e-4", "lora_r=4", "target_modules=[q_proj,v_proj]", "seed=7")
    assert config.model.optim.lr == 3e-4 and config.model_alignment_strategy.peft.lora_rank == 4
    assert config.model_alignment_strategy.peft.target_modules == ("q_proj", "v_proj") and config.seed == 7
    assert flag_overrides(
        [
            "train",
            "--config",
            "a.yaml",
            "--lr",
            "3e-4",
            "--target_modules",
            "q_proj",
            "v_proj",
            "--training.seed=5",
            "--dialect",
            "qeff",
        ]
    ) == [
        "train",
        "--config",
        "a.yaml",
        "lr=3e-4",
        "target_modules=[q_proj,v_proj]",
        "training.seed=5",
        "--dialect",
        "qeff",
    ]
    assert "unknown key" in _error(values, "lrr=1")


def test_batch_arithmetic_follows_the_launch(tmp_path):
    values = _file(tmp_path, training={"per_device_train_batch_size": 2, "gradient_accumulation_steps": 3})
    tree = translate(values, "x", {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}).tree
    assert tree["data"]["micro_batch_size"] == 2 and tree["data"]["global_batch_size"] == 2 * 3 * 4
    assert tree["trainer"]["devices"] == 2 and tree["trainer"]["num_nodes"] == 2
    issues = translate(_file(tmp_path, training={"ddp_degree": 3}), "x", {"WORLD_SIZE": "2"}).issues
    assert any(issue.path == "training.ddp_degree" for issue in issues)


def test_a_non_empty_output_dir_is_refused_unless_overwritten(tmp_path, capsys):
    import yaml

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(_file(tmp_path)))
    assert main(["config", "check", str(path)]) == 1
    err = capsys.readouterr().err
    assert "already holds 1 entry (notes.txt)" in err and "overwrite_output_dir: false" in err
    config, _ = _load(_file(tmp_path, training={"overwrite_output_dir": True}))
    assert not config.exp_manager.require_empty_log_dir
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"


def _offline(monkeypatch, tmp_path) -> None:
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # read when huggingface_hub loads: set where it keeps it too
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


def test_an_unreachable_hub_model_names_the_way_out(tmp_path, monkeypatch):
    _offline(monkeypatch, tmp_path)
    message = _error(_file(tmp_path, model={"model_name": "nobody-here/no-such-model"}))
    assert "model.model_name" in message and "HF_HUB_OFFLINE" in message and "local model folder" in message


def test_qefficients_own_test_config_is_read_with_a_notice_for_each_key_it_ignores(tmp_path, monkeypatch):
    """tests/test_config.yaml of QEfficient's ft_experimental_v1 branch, as written: QEfficient runs it, keeping
    dataset.torch_dtype and the misspelt use_reenrant in extra_params; nxd refuses nothing in it and says so for
    each (tests/train/test_qeff_runs trains it)."""
    import yaml

    _offline(monkeypatch, tmp_path)  # its hub model is not fetched: the only issues are that it cannot be
    t = translate(yaml.safe_load((EXAMPLES / "test_config.yaml").read_text()), "test_config")
    assert t.issues and all("HF_HUB_OFFLINE" in issue.message for issue in t.issues)
    ignored = {notice.split(": ")[0]: notice for notice in t.notices if "not a QEfficient key" in notice}
    assert set(ignored) == {"dataset.torch_dtype", "training.gradient_checkpointing_kwargs.use_reenrant"}
    assert "training.torch_dtype (fp16, bf16 or fp32) sets the precision" in ignored["dataset.torch_dtype"]
    assert (
        "did you mean 'training.gradient_checkpointing_kwargs.use_reentrant'?"
        in ignored["training.gradient_checkpointing_kwargs.use_reenrant"]
    )


REFERENCE_KEYS = [
    "model.model_type",
    "model.auto_class_name",
    "model.model_name",
    "model.load_in_4bit",
    "model.use_cache",
    "model.attn_implementation",
    "model.device_map",
    "model.use_peft",
    "model.peft_config.lora_r",
    "model.peft_config.lora_alpha",
    "model.peft_config.lora_dropout",
    "model.peft_config.target_modules",
    "model.peft_config.bias",
    "model.peft_config.task_type",
    "model.peft_config.peft_type",
    "dataset.tokenizer_name",
    "dataset.dataset_type",
    "dataset.dataset_name",
    "dataset.json_file_path",
    "dataset.train_split",
    "dataset.test_split",
    "dataset.split_ratio",
    "dataset.prompt_func",
    "dataset.prompt_template",
    "dataset.completion_func",
    "dataset.completion_template",
    "dataset.dataset_subset",
    "dataset.max_seq_length",
    "dataset.input_columns",
    "dataset.target_column",
    "dataset.train_batch_size",
    "dataset.eval_batch_size",
    "dataset.collate_fn",
    "dataset.group_by_length",
    "dataset.length_column_name",
    "dataset.num_workers",
    "dataset.dataloader_pin_memory",
    "dataset.dataloader_drop_last",
    "dataset.dataloader_prefetch_factor",
    "dataset.dataloader_persistent_workers",
    "dataset.dataloader_num_workers",
    "dataset.config_name",
    "dataset.dataset_num_samples",
    "dataset.data_seed",
    "dataset.remove_samples_with_empty_columns",
    "dataset.dataset_disc_style",
    "training.type",
    "training.output_dir",
    "training.overwrite_output_dir",
    "training.do_eval",
    "training.eval_strategy",
    "training.eval_steps",
    "training.gradient_accumulation_steps",
    "training.dtype",
    "training.torch_dtype",
    "training.seed",
    "training.device",
    "training.per_device_train_batch_size",
    "training.per_device_eval_batch_size",
    "training.num_train_epochs",
    "training.max_steps",
    "training.log_level",
    "training.log_on_each_node",
    "training.logging_strategy",
    "training.logging_steps",
    "training.save_strategy",
    "training.save_steps",
    "training.save_total_limit",
    "training.metric_for_best_model",
    "training.include_num_input_tokens_seen",
    "training.average_tokens_across_devices",
    "training.fsdp_config",
    "training.deepspeed_config",
    "training.accelerator_config",
    "training.use_cpu",
    "training.restore_callback_states_from_checkpoint",
    "training.gradient_checkpointing",
    "training.gradient_checkpointing_kwargs.preserve_rng_state",
    "training.gradient_checkpointing_kwargs.use_reentrant",
    "training.ddp_config.ddp_backend",
    "training.ddp_config.ddp_find_unused_parameters",
    "training.ddp_config.ddp_bucket_cap_mb",
    "training.ddp_config.ddp_broadcast_buffers",
    "training.ddp_config.ddp_timeout",
    "training.torch_compile",
    "training.resume_from_checkpoint",
    "training.disable_tqdm",
    "training.log_file_name",
    "training.report_to",
    "training.completion_only_loss",
    "training.pp_degree",
    "optimizers.optimizer",
    "optimizers.optimizer_name",
    "optimizers.lr",
    "optimizers.weight_decay",
    "scheduler.scheduler",
    "scheduler.scheduler_name",
    "scheduler.warmup_steps",
    "scheduler.warmup_ratio",
    "callbacks.early_stopping.early_stopping_patience",
    "callbacks.early_stopping.early_stopping_threshold",
    "callbacks.enhanced_progressbar",
    "callbacks.default_flow",
    "callbacks.printer",
    "callbacks.json_logger",
    "callbacks.tensorboard",
    "callbacks.qaic_profiler_callback",
    "callbacks.qaic_op_by_op_verifier_callback",
    "callbacks.train_logger",
]
"""The keys of QEfficient's configuration reference and of its fine-tuning code's config dataclasses."""


def test_every_key_of_the_reference_and_the_code_is_in_the_table():
    assert sorted(set(REFERENCE_KEYS) - set(QEFF_KEYS)) == []
    for key in QEFF_KEYS.values():
        assert key.note or key.status is KeyStatus.MAPPED, key.name


def test_readme_qeff_table_is_current():
    from nxd_config.qeff.table import END, START, key_table

    text = (Path(__file__).resolve().parents[2] / "docs" / "config-reference.md").read_text()
    assert text.split(START)[1].split(END)[0].strip() == key_table().strip(), (
        "run: uv run python -m nxd_config.qeff.table --update docs/config-reference.md"
    )
