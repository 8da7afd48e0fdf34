"""Layouts the model cannot take are refused before any process starts, naming the key."""

from __future__ import annotations

import pytest
from nxd_config import ConfigError, load_config
from nxd_train.cli import default_config_path
from nxd_train.corpus import default_cache_dir
from nxd_train.preflight import PreflightError, plan_run


def _problems(*overrides: str, source=None) -> list[str]:
    cfg = load_config(source or default_config_path(), list(overrides))
    with pytest.raises(PreflightError) as caught:
        plan_run(cfg, default_cache_dir())
    return caught.value.problems


def _hf_source(tmp_path, heads: int, kv_heads: int, hidden: int = 48):
    (tmp_path / "config.json").write_text(
        f'{{"model_type": "llama", "hidden_size": {hidden}, "intermediate_size": 64, "num_hidden_layers": 1, '
        f'"num_attention_heads": {heads}, "num_key_value_heads": {kv_heads}, "vocab_size": 4096, '
        '"max_position_embeddings": 128}'
    )
    source = tmp_path / "run.yaml"
    source.write_text(
        "name: tiny_hf\nmodel_source: hf\ntrainer: {max_steps: 3, devices: 1}\nprecision: {type: fp32}\n"
        "exp_manager: {create_checkpoint_callback: False}\n"
        "data: {micro_batch_size: 2, global_batch_size: 4}\ndistributed_strategy: {tensor_model_parallel_size: 1}\n"
        f"model:\n  model_config: {tmp_path / 'config.json'}\n  encoder_seq_length: 64\n"
        "  optim: {name: adamw, lr: 1e-3}\n"
    )
    return source


def test_a_layout_larger_than_the_world_is_a_config_error():
    with pytest.raises(ConfigError, match="distributed_strategy"):
        load_config(default_config_path(), ["distributed_strategy.tensor_model_parallel_size=4", "trainer.devices=2"])


def test_hf_heads_not_divisible_by_tp_are_named(tmp_path):
    problems = _problems("distributed_strategy.tensor_model_parallel_size=4", "trainer.devices=4",
                         source=_hf_source(tmp_path, heads=6, kv_heads=2))  # fmt: skip
    assert problems == [
        "model.model_config: num_attention_heads: expected a multiple of tensor_model_parallel_size (4), found 6",
        "distributed_strategy.kv_replicator: 2 KV heads x 1 = 2; expected a multiple of tensor_model_parallel_size (4)",
    ]


def test_hf_kv_heads_fewer_than_tp_need_the_kv_replicator(tmp_path):
    source = _hf_source(tmp_path, heads=4, kv_heads=1, hidden=32)
    problems = _problems("distributed_strategy.tensor_model_parallel_size=2", "trainer.devices=2", source=source)
    assert problems == [
        "distributed_strategy.kv_replicator: 1 KV heads x 1 = 1; expected a multiple of tensor_model_parallel_size (2)"
    ]
    cfg = load_config(source, ["distributed_strategy.tensor_model_parallel_size=2", "trainer.devices=2",
                               "+distributed_strategy.kv_replicator=2"])  # fmt: skip
    plan_run(cfg, default_cache_dir())  # accepted with two copies


def test_a_recompute_list_naming_no_module_is_refused():
    problems = _problems("model.activations_checkpoint_granularity=selective",
                         "+model.activations_checkpoint_recompute=[CoreAttention,FlashAttn]")  # fmt: skip
    assert problems == [
        "model.activations_checkpoint_recompute: FlashAttn names no module of GPTForCausalLM; expected class names "
        "such as CoreAttention"
    ]


def test_a_gelu_model_with_biases_is_accepted_for_tensor_parallelism():
    cfg = load_config(default_config_path(), ["model.activation=gelu", "model.normalization=layernorm",
                                              "model.has_bias=True", "trainer.devices=2",
                                              "distributed_strategy.tensor_model_parallel_size=2"])  # fmt: skip
    assert plan_run(cfg, default_cache_dir()).model.activation == "gelu"


def test_tensor_parallel_keys_without_tensor_parallelism_are_noticed():
    from nxd_config import ConfigNotice

    cfg = load_config(default_config_path(), ["distributed_strategy.sequence_parallel=True"])
    with pytest.warns(ConfigNotice, match="distributed_strategy.sequence_parallel: True acts across tensor-parallel "
                                          "ranks; with tensor_model_parallel_size 1 it changes nothing"):  # fmt: skip
        plan_run(cfg, default_cache_dir())
