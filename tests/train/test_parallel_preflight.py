"""Layouts the model cannot take are refused before any process starts, naming the key."""

from __future__ import annotations

import pytest
from nxd_config import ConfigError, load_config
from nxd_train.checks.preflight import PreflightError, plan_run
from nxd_train.cli import default_config_path
from nxd_train.run.corpus import default_cache_dir


def _problems(*overrides: str, source=None) -> list[str]:
    cfg = load_config(source or default_config_path(), list(overrides))
    with pytest.raises(PreflightError) as caught:
        plan_run(cfg, default_cache_dir())
    return caught.value.problems


def _hf_source(tmp_path, heads: int, kv_heads: int, hidden: int = 48, tied: bool = False):
    (tmp_path / "config.json").write_text(
        f'{{"model_type": "llama", "hidden_size": {hidden}, "intermediate_size": 64, "num_hidden_layers": 1, '
        f'"num_attention_heads": {heads}, "num_key_value_heads": {kv_heads}, "vocab_size": 4096, '
        f'"max_position_embeddings": 128, "tie_word_embeddings": {str(tied).lower()}}}'
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
    problems = _problems(
        "distributed_strategy.tensor_model_parallel_size=4",
        "trainer.devices=4",
        source=_hf_source(tmp_path, heads=6, kv_heads=2),
    )
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
    cfg = load_config(
        source,
        [
            "distributed_strategy.tensor_model_parallel_size=2",
            "trainer.devices=2",
            "+distributed_strategy.kv_replicator=2",
        ],
    )
    plan_run(cfg, default_cache_dir())  # accepted with two copies


def test_a_recompute_list_naming_no_module_is_refused():
    problems = _problems(
        "model.activations_checkpoint_granularity=selective",
        "+model.activations_checkpoint_recompute=[CoreAttention,FlashAttn]",
    )
    assert problems == [
        "model.activations_checkpoint_recompute: FlashAttn names no module of GPTForCausalLM; expected class names "
        "such as CoreAttention, ActivationMultiplyMLP, LlamaMLP, LlamaRMSNorm, MLP, RMSNorm, SelfAttention"
    ]


def test_a_gelu_model_with_biases_is_accepted_for_tensor_parallelism():
    cfg = load_config(
        default_config_path(),
        [
            "model.activation=gelu",
            "model.normalization=layernorm",
            "model.has_bias=True",
            "trainer.devices=2",
            "distributed_strategy.tensor_model_parallel_size=2",
        ],
    )
    assert plan_run(cfg, default_cache_dir()).family.spec.activation == "gelu"


def test_parallel_keys_without_their_parallelism_are_noticed():
    from nxd_config import ConfigNotice

    cfg = load_config(default_config_path(), ["distributed_strategy.sequence_parallel=True"])
    with pytest.warns(
        ConfigNotice,
        match="distributed_strategy.sequence_parallel: True acts across tensor-parallel "
        "ranks; with tensor_model_parallel_size 1 it changes nothing",
    ):
        plan_run(cfg, default_cache_dir())
    cfg = load_config(default_config_path(), ["+model.fusions.ring_attention=True"])
    with pytest.warns(
        ConfigNotice,
        match="model.fusions.ring_attention: True acts across context-parallel ranks; "
        "with context_parallel_size 1 attention runs unsplit",
    ):
        plan_run(cfg, default_cache_dir())


PP2 = ["trainer.devices=2", "distributed_strategy.pipeline_model_parallel_size=2"]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["+model.pipeline_cuts=[model.layers.7]"],
            "model.pipeline_cuts: 'model.layers.7' names no decoder layer; expected model.layers.0 to model.layers.1",
        ),
        (
            ["+model.pipeline_cuts=[model.layers.1]"],
            "model.pipeline_cuts: expected cuts after layers 0 to 0 (the last layer ends the last stage), found [1]",
        ),
        (
            ["model.share_embeddings_and_output_weights=True"],
            "model.share_embeddings_and_output_weights: expected False with pipeline parallelism (the embedding and the "
            "output layer live on different stages), found True",
        ),
        (
            ["trainer.devices=4", "distributed_strategy.pipeline_model_parallel_size=4", "data.micro_batch_size=2"],
            "distributed_strategy.pipeline_model_parallel_size: 4 pipeline stages need at least as many layers, found 2",
        ),
    ],
    ids=["missing-layer", "cut-after-the-last-layer", "tied-embeddings", "more-stages-than-layers"],
)
def test_pipeline_layouts_the_model_cannot_take_are_named(overrides, expected):
    assert _problems(*PP2, *overrides) == [expected]


