"""NxDT's family shapes as configs/ ships them, shrunk to 2 gloo processes and 2 layers (4 for pipeline
stages) with their own features kept, each trains 3 steps. Megatron-style (TP 2 with sequence parallel,
ZeRO-1, mixed precision, selective recompute, their tokenizer form, Mistral's sliding window) on indexed
data the test preprocesses with that very tokenizer; Hugging Face Llama 3 8B (TP, kv_replicator, the QKV
module) and 70B (pipeline stages) on data already tokenised, as NxDT's HF recipes read it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from nxd_train.cli import main

from tests.conftest import TEXT
from tests.training_runs import losses, read_metrics, run_command

ROOT = Path(__file__).resolve().parents[2]
SHRINK = [
    "trainer.devices=2",
    "trainer.num_nodes=1",
    "trainer.max_steps=3",
    "model.num_layers=2",
    "model.hidden_size=64",
    "model.ffn_hidden_size=128",
    "model.num_attention_heads=4",
    "model.encoder_seq_length=64",
    "data.global_batch_size=4",
    "data.splits_string=90,5,5",
    "data.num_workers=0",
    "distributed_strategy.tensor_model_parallel_size=2",
    "model.optim.sched.warmup_steps=1",
    "exp_manager.resume_if_exists=False",
    "exp_manager.create_checkpoint_callback=False",
    "exp_manager.create_tensorboard_logger=False",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    generator = random.Random(1)
    path = tmp_path_factory.mktemp("example_corpus") / "docs.jsonl"
    path.write_text(
        "".join(
            json.dumps({"text": " ".join(generator.choices(TEXT, k=generator.randint(3, 9)))}) + "\n"
            for _ in range(160)
        )
    )
    return path


def _tokenizer(form: str, gpt2_files, sentencepiece_dir) -> tuple[list[str], list[str]]:
    """The config keys and the `data preprocess` flags of one tokenizer form."""
    if form == "gpt2":
        vocab, merges = gpt2_files
        return (
            [f"data.tokenizer.vocab_file={vocab}", f"data.tokenizer.merge_file={merges}"],
            ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges],
        )
    return [f"data.tokenizer.type={sentencepiece_dir}"], ["--tokenizer", str(sentencepiece_dir)]


@pytest.mark.parametrize(
    ("config", "form", "shape"),
    [
        ("megatron_gpt", "gpt2", []),
        pytest.param("megatron_llama_7B", "sentencepiece", ["model.num_kv_heads=2"], marks=pytest.mark.slow),
        pytest.param("megatron_mistral", "sentencepiece", ["model.num_kv_heads=2"], marks=pytest.mark.slow),
    ],
)
def test_a_shipped_family_config_trains_shrunk(config, form, shape, corpus, gpt2_files, sentencepiece_dir, tmp_path):
    keys, flags = _tokenizer(form, gpt2_files, sentencepiece_dir)
    assert (
        main(
            [
                "data",
                "preprocess",
                "--input",
                str(corpus),
                "--output-prefix",
                str(tmp_path / "data"),
                *flags,
                "--append-eod",
                "--no-progress",
            ]
        )
        == 0
    )
    result = run_command(
        "-c",
        str(ROOT / "configs" / f"{config}.yaml"),
        *SHRINK,
        *shape,
        *keys,
        f"data.data_prefix=[1.0,{tmp_path / 'data_text_document'}]",
        f"exp_manager.explicit_log_dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(losses(read_metrics(tmp_path / "run"))) == 3


HF_SHRINK = [
    "trainer.devices=2",
    "trainer.num_nodes=1",
    "trainer.log_every_n_steps=1",
    "model.num_layers=2",
    "model.hidden_size=64",
    "model.encoder_seq_length=64",
    "model.max_position_embeddings=64",
    "data.global_batch_size=4",
    "model.optim.sched.warmup_steps=1",
    "exp_manager.resume_if_exists=False",
    "exp_manager.create_tensorboard_logger=False",
]
VOCAB = 256


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory) -> Path:
    """NxDT's HF recipes read data already tokenised: an `input_ids` column, no tokenizer named."""
    import datasets

    generator = random.Random(2)
    path = tmp_path_factory.mktemp("tokenized") / "train"
    rows = [[generator.randrange(VOCAB) for _ in range(65)] for _ in range(48)]
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(str(path))
    return path


