"""GPT-NeoX config files train: each file of tests/train/neox (one per model shape and key group, written in
NeoX's format) with a local_setup-style second file naming the data and tokenizer, as NeoX users pass them,
in two gloo processes; its `config translate` trains to the very same losses; a Llama-shaped NeoX file
exports to transformers' LlamaForCausalLM."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from nxd_config import load_config
from nxd_config.neox.files import read_file
from nxd_train.checks.preflight import PreflightError, plan_run
from nxd_train.cli import main
from nxd_train.run.corpus import default_cache_dir
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from tests.conftest import TEXT
from tests.training_runs import losses, read_metrics, run_command

NEOX = Path(__file__).parent / "neox"
FILES = sorted(path.stem for path in NEOX.glob("*.yml"))
DEFAULT = ()
"""Files trained in two processes in the default suite: none, since NeoX files train in one process below and NeoX's
shapes in two processes in tests/parallel/test_parity.py; every file, the resume and the translations run with
--runslow."""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    generator = random.Random(3)
    path = tmp_path_factory.mktemp("neox_corpus") / "docs.jsonl"
    path.write_text(
        "".join(
            json.dumps({"text": " ".join(generator.choices(TEXT, k=generator.randint(4, 12)))}) + "\n"
            for _ in range(200)
        )
    )
    return path


def local_setup(name: str, directory: Path, corpus: Path, tokenizer_file, gpt2_files, sentencepiece_dir) -> Path:
    """A local_setup.yml for `name`'s tokenizer: its files, the data preprocessed with it, the run's folders."""
    model = read_file(NEOX / f"{name}.yml")
    kind = model["tokenizer_type"]
    if kind == "SPMTokenizer":
        flags, files = (
            ["--tokenizer", str(sentencepiece_dir)],
            {"vocab_file": str(sentencepiece_dir / "tokenizer.model")},
        )
    elif kind == "GPT2BPETokenizer":
        vocab, merges = gpt2_files
        flags = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges]
        files = {"vocab-file": vocab, "merge-file": merges}
    elif kind == "CharLevelTokenizer":
        flags, files = ["--tokenizer-type", "CharLevelTokenizer"], {}
    else:
        flags, files = ["--tokenizer", str(tokenizer_file)], {"vocab_file": str(tokenizer_file)}
    prefix = directory / "data" / "enwik8"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    assert (
        main(
            [
                "data",
                "preprocess",
                "--input",
                str(corpus),
                "--output-prefix",
                str(prefix),
                *flags,
                "--append-eod",
                "--no-progress",
            ]
        )
        == 0
    )
    setup = {
        "data_path": f"{prefix}_text_document",
        **files,
        "save": str(directory / "checkpoints"),
        "load": str(directory / "checkpoints"),
        "tensorboard_dir": str(directory / "tb"),
        "log_dir": str(directory / "logs"),
    }
    if "checkpoint_factor" not in model:  # NeoX's save needs a cadence; a file sets each key once
        setup["checkpoint_factor"] = 1000
    if model.get("use_mup"):  # muP's base shapes: the model at half its width, written as NeoX's save_base_shapes
        setup["base_shapes_file"] = str(directory / "base_shapes.bsh")
    path = directory / "local_setup.yml"
    path.write_text("# Suggested data paths when using GPT-NeoX locally\n" + json.dumps(setup, indent=2))
    if model.get("use_mup"):
        assert (
            main(
                [
                    str(NEOX / f"{name}.yml"),
                    str(path),
                    "save_base_shapes=true",
                    f"hidden_size={model['hidden_size'] // 2}",
                ]
            )
            == 0
        )
    return path


def _train(name: str, tmp_path: Path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir) -> tuple[Path, list]:
    setup = local_setup(name, tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir)
    result = run_command(str(NEOX / f"{name}.yml"), str(setup), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    found = losses(read_metrics(tmp_path / "checkpoints"))
    assert len(found) == 3 and all(loss == loss for loss in found), found
    return setup, found


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=() if name in DEFAULT else pytest.mark.slow) for name in FILES]
)
def test_a_neox_file_trains_shrunk_in_two_processes(
    name, tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir
):
    _train(name, tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir)
    assert (tmp_path / "checkpoints" / "checkpoints").is_dir()  # NeoX saves when training ends


@pytest.mark.slow
def test_a_neox_run_restarted_with_the_same_save_and_load_continues(
    tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir
):
    """Extended to 4 iterations; a changed schedule is refused as NeoX refuses it, unless override_lr_scheduler
    (this file's schedule) or use_checkpoint_lr_scheduler (the checkpoint's) says which to take."""
    setup, first = _train("pythia", tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir)
    refused = run_command(str(NEOX / "pythia.yml"), str(setup), "train_iters=4", "lr_decay_iters=4", cwd=tmp_path)
    assert refused.returncode != 0 and "resume_schedule: same: the learning-rate schedule differs" in refused.stderr
    again = run_command(
        str(NEOX / "pythia.yml"),
        str(setup),
        "train_iters=4",
        "lr_decay_iters=4",
        "+use_checkpoint_lr_scheduler=true",
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resum" in again.stdout + again.stderr
    rows = [row for row in read_metrics(tmp_path / "checkpoints") if "loss" in row]
    assert [row["loss"] for row in rows][:3] == first
    assert "resume_schedule: checkpoint: model.optim sched from" in again.stderr
    written = yaml.safe_load((tmp_path / "checkpoints" / "config.yaml").read_text())
    assert written["model"]["optim"]["sched"]["max_steps"] == 3  # the checkpoint's lr_decay_iters


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pythia", "gpt2", "alibi", "sparse", "moe_deepspeed", "rwkv", "mup"])
def test_config_translate_trains_to_the_same_losses(
    name, tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir, capsys
):
    neox_dir, nxdt_dir = tmp_path / "neox", tmp_path / "nxdt"
    neox_dir.mkdir()
    setup, expected = _train(name, neox_dir, corpus, tokenizer_file, gpt2_files, sentencepiece_dir)
    capsys.readouterr()
    assert main(["config", "translate", str(NEOX / f"{name}.yml"), str(setup), "--to", "nxdt"]) == 0
    translated = nxdt_dir / "translated.yaml"
    nxdt_dir.mkdir()
    translated.write_text(capsys.readouterr().out.replace(str(neox_dir / "checkpoints"), str(nxdt_dir / "run")))
    result = run_command(str(translated), cwd=nxdt_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert losses(read_metrics(nxdt_dir / "run")) == expected


def test_a_llama_shaped_neox_file_is_a_llama_for_transformers(tmp_path, sentencepiece_dir):
    """The model a NeoX Llama file describes (rmsnorm's epsilon, NeoX's MLP width rule, no biases, grouped key/value
    heads, untied) exports as a LlamaForCausalLM with the same logits."""
    from nxd_ckpt import export_hf
    from nxd_models import build_causal_lm, causal_lm_logits

    from tests.ckpt.test_hf import checkpoint_of, random_weights, tokens

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = load_config(
            [NEOX / "llama.yml"],
            [
                "model_parallel_size=1",
                "num_gpus=1",
                "sequence_parallel=False",
                f"+vocab_file={sentencepiece_dir / 'tokenizer.model'}",
            ],
        )
        spec = plan_run(config, default_cache_dir(), data_required=False).family.spec
    model = build_causal_lm(spec, seed=1).eval()
    random_weights(model)
    out = export_hf(checkpoint_of(model, spec, tmp_path / "ckpts"), tmp_path / "hf")
    theirs = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(theirs) is LlamaForCausalLM and theirs.config.rms_norm_eps == 1e-6
    assert theirs.config.intermediate_size == 176  # NeoX's rule on intermediate_size 512, mlp_multiple_of 16
    assert theirs.config.num_key_value_heads == 2 and not theirs.config.attention_bias
    ids, positions = tokens(spec.vocab_size)
    with torch.no_grad():
        expected = theirs(input_ids=ids).logits
        found = causal_lm_logits(model, ids, positions)[..., : spec.vocab_size]
    assert (found - expected).abs().max().item() < 1e-5


def test_a_hugging_face_gpt_neox_directory_starts_a_neox_run(
    tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir
):
    """`load` at a directory transformers' GPTNeoXForCausalLM saved (as Pythia's are published) with `finetune`:
    the run starts from those weights, streamed in; with a zero learning rate its export holds them unchanged."""
    from nxd_train.run.loop import train
    from safetensors.torch import load_file
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    hf = GPTNeoXConfig(
        vocab_size=300,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=64,
        rotary_pct=0.25,
        use_parallel_residual=True,
        hidden_act="gelu",
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    GPTNeoXForCausalLM(hf).save_pretrained(tmp_path / "pythia")
    setup = local_setup("pythia", tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir)
    finetune = tmp_path / "finetune.yml"
    finetune.write_text(json.dumps({"load": str(tmp_path / "pythia"), "finetune": True}))
    text = setup.read_text().replace(f'"load": "{tmp_path / "checkpoints"}",', "")
    setup.write_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = load_config(
            [NEOX / "pythia.yml", setup, finetune],
            [
                "num_gpus=1",
                "bias_gelu_fusion=False",
                "optimizer.params.lr=0.0",
                "min_lr=0.0",
                "train_iters=1",
                "lr_decay_iters=1",
            ],
        )
        log_dir = train(plan_run(config, default_cache_dir()))
    assert main(["ckpt", "export-hf", str(log_dir), str(tmp_path / "out")]) == 0
    original, exported = (
        load_file(tmp_path / "pythia" / "model.safetensors"),
        load_file(tmp_path / "out" / "model.safetensors"),
    )
    assert exported.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name


def _pythia_sources(tmp_path: Path) -> tuple[Path, Path]:
    """The same GPT-NeoX model twice: as transformers saves it, and as GPT-NeoX saves it at iteration 2 over two
    tensor-parallel ranks with pipeline layer files (tests/neox_checkpoints.py)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from tests.neox_checkpoints import pythia_parts, write_neox_checkpoint

    hf = GPTNeoXConfig(
        vocab_size=300,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=64,
        rotary_pct=0.25,
        use_parallel_residual=True,
        hidden_act="gelu",
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(hf)
    model.save_pretrained(tmp_path / "pythia")
    write_neox_checkpoint(tmp_path / "neox", pythia_parts(model, 2, 512), iteration=2, pipelined=True)
    return tmp_path / "pythia", tmp_path / "neox"


def _from(load: Path, setup: Path, tmp_path: Path, name: str, *overrides: str, finetune: bool = True) -> list[dict]:
    """A pythia.yml run (exact gelu, as transformers' model computes it) starting from `load`; its metrics. The
    vocabulary is padded to 512 at TP1 and TP2 alike (padding rows take part in the softmax, as in NeoX)."""
    run = tmp_path / name
    start = tmp_path / f"{name}.yml"
    start.write_text(json.dumps({"load": str(load), "finetune": finetune, "save": str(run)}))
    result = run_command(
        str(NEOX / "pythia.yml"),
        str(setup),
        str(start),
        "bias_gelu_fusion=False",
        "make_vocab_size_divisible_by=256",
        *overrides,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return read_metrics(run)


@pytest.fixture
def neox_start(tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir) -> tuple[Path, Path, Path, list]:
    """The HF directory, the NeoX checkpoint, a local_setup without load and save, and the losses of a run that
    starts from the HF directory (the reference)."""
    hf, neox = _pythia_sources(tmp_path)
    setup = local_setup("pythia", tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir)
    settings = json.loads(setup.read_text().split("\n", 1)[1])
    setup.write_text(json.dumps({k: v for k, v in settings.items() if k not in ("load", "save")}))
    return hf, neox, setup, losses(_from(hf, setup, tmp_path, "from_hf"))


@pytest.mark.slow  # the default suite reads NeoX checkpoints in one process (tests/ckpt/test_neox_checkpoint.py)
def test_a_neox_checkpoint_starts_a_run_as_its_weights_do(tmp_path, neox_start):
    """finetune from a checkpoint GPT-NeoX wrote over two tensor-parallel ranks, trained here at TP1 x DP2:
    the losses of the same weights read from transformers' directory."""
    hf, neox, setup, expected = neox_start
    found = losses(_from(neox, setup, tmp_path, "from_neox"))
    assert found == pytest.approx(expected, rel=1e-5, abs=1e-6)
    start = tmp_path / "no_rng.yml"  # resume keys a NeoX checkpoint cannot act on are said to change nothing
    start.write_text(
        json.dumps({"load": str(neox), "finetune": True, "save": str(tmp_path / "again"), "no_load_rng": True})
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan_run(
            load_config(
                [NEOX / "pythia.yml", setup, start], ["bias_gelu_fusion=False", "make_vocab_size_divisible_by=256"]
            ),
            default_cache_dir(),
        )
    assert any(
        "exp_manager.resume_rng: False changes nothing when starting from the GPT-NeoX checkpoint"
        in str(warning.message)
        for warning in caught
    )


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["model_parallel_size=2", "pipe_parallel_size=2"], ids=["tp2", "pp2"])
def test_a_neox_checkpoint_continues_in_other_layouts(tmp_path, neox_start, layout):
    """At TP2 or PP2 (one data-parallel rank, so twice the accumulation for the same batch of 8)."""
    hf, neox, setup, expected = neox_start
    found = losses(_from(neox, setup, tmp_path, "from_neox", layout, "gradient_accumulation_steps=4"))
    assert found == pytest.approx(expected, rel=1e-5, abs=1e-6)


@pytest.mark.slow
def test_a_neox_checkpoint_without_finetune_continues_at_its_iteration(tmp_path, neox_start):
    """Without finetune the run goes on from the checkpoint's iteration (2 of 4): the schedule is where NeoX's is
    at that step, as in a run that trained from step 0."""
    hf, neox, setup, _ = neox_start
    whole = _from(hf, setup, tmp_path, "whole", "train_iters=4", "lr_decay_iters=4")
    continued = _from(neox, setup, tmp_path, "continued", "train_iters=4", "lr_decay_iters=4", finetune=False)
    steps = [row["step"] for row in continued if "loss" in row]
    assert steps == [3, 4]
    assert [row["lr"] for row in continued if "loss" in row] == [row["lr"] for row in whole if "loss" in row][2:]


@pytest.mark.slow  # the default suite trains the prompt alone in tests/models and in two processes in tests/parallel
def test_a_soft_prompt_tunes_a_neox_checkpoint_and_nothing_else_moves(tmp_path, neox_start):
    """soft_prompt_tuning from a checkpoint GPT-NeoX wrote: the prompt starts as init_string's tokens' embedding rows
    of the loaded weights, and from step 1 to step 3 only it changes."""
    from nxd_ckpt import list_checkpoints

    from tests.training_runs import saved_state

    hf, neox, setup, _ = neox_start
    prompt = (
        "soft_prompt_tuning={enabled: true, n_tokens: 4, init_string: def return}",
        "checkpoint_factor=1",
        "max_position_embeddings=68",
    )
    _from(neox, setup, tmp_path, "prompted", *prompt)
    steps = {info.step: info.path for info in list_checkpoints(tmp_path / "prompted" / "checkpoints")}
    first, last = (saved_state(steps[step], "model")["model"] for step in (1, 3))
    moved = sorted(key for key in first if not torch.equal(first[key], last[key]))
    assert moved == ["model.soft_prompt.weight"], moved
    config = load_config(
        [NEOX / "pythia.yml", setup], ["bias_gelu_fusion=False", "make_vocab_size_divisible_by=256", *prompt]
    )
    spec = plan_run(config, default_cache_dir()).family.spec
    tokenizer = Tokenizer.from_file(json.loads(setup.read_text())["vocab_file"])
    assert spec.soft_prompt_init_ids == tuple(tokenizer.encode("def return", add_special_tokens=False).ids)
    assert spec.soft_prompt_tokens == 4


def test_neox_label_files_mask_what_they_say(tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir):
    """train/valid/test_label_data_paths: a label file beside the data file (its tokens, but -100 for the first
    three tokens of every document, as for a prompt) gives the run's labels; one of other documents is named."""
    import numpy as np
    from nxd_data import IndexedDataset, IndexedDatasetWriter

    setup = local_setup("pythia", tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir)
    settings = json.loads(setup.read_text().split("\n", 1)[1])
    data = settings.pop("data_path")
    text = IndexedDataset(data)
    with IndexedDatasetWriter(tmp_path / "labels", np.int32) as writer:
        for document in range(len(text)):
            tokens = text.get(document).astype(np.int32)
            tokens[:3] = -100
            writer.add_document(tokens)

    def plan(labels: Path):
        paths = {f"{split}_data_paths": [data] for split in ("train", "valid", "test")}
        paths |= {f"{split}_label_data_paths": [str(labels)] for split in ("train", "valid", "test")}
        setup.write_text(json.dumps({**settings, **paths}))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return plan_run(load_config([NEOX / "pythia.yml", setup], ["num_gpus=1"]), default_cache_dir())

    planned = plan(tmp_path / "labels")
    eod, masked = planned.data.padding["input_ids"][0].item(), 0
    for index in range(8):
        sample = planned.data.train[index]
        inputs, labels = sample["input_ids"].tolist(), sample["labels"].tolist()
        window = [*inputs, None]
        for position, label in enumerate(labels):
            if position < 3:  # the document start may lie before the window
                continue
            after_eod = eod in inputs[position - 2 : position + 1]  # the next token is among a document's first 3
            assert (label == -100) == after_eod, (index, position)
            masked += after_eod
            assert label == -100 or position + 1 >= len(inputs) or label == window[position + 1]
    assert masked > 0
    with IndexedDatasetWriter(tmp_path / "short", np.int32) as writer:
        writer.add_document([1, 2, 3])
    with pytest.raises(PreflightError, match=r"short.idx: holds 1 documents; expected the 200 of its data file"):
        plan(tmp_path / "short")


def _whole_document_setup(pack_impl, tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir) -> Path:
    setup = local_setup("pythia", tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir)
    settings = json.loads(setup.read_text().split("\n", 1)[1])
    setup.write_text(json.dumps({**settings, "pack_impl": pack_impl}))
    return setup


@pytest.mark.parametrize("pack_impl", ["pack_until_overflow", "unpacked"])
def test_neox_whole_document_samples_start_at_documents(
    pack_impl, tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir
):
    """pack_impl: every training sample starts at a document's start and holds whole documents (unpacked: one
    end of document at most), the rest padding that is not trained on."""
    from nxd_data import IndexedDataset

    setup = _whole_document_setup(pack_impl, tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        planned = plan_run(load_config([NEOX / "pythia.yml", setup], ["num_gpus=1"]), default_cache_dir())
    text = IndexedDataset(json.loads(setup.read_text())["data_path"])
    starts = {tuple(text.get(d)[:4].tolist()) for d in range(len(text))}
    eod = planned.data.padding["input_ids"][0].item()
    for index in range(8):
        sample = planned.data.train[index]
        inputs, labels = sample["input_ids"].tolist(), sample["labels"].tolist()
        assert tuple(inputs[:4]) in starts, index
        trained = sum(label != -100 for label in labels)
        ends = [p for p, token in enumerate(inputs[: trained + 1]) if token == eod]
        assert pack_impl == "pack_until_overflow" or len(ends) <= 1, (index, ends)  # one document at most
        assert all(label == -100 for label in labels[trained:]), index  # padding is not trained on


@pytest.mark.slow
def test_a_neox_run_trains_on_unpacked_documents(tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir):
    setup = _whole_document_setup("unpacked", tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir)
    result = run_command(str(NEOX / "pythia.yml"), str(setup), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    found = losses(read_metrics(tmp_path / "checkpoints"))
    assert len(found) == 3 and all(loss == loss for loss in found), found


@pytest.mark.slow
def test_a_neox_run_on_the_older_cached_format_trains_as_on_mmap(
    tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir
):
    """data_impl: cached reads the same documents rewritten in the older format (as NeoX's builder lays them
    out) to the very same losses."""
    from nxd_data import IndexedDataset

    from tests.data.test_legacy_index import write_legacy

    setup, expected = _train("pythia", tmp_path / "mmap", corpus, tokenizer_file, gpt2_files, sentencepiece_dir)
    written = yaml.safe_load(setup.read_text())
    text = IndexedDataset(written["data_path"])
    legacy = tmp_path / "cached" / "data" / "enwik8_text_document"
    legacy.parent.mkdir(parents=True)
    write_legacy(
        legacy, [text[i].tolist() for i in range(len(text))], text.dtype.name, ends=text.document_indices[1:].tolist()
    )
    folders = {
        key: str(tmp_path / "cached" / Path(value).name)
        for key, value in written.items()
        if key in ("save", "load", "tensorboard_dir", "log_dir")
    }
    cached = tmp_path / "cached" / "local_setup.yml"
    cached.write_text(json.dumps({**written, **folders, "data_path": str(legacy)}))
    result = run_command(str(NEOX / "pythia.yml"), str(cached), "data_impl=cached", cwd=tmp_path / "cached")
    assert result.returncode == 0, result.stderr[-3000:]
    assert losses(read_metrics(tmp_path / "cached" / "checkpoints")) == expected


@pytest.mark.slow
def test_an_elastic_neox_run_resumed_on_one_process_keeps_its_batch(
    tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir
):
    """DeepSpeed's elasticity with micro-batches 1 and 2 under 8 gives the global batch 8 (valid on 1, 2, 4 and 8
    ranks): two processes take micro-batches of 2 twice, one process four times. Resumed on one process from the
    two-process run's iteration 2, it continues with that run's losses."""
    elastic = {
        "elasticity": {
            "enabled": True,
            "max_train_batch_size": 8,
            "micro_batch_sizes": [1, 2],
            "ignore_non_elastic_batch_info": True,
            "version": 0.1,
        }
    }
    setup = local_setup("pythia", tmp_path, corpus, tokenizer_file, gpt2_files, sentencepiece_dir)
    setup.write_text(json.dumps({**yaml.safe_load(setup.read_text()), **elastic, "checkpoint_factor": 2}))
    job = ["train_iters=4", "lr_decay_iters=4"]
    whole = run_command(str(NEOX / "pythia.yml"), str(setup), *job, cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert "the global batch 8 in micro-batches of 2 on 2 data-parallel rank(s)" in whole.stderr
    expected = losses(read_metrics(tmp_path / "checkpoints"))
    resumed_dir = tmp_path / "resumed"
    from tests.train.test_checkpointing import checkpoints

    step_2 = checkpoints(tmp_path / "checkpoints")[2]
    resumed = run_command(
        str(NEOX / "pythia.yml"), str(setup), *job, "num_gpus=1", f"save={resumed_dir}", f"load={step_2}", cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "the global batch 8 in micro-batches of 2 on 1 data-parallel rank(s)" in resumed.stderr
    found = losses(read_metrics(resumed_dir))
    assert len(found) == 2 and max(abs(a - b) for a, b in zip(found, expected[2:], strict=True)) < 1e-5, (
        found,
        expected,
    )
