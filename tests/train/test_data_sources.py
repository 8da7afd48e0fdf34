"""nxd-train on each data source: Megatron indexed data (made by `nxd-train data preprocess`),
blends, Hugging Face folders, and the errors bad data gets before any process starts."""

from __future__ import annotations

import json
import random
from pathlib import Path

import datasets
import pytest
from nxd_ckpt import CheckpointError
from nxd_config import ConfigError, load_config
from nxd_train.checks.preflight import PreflightError, plan_run
from nxd_train.cli import default_config_path, main
from nxd_train.run.corpus import default_cache_dir
from nxd_train.run.loop import train

from tests.conftest import TEXT
from tests.training_runs import hf_run_config, losses, read_metrics


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 documents of 4 to 12 sentences as jsonl."""
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    path.write_text(
        "".join(json.dumps({"text": " ".join(rng.choices(TEXT[:4], k=rng.randint(4, 12)))}) + "\n" for _ in range(60))
    )
    return path


@pytest.fixture(scope="module")
def prefixes(corpus: Path, tokenizer_file: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The corpus preprocessed twice by the command (1 and 2 workers)."""
    out = tmp_path_factory.mktemp("indexed")
    for workers in (1, 2):
        assert (
            main(
                [
                    "data",
                    "preprocess",
                    "--input",
                    str(corpus),
                    "--output-prefix",
                    str(out / f"w{workers}"),
                    "--tokenizer",
                    str(tokenizer_file),
                    "--append-eod",
                    "--workers",
                    str(workers),
                    "--no-progress",
                ]
            )
            == 0
        )
    return str(out / "w1_text_document"), str(out / "w2_text_document")


def test_preprocess_command_reports_what_it_wrote(corpus: Path, tokenizer_file: Path, tmp_path: Path, capsys) -> None:
    assert (
        main(
            [
                "data",
                "preprocess",
                "--input",
                str(corpus),
                "--output-prefix",
                str(tmp_path / "c"),
                "--tokenizer",
                str(tokenizer_file),
                "--no-progress",
            ]
        )
        == 0
    )
    assert f"wrote {tmp_path / 'c'}_text_document.bin/.idx: 60 documents," in capsys.readouterr().out
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\nnot json\n')
    assert (
        main(
            [
                "data",
                "preprocess",
                "--input",
                str(bad),
                "--output-prefix",
                str(tmp_path / "b"),
                "--tokenizer",
                str(tokenizer_file),
                "--no-progress",
            ]
        )
        == 1
    )
    assert f"{bad}:2: expected a JSON object" in capsys.readouterr().err


def test_trains_on_preprocessed_and_blended_data(train_here, prefixes, tokenizer_file) -> None:
    one, two = prefixes
    data = [f"+data.tokenizer.type={tokenizer_file}", "trainer.max_steps=4", "model.optim.sched.max_steps=4"]
    single = losses(train_here(*data, f"+data.data_prefix=[1.0,{one}]", "+data.index_mapping_dir=" + one + "-idx"))
    same_files = losses(train_here(*data, f"+data.data_prefix={two}"))  # 2 workers wrote the same tokens
    assert single == same_files and len(single) == 4
    assert len(list(Path(one + "-idx").glob("*.npy"))) == 3 * 3  # doc, sample and shuffle index of each split
    blended = train_here(*data, f"+data.data_prefix=[0.7,{one},0.3,{two}]")
    assert len(losses(blended)) == 4


def test_trains_on_hugging_face_folders_and_logs_validation(train_here, tokenizer_file, tmp_path) -> None:
    rows = [[random.Random(r).randrange(300) for _ in range(65)] for r in range(40)]
    datasets.Dataset.from_dict({"input_ids": rows[:32]}).save_to_disk(str(tmp_path / "train"))
    datasets.Dataset.from_dict({"input_ids": rows[32:]}).save_to_disk(str(tmp_path / "val"))
    metrics = train_here(
        f"+data.tokenizer.type={tokenizer_file}",
        f"+data.train_dir={tmp_path / 'train'}",
        f"+data.val_dir={tmp_path / 'val'}",
        "trainer.max_steps=2",
        "model.optim.sched.max_steps=2",
        "trainer.val_check_interval=2",
        "trainer.limit_val_batches=1.0",
    )
    assert len(losses(metrics)) == 2 and [row["step"] for row in metrics if "val_loss" in row] == [2.0]