def _small_model_config(shipped: str, directory: Path, kv_heads: int) -> Path:
    """The shipped config.json with the same architecture at a test's width (4 query heads)."""
    content = json.loads((ROOT / "configs" / "hf" / shipped).read_text())
    content |= {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": kv_heads,
        "vocab_size": VOCAB,
        "max_position_embeddings": 64,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    path = directory / "config.json"
    path.write_text(json.dumps(content))
    return path


@pytest.mark.slow  # the HF family trains by default in the QEfficient, LoRA, SFT and preference tests
def test_hf_llama3_8B_trains_shrunk(tokenized, tmp_path):
    """TP 2 with sequence parallel, kv_replicator 2 over one KV head, the fused QKV module, ZeRO-1, mixed
    precision with fp32 optimizer state and CoreAttention recompute, on pre-tokenised data."""
    model_config = _small_model_config("llama3_8B_config.json", tmp_path, kv_heads=1)
    result = run_command(
        "-c",
        str(ROOT / "configs" / "hf_llama3_8B.yaml"),
        *HF_SHRINK,
        "trainer.max_steps=3",
        "distributed_strategy.tensor_model_parallel_size=2",
        "distributed_strategy.kv_replicator=2",
        f"model.model_config={model_config}",
        f"data.train_dir={tokenized}",
        "exp_manager.create_checkpoint_callback=False",
        f"exp_manager.explicit_log_dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(losses(read_metrics(tmp_path / "run"))) == 3


@pytest.mark.slow  # pipeline resume and Mixtral export stay in the default suite's own tests
def test_hf_llama3_70B_trains_shrunk_in_pipeline_stages_and_resumes_in_one_process(tokenized, tmp_path):
    """Two pipeline stages of a 4-layer HF Llama with the fused QKV module, ZeRO-1, mixed precision and
    CoreAttention + LlamaMLP recompute; its step-2 checkpoint resumes in one process, which then
    computes the step-3 loss the pipeline run computed."""
    model_config = _small_model_config("llama3_70B_config.json", tmp_path, kv_heads=2)
    common = [
        "-c",
        str(ROOT / "configs" / "hf_llama3_70B.yaml"),
        *HF_SHRINK,
        "model.num_layers=4",
        "trainer.max_steps=3",
        "distributed_strategy.tensor_model_parallel_size=1",
        "distributed_strategy.kv_replicator=1",
        f"model.model_config={model_config}",
        f"data.train_dir={tokenized}",
    ]
    staged = run_command(
        *common,
        "distributed_strategy.pipeline_model_parallel_size=2",
        "exp_manager.checkpoint_callback_params.every_n_train_steps=2",
        "exp_manager.checkpoint_callback_params.save_top_k=-1",
        f"exp_manager.explicit_log_dir={tmp_path / 'staged'}",
        cwd=tmp_path,
    )
    assert staged.returncode == 0, staged.stderr[-3000:]
    expected = losses(read_metrics(tmp_path / "staged"))
    (step_2,) = (tmp_path / "staged" / "checkpoints").glob("*step=2*")
    single = run_command(
        *common,
        "trainer.devices=1",
        "distributed_strategy.pipeline_model_parallel_size=1",
        "exp_manager.create_checkpoint_callback=False",
        f"exp_manager.resume_from_checkpoint={step_2}",
        f"exp_manager.explicit_log_dir={tmp_path / 'single'}",
        cwd=tmp_path,
    )
    assert single.returncode == 0, single.stderr[-3000:]
    resumed = read_metrics(tmp_path / "single")
    assert len(expected) == 3 and [row["step"] for row in resumed if "loss" in row] == [3.0]
    assert abs(losses(resumed)[0] - expected[2]) < 1e-6


@pytest.mark.slow  # MoE over two ranks runs by default in tests/parallel/test_parity (moe-ep2, mixtral-tp2-sp)
def test_megatron_mixtral_trains_shrunk_with_experts_over_two_ranks_and_resumes_in_one_process(
    corpus, sentencepiece_dir, tmp_path
):
    """Mixtral's MoE (4 experts, top-2, capacity factor 2, the load-balancing loss) with its experts over two
    expert-parallel ranks, ZeRO-1, mixed precision and full recompute; the step-2 checkpoint resumes in one
    process, which computes the step-3 loss the two ranks computed, and the log shows the routing."""
    keys, flags = _tokenizer("sentencepiece", None, sentencepiece_dir)
    assert (
        main(
            [
                "data",
                "preprocess",
                "--input",
                str(corpus),
                "--output-prefix",
                str(tmp_path / "data"),
                *flags,
                "--append-eod",
                "--no-progress",
            ]
        )
        == 0
    )
    common = [
        "-c",
        str(ROOT / "configs" / "megatron_mixtral_8x7b.yaml"),
        *SHRINK,
        *keys,
        "model.num_kv_heads=2",
        "distributed_strategy.tensor_model_parallel_size=1",
        "distributed_strategy.pipeline_model_parallel_size=1",
        "distributed_strategy.kv_replicator=1",
        "model.moe.num_experts=4",
        "trainer.log_every_n_steps=1",
        f"data.data_prefix=[1.0,{tmp_path / 'data_text_document'}]",
    ]
    experts = run_command(
        *common,
        "distributed_strategy.expert_model_parallel_size=2",
        "exp_manager.create_checkpoint_callback=True",
        "exp_manager.checkpoint_callback_params.every_n_train_steps=2",
        "exp_manager.checkpoint_callback_params.save_top_k=-1",
        f"exp_manager.explicit_log_dir={tmp_path / 'ep2'}",
        cwd=tmp_path,
    )
    assert experts.returncode == 0, experts.stderr[-3000:]
    rows = read_metrics(tmp_path / "ep2")
    assert len(losses(rows)) == 3 and all(0 < row["moe_aux_loss"] < 4 for row in rows if "loss" in row)
    assert all(
        0 <= row["moe_dropped_fraction"] < 1 and row["moe_expert_load_max"] >= 1 for row in rows if "loss" in row
    )
    (step_2,) = (tmp_path / "ep2" / "checkpoints").glob("*step=2*")
    single = run_command(
        *common,
        "trainer.devices=1",
        f"exp_manager.resume_from_checkpoint={step_2}",
        f"exp_manager.explicit_log_dir={tmp_path / 'one'}",
        cwd=tmp_path,
    )
    assert single.returncode == 0, single.stderr[-3000:]
    assert abs(losses(read_metrics(tmp_path / "one"))[0] - losses(rows)[2]) < 1e-6


@pytest.mark.slow  # pipeline resume and Mixtral export stay in the default suite's own tests
def test_hf_mixtral_trains_shrunk_and_exports_a_mixtral(tokenized, tmp_path):
    """A dropless Mixtral from its config.json: TP 2 with sequence parallel inside the experts, kv_replicator
    2 over one KV head, the fused QKV module, ZeRO-1, mixed precision, full recompute; its checkpoint
    exports a directory transformers loads as a MixtralForCausalLM, whose logits equal the trained model's."""
    import torch
    from nxd_models import HFOverrides, MoESpec, build_causal_lm, causal_lm_logits, load_hf_config
    from transformers import AutoModelForCausalLM

    from tests.training_runs import saved_state

    model_config = _small_model_config("mixtral_8x7b_config.json", tmp_path, kv_heads=1)
    result = run_command(
        "-c",
        str(ROOT / "configs" / "hf_mixtral_8x7b.yaml"),
        *HF_SHRINK,
        "trainer.max_steps=3",
        "distributed_strategy.tensor_model_parallel_size=2",
        "distributed_strategy.kv_replicator=2",
        "distributed_strategy.pipeline_model_parallel_size=1",
        "model.moe.num_experts=4",
        f"model.model_config={model_config}",
        f"data.train_dir={tokenized}",
        "exp_manager.checkpoint_callback_params.every_n_train_steps=3",
        f"exp_manager.explicit_log_dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [row for row in read_metrics(tmp_path / "run") if "loss" in row]
    assert len(rows) == 3 and all(row["moe_dropped_fraction"] == 0 for row in rows)
    assert main(["ckpt", "export-hf", str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    assert type(exported).__name__ == "MixtralForCausalLM" and exported.config.num_local_experts == 4
    moe = MoESpec(
        num_experts=4, top_k=2, normalize_top_k_affinities=True, router_aux_loss=True, router_aux_loss_coef=0.02
    )  # the config's moe block, dropless
    ours = build_causal_lm(
        load_hf_config(model_config, HFOverrides(num_layers=2, hidden_size=64, qkv_linear=True, moe=moe))
    ).eval()
    (checkpoint,) = (tmp_path / "run" / "checkpoints").glob("*step=3*")
    ours.load_state_dict({key: value.float() for key, value in saved_state(checkpoint, "model")["model"].items()})
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        found = causal_lm_logits(ours, ids, torch.arange(16).expand(2, 16))
        assert (found - exported(input_ids=ids).logits).abs().max().item() < 1e-5