def test_pipeline_cut_count_and_interleaving_are_config_errors():
    with pytest.raises(
        ConfigError,
        match=r"model.pipeline_cuts: expected pipeline_model_parallel_size - 1 = 1 "
        r"cut\(s\), found 2",
    ):
        load_config(default_config_path(), [*PP2, "+model.pipeline_cuts=[model.layers.0,model.layers.1]"])
    with pytest.raises(
        ConfigError,
        match=r"model.num_layers: expected a multiple of pipeline \* virtual pipeline "
        r"sizes \(2 \* 2 = 4\), found 2",
    ):
        load_config(default_config_path(), [*PP2, "distributed_strategy.virtual_pipeline_model_parallel_size=2"])


def test_context_parallel_needs_an_evenly_split_sequence_and_no_attention_dropout():
    cp = ["trainer.devices=2", "distributed_strategy.context_parallel_size=2", "+model.fusions.ring_attention=True"]
    with pytest.raises(ConfigError, match=r"expected a multiple of 2 \* context_parallel_size \(4\)"):
        load_config(default_config_path(), [*cp, "model.encoder_seq_length=62"])
    with pytest.raises(ConfigError, match="model.fusions.ring_attention: expected True"):
        load_config(default_config_path(), cp[:2])
    assert _problems(*cp, "model.attention_dropout=0.1") == [
        "model.attention_dropout: expected 0 with context parallelism (ring attention has no dropout), found 0.1"
    ]


def test_pipeline_stages_of_a_hugging_face_model_refuse_tied_embeddings_and_unknown_cuts(tmp_path):
    source = _hf_source(tmp_path, heads=4, kv_heads=2, tied=True)
    problems = _problems(
        "trainer.devices=2",
        "+distributed_strategy.pipeline_model_parallel_size=2",
        "+model.num_layers=2",
        source=source,
    )
    assert problems == [
        "model.model_config: tie_word_embeddings: expected false in config.json with pipeline "
        "parallelism (the embedding and the output layer live on different stages), found true"
    ]
    (tmp_path / "untied").mkdir()
    untied = _hf_source(tmp_path / "untied", heads=4, kv_heads=2)
    assert _problems(
        "trainer.devices=2",
        "+distributed_strategy.pipeline_model_parallel_size=2",
        "+model.num_layers=2",
        "+model.pipeline_cuts=[model.layers.3]",
        source=untied,
    ) == ["model.pipeline_cuts: 'model.layers.3' names no decoder layer; expected model.layers.0 to model.layers.1"]


def test_a_sliding_window_trains_and_is_refused_where_it_cannot_hold(train_here):
    """model.sliding_window_size (Megatron-style Mistral): a window below the sequence trains; one longer
    than the sequence trains as full causal attention; context parallelism below the sequence length is
    refused by key."""
    mistral = [
        "model.position_embedding_type=rope",
        "model.normalization=rmsnorm",
        "model.activation=swiglu",
        "model.has_bias=False",
        "trainer.max_steps=2",
    ]
    rows = train_here(*mistral, "+model.sliding_window_size=16")
    assert len([row for row in rows if "loss" in row]) == 2
    seq = load_config(default_config_path()).seq_length
    wide, full = train_here(*mistral, f"+model.sliding_window_size={seq + 1}"), train_here(*mistral)
    assert [row["loss"] for row in wide if "loss" in row] == [row["loss"] for row in full if "loss" in row]
    problems = _problems(
        *mistral,
        "+model.sliding_window_size=16",
        "trainer.devices=2",
        "distributed_strategy.context_parallel_size=2",
        "+model.fusions.ring_attention=True",
    )
    assert problems == [
        f"model.sliding_window_size: ring attention has no sliding window; expected null or at least "
        f"the sequence length ({seq}) with context parallelism, found 16"
    ]


def test_every_stage_reports_in_one_run(tmp_path):
    """An optimizer key, the data and a recompute name, each wrong: one refusal lists all three, so a
    user fixing one does not meet the next on the next run."""
    problems = _problems(
        "model.optim={name: adafactor, lr: null, relative_step: True, sched: {name: CosineAnnealing, max_steps: 4}}",
        f"+data.data_prefix={tmp_path / 'none'}",
        "+data.tokenizer.type=" + str(tmp_path / "none"),
        "model.activations_checkpoint_granularity=selective",
        "+model.activations_checkpoint_recompute=[FlashAttn]",
    )
    assert [problem.split(":")[0] for problem in problems] == [
        "model.optim.sched",
        "data.tokenizer.type",
        "model.activations_checkpoint_recompute",
    ]