def test_padding_the_last_validation_batch_changes_no_loss(train_here, prefixes, tokenizer_file) -> None:
    options = [
        f"+data.tokenizer.type={tokenizer_file}",
        f"+data.data_prefix={prefixes[0]}",
        "trainer.max_steps=1",
        "model.optim.sched.max_steps=1",
        "trainer.val_check_interval=1",
        "trainer.limit_val_batches=1.0",
        "+data.splits_string='50,50,0'",
        "+data.validation_drop_last=False",
    ]
    validation = plan_run(load_config(default_config_path(), options), default_cache_dir()).data.validation
    assert len(validation) % 8  # a short last global batch
    padded = train_here(*options, "+data.pad_samples_to_global_batch_size=True")
    unpadded = train_here(*options)
    val = [[row["val_loss"] for row in run if "val_loss" in row] for run in (padded, unpadded)]
    assert len(val[0]) == 1 and val[0] == pytest.approx(val[1], rel=1e-12)


def problems(*overrides: str) -> str:
    cfg = load_config(default_config_path(), list(overrides))
    with pytest.raises(PreflightError) as caught:
        plan_run(cfg, default_cache_dir())
    return str(caught.value)


def test_bad_data_is_named_before_launch(tmp_path: Path, tokenizer_file: Path) -> None:
    tokenizer = f"+data.tokenizer.type={tokenizer_file}"
    missing = tmp_path / "absent_text_document"
    assert f"data prefix {missing}: expected absent_text_document.idx and absent_text_document.bin" in problems(
        tokenizer, f"+data.data_prefix={missing}"
    )
    assert "data.tokenizer: expected a tokenizer with data.data_prefix" in problems(f"+data.data_prefix={missing}")
    assert (
        f"data.tokenizer.type: expected a tokenizer.json file or a directory holding one (or a SentencePiece "
        f"tokenizer.model), found no such file or directory: {tmp_path / 'none'}"
        in problems(f"+data.tokenizer.type={tmp_path / 'none'}", f"+data.data_prefix={missing}")
    )
    with pytest.raises(ConfigError, match="data.data_prefix: expected at least one positive weight"):
        load_config(default_config_path(), [tokenizer, f"+data.data_prefix=[0,{missing}]"])
    assert "data.train_dir: expected one data source, found data_prefix as well" in problems(
        tokenizer, f"+data.data_prefix={missing}", f"+data.train_dir={tmp_path}"
    )
    assert "data.tokenizer.vocab_file: applies to library megatron, which this tokenizer is not" in problems(
        tokenizer, "+data.tokenizer.vocab_file=vocab.json"
    )
    sentencepiece = problems(tokenizer, "+data.tokenizer.library=sentencepiece")
    assert (
        "data.tokenizer.model: expected the SentencePiece model file of library sentencepiece, found none"
        in sentencepiece
        and f"data.tokenizer.type: library sentencepiece reads data.tokenizer.model; expected type "
        f"unset, found '{tokenizer_file}'"
        in sentencepiece
    )
    assert "data.tokenizer.model: applies to library sentencepiece, which this tokenizer is not" in problems(
        tokenizer, "+data.tokenizer.model=m.model"
    )
    for key, value in (
        ("tokenizer.type", tokenizer_file),
        ("val_dir", tmp_path),
        ("index_mapping_dir", tmp_path),
        ("label_prefixes", "{a: b}"),
    ):  # a config naming no data trains on the built-in corpus only
        name = key.split(".")[0]
        assert (
            f"data.{name}: set without data to train on; expected data.data_prefix (Megatron indexed data) or "
            "data.train_dir (Hugging Face data) beside it, found neither (nxd trains on its built-in corpus only "
            "when a config names no data at all)" in problems(f"+data.{key}={value}")
        )
    char_level = ["+data.tokenizer.library=megatron", "+data.tokenizer.type=CharLevelTokenizer"]
    assert (
        "data.tokenizer.vocab_file: applies to GPT2BPETokenizer and TiktokenTokenizer, which this tokenizer is "
        "not" in problems(*char_level, "+data.tokenizer.vocab_file=vocab.json")
    )


def test_document_keys_train_both_families(train_here, tmp_path) -> None:
    documents = ["+data.reset_position_ids=True", "+data.reset_attention_mask=True", "+data.eod_mask_loss=True"]
    assert len(losses(train_here(*documents, "trainer.max_steps=2", "model.optim.sched.max_steps=2"))) == 2
    source = hf_run_config(tmp_path, vocab_size=4096)
    cfg = load_config(source, [*documents, f"+exp_manager.explicit_log_dir={tmp_path / 'hf'}"])
    assert len(losses(read_metrics(train(plan_run(cfg, default_cache_dir()))))) == 3


def test_pre_tokenised_data_trains_a_hugging_face_model_with_no_tokenizer(tmp_path, capsys) -> None:
    """NxDT's HF recipes: rows of input_ids (with labels and attention_mask) and no data.tokenizer; the
    vocabulary and end-of-document id come from the model's config.json, and a resume continues exactly."""
    source = hf_run_config(tmp_path, vocab_size=256)
    generator = random.Random(0)
    rows = [[generator.randrange(256) for _ in range(64)] for _ in range(48)]
    columns = {"input_ids": rows, "labels": rows, "attention_mask": [[1] * 64 for _ in rows]}
    datasets.Dataset.from_dict(columns).save_to_disk(str(tmp_path / "train"))
    config = json.loads((tmp_path / "config.json").read_text()) | {"eos_token_id": [2, 3]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    job = [
        "-c",
        str(source),
        f"+data.train_dir={tmp_path / 'train'}",
        "trainer.max_steps=6",
        "exp_manager.create_checkpoint_callback=True",
        "+exp_manager.checkpoint_callback_params.save_top_k=-1",
        "+exp_manager.checkpoint_callback_params.every_n_train_steps=3",
    ]
    assert main([*job, f"+exp_manager.explicit_log_dir={tmp_path / 'whole'}"]) == 0
    whole = read_metrics(tmp_path / "whole")
    log = (tmp_path / "whole" / "nxd_log_globalrank-0_localrank-0.txt").read_text()
    assert f"pre-tokenised ids (vocabulary 256, end of document 2: {tmp_path / 'config.json'})" in log
    step_3 = next((tmp_path / "whole" / "checkpoints").glob("*step=3*"))
    assert (
        main(
            [
                *job,
                f"+exp_manager.explicit_log_dir={tmp_path / 'resumed'}",
                f"+exp_manager.resume_from_checkpoint={step_3}",
            ]
        )
        == 0
    )
    assert losses(read_metrics(tmp_path / "resumed")) == losses(whole)[3:]
    datasets.Dataset.from_dict({"input_ids": [[300] * 64] * 8}).save_to_disk(str(tmp_path / "beyond"))
    capsys.readouterr()
    assert main(["-c", str(source), f"+data.train_dir={tmp_path / 'beyond'}"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "row 0 holds token id 300; expected ids in [0, 256)" in err


@pytest.mark.parametrize("form", ["gpt2_vocab_merges", "sentencepiece_directory"])
def test_each_tokenizer_form_trains_and_preprocesses(
    form, train_here, corpus, gpt2_files, sentencepiece_dir, tmp_path, capsys
) -> None:
    """NxDT's tokenizer keys as its Megatron (GPT-2 vocab/merges) and Llama 2 (SentencePiece) recipes write
    them: `data.tokenizer` trains on Hugging Face text, and `data preprocess` writes indexed data."""
    if form == "gpt2_vocab_merges":
        vocab, merges = gpt2_files
        keys = [
            "+data.tokenizer.library=megatron",
            "+data.tokenizer.type=GPT2BPETokenizer",
            f"+data.tokenizer.vocab_file={vocab}",
            f"+data.tokenizer.merge_file={merges}",
        ]
        flags = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges]
    else:
        keys = [f"+data.tokenizer.type={sentencepiece_dir}", "+data.tokenizer.use_fast=False"]
        flags = ["--tokenizer", str(sentencepiece_dir)]
    metrics = train_here(*keys, f"+data.train_dir={corpus}", "trainer.max_steps=2", "model.optim.sched.max_steps=2")
    assert len(losses(metrics)) == 2
    assert (
        main(
            [
                "data",
                "preprocess",
                "--input",
                str(corpus),
                "--output-prefix",
                str(tmp_path / "out"),
                *flags,
                "--append-eod",
                "--no-progress",
            ]
        )
        == 0
    )
    assert "wrote " in capsys.readouterr().out and (tmp_path / "out_text_document.idx").is_file()


@pytest.mark.parametrize("workers", [0, 2])
def test_an_id_beyond_the_vocabulary_in_a_bin_file_is_named_with_its_document(
    tmp_path, tokenizer_file, capsys, workers
) -> None:
    """A .bin written with another tokenizer (id 5000 where the tokenizer has 300): the run stops where the
    sample is read, naming the file and document, with or without data-loader workers."""
    import numpy as np
    from nxd_data import IndexedDatasetWriter

    generator = random.Random(3)
    with IndexedDatasetWriter(tmp_path / "other", np.uint16) as writer:
        for document in range(40):
            tokens = [generator.randrange(1, 300) for _ in range(40)]
            if document == 17:
                tokens[5] = 5000
            writer.add_document(tokens)
    code = main(
        [
            "-c",
            str(default_config_path()),
            f"+data.tokenizer.type={tokenizer_file}",
            f"+data.data_prefix={tmp_path / 'other'}",
            "trainer.max_steps=40",
            f"+data.num_workers={workers}",
            f"+exp_manager.explicit_log_dir={tmp_path / 'run'}",
            "exp_manager.create_tensorboard_logger=False",
            "trainer.limit_val_batches=0",
            "+data.splits_string='100,0,0'",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err[-2000:]
    assert f"{tmp_path / 'other'}.bin: document 17 holds token id 5000, beyond the vocabulary of 300 ids" in err


def test_a_finished_run_extended_from_5_to_10_steps_equals_a_straight_10_step_run(
    prefixes, tokenizer_file, tmp_path
) -> None:
    """Raising max_steps and resuming continues the sample stream exactly; the 80 samples cross the
    training split's epochs, so later epochs' indices do not depend on the run's length either."""
    from tests.training_runs import train_in_process

    job = [
        f"+data.tokenizer.type={tokenizer_file}",
        f"+data.data_prefix={prefixes[0]}",
        "+data.splits_string='25,40,35'",
        "model.optim.sched.max_steps=10",
        "model.optim.sched.warmup_steps=3",
        "exp_manager.create_checkpoint_callback=True",
        "+exp_manager.checkpoint_callback_params.save_top_k=-1",
        "+exp_manager.checkpoint_callback_params.every_n_train_steps=5",
    ]
    straight = losses(train_in_process(tmp_path / "straight", *job, "trainer.max_steps=10"))
    short = losses(train_in_process(tmp_path / "extended", *job, "trainer.max_steps=5"))
    extended = train_in_process(
        tmp_path / "extended", *job, "trainer.max_steps=10", "exp_manager.resume_if_exists=True"
    )
    assert short == straight[:5]
    assert losses(extended) == straight  # metrics.csv: steps 1-5 of the first run, then 6-10 of the resumed one
    cfg = load_config(default_config_path(), [*job, "trainer.max_steps=10"])
    assert plan_run(cfg, default_cache_dir()).data.train.samples_per_epoch < 40  # crossed in both runs


def test_extending_a_cyclic_run_over_megatron_data_is_refused_with_the_way_out(
    prefixes, tokenizer_file, tmp_path
) -> None:
    """data.dataloader_type: cyclic shuffles all max_steps x global_batch_size samples at once, so a longer
    run would read them in another order: one message naming the keys, no traceback."""
    from tests.training_runs import train_in_process

    job = [
        f"+data.tokenizer.type={tokenizer_file}",
        f"+data.data_prefix={prefixes[0]}",
        "+data.dataloader_type=cyclic",
        "model.optim.sched.max_steps=4",
        "exp_manager.create_checkpoint_callback=True",
    ]
    train_in_process(tmp_path / "run", *job, "trainer.max_steps=2")
    with pytest.raises(
        CheckpointError,
        match=r"total_samples was 16, this run has 32, .*data.dataloader_type: "
        r"cyclic shuffles them all at once",
    ):
        train_in_process(tmp_path / "run", *job, "trainer.max_steps=4", "exp_manager.resume_if_exists=True")
