"""GPT-NeoX config files: read and merged as NeoX reads them, every argument mapped, noticed or refused, NeoX's
defaults and derivations, one clear message per problem naming the file and key."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
from nxd_config import ConfigError, ConfigNotice, load_config, to_nxdt_yaml
from nxd_config.neox import NEOX_KEYS, KeyStatus
from nxd_config.neox.translate import translate

MODEL: dict[str, Any] = {
    "num_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "seq_length": 128,
    "max_position_embeddings": 128,
    "optimizer": {"type": "Adam", "params": {"lr": 0.0006, "betas": [0.9, 0.95], "eps": 1.0e-8}},
    "train_micro_batch_size_per_gpu": 2,
    "train_iters": 10,
}
"""The least a NeoX file needs to train (NeoX requires these too)."""


def write(directory: Path, name: str, content: dict[str, Any] | str) -> Path:
    path = directory / name
    path.write_text(content if isinstance(content, str) else json.dumps(content, indent=1))
    return path


def load(tmp_path: Path, *contents: dict[str, Any] | str, overrides: tuple[str, ...] = (), **kwargs: Any):
    paths = [write(tmp_path, f"f{index}.yml", content) for index, content in enumerate(contents)]
    return load_config(paths, overrides, **kwargs)


def errors(tmp_path: Path, *contents: dict[str, Any] | str, **kwargs: Any) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, *contents, **kwargs)
    return [issue.render(caught.value.source) for issue in caught.value.issues]


def notices(tmp_path: Path, *contents: dict[str, Any] | str, **kwargs: Any) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load(tmp_path, *contents, **kwargs)
    return [str(warning.message) for warning in caught if issubclass(warning.category, ConfigNotice)]


# --------------------------------------------------------------------------- reading and merging


def test_neox_json_like_files_load_with_comments_trailing_commas_and_python_booleans(tmp_path):
    text = """# a NeoX config
{
  "num-layers": 4, "hidden_size": 64, "num_attention_heads": 4,
  "seq_length": 128, "max_position_embeddings": 128,
  "optimizer": {"type": "Adam", "params": {"lr": 6e-4,},},   # 6e-4 is a number here
  "train_micro_batch_size_per_gpu": 2, "train_iters": 10,
  "no_weight_tying": True,
  "sliding_window_width": None,
}
"""
    config = load(tmp_path, text)
    assert config.model.num_layers == 4 and config.model.optim.lr == 6e-4
    assert config.model.share_embeddings_and_output_weights is False and config.model.sliding_window_size is None


def test_files_merge_with_dashes_and_underscores_as_one_key(tmp_path):
    config = load(tmp_path, {**MODEL, "hidden-dropout": 0.1}, {"save": "runs/x", "checkpoint-factor": 5})
    assert config.model.hidden_dropout == 0.1
    assert config.exp_manager.explicit_log_dir == "runs/x"
    assert config.exp_manager.checkpoint_callback_params.every_n_train_steps == 5


def test_a_key_set_again_in_a_later_file_names_both_files(tmp_path):
    found = errors(tmp_path, MODEL, {"train-iters": 20})
    assert found == [
        f"{tmp_path / 'f0.yml'}, {tmp_path / 'f1.yml'}: train-iters: set again in {tmp_path / 'f1.yml'}; "
        f"it was already set by {tmp_path / 'f0.yml'} (GPT-NeoX takes each key from one file: remove one "
        f"of them)"
    ]


def test_the_dialect_is_recognised_and_can_be_forced(tmp_path):
    assert load(tmp_path, MODEL).model.num_layers == 4
    assert load(tmp_path, MODEL, dialect="neox").model.num_layers == 4
    found = errors(tmp_path, MODEL, dialect="nxdt")
    assert any("num_layers: unknown key" in message for message in found)


def test_neox_and_nxdt_files_together_are_refused(tmp_path):
    nxdt = {"trainer": {"max_steps": 3}, "model": {"num_layers": 2}}
    found = errors(tmp_path, MODEL, nxdt)
    assert found == [
        f"{tmp_path / 'f0.yml'}: a GPT-NeoX config, and {tmp_path / 'f1.yml'} an NxDT config; expected "
        f"files of one dialect"
    ]


def test_two_nxdt_files_are_refused(tmp_path):
    nxdt = {"trainer": {"max_steps": 3}}
    found = errors(tmp_path, nxdt, nxdt)
    assert found == [
        f"{tmp_path / 'f1.yml'}: a second NxDT config after {tmp_path / 'f0.yml'}; expected one (NxDT takes one file)"
    ]


def test_unknown_keys_get_a_did_you_mean(tmp_path):
    assert errors(tmp_path, {**MODEL, "num_layer": 3}) == [
        f"{tmp_path / 'f0.yml'}: num_layer: unknown key; expected a GPT-NeoX argument (did you mean 'num_layers'?)"
    ]


def test_overrides_name_neox_keys_in_either_spelling(tmp_path):
    config = load(
        tmp_path, MODEL, overrides=("num-layers=2", "optimizer.params.lr=1e-3", "lr_decay_style=cosine", "+warmup=0.1")
    )
    assert config.model.num_layers == 2 and config.model.optim.lr == 1e-3
    assert config.model.optim.sched.decay_style == "cosine" and config.model.optim.sched.warmup_ratio == 0.1
    assert errors(tmp_path, MODEL, overrides=("lr_decay_styel=cosine",)) == [
        f"{tmp_path / 'f0.yml'}: lr_decay_styel: unknown key; expected a GPT-NeoX argument (did you mean "
        "'lr_decay_style'?)"
    ]


def test_a_bad_value_names_the_file_the_neox_key_and_the_nxd_key(tmp_path):
    assert errors(tmp_path, MODEL, {"hidden_dropout": "x"}) == [
        f"{tmp_path / 'f1.yml'}: hidden_dropout (nxd: model.hidden_dropout): expected a number, found 'x'"
    ]


# --------------------------------------------------------------------------- the key table


def test_every_neox_argument_is_mapped_noticed_or_refused():
    listed = Path(__file__).parent / "data" / "neox_argument_names.txt"
    names = [line for line in listed.read_text().splitlines() if line and not line.startswith("#")]
    assert len(names) == 332
    assert sorted(set(names) - set(NEOX_KEYS)) == []
    for key in NEOX_KEYS.values():
        assert key.note or key.status is KeyStatus.MAPPED, key.name


READERS = [
    {},
    {"pos_emb": "rotary", "norm": "rmsnorm", "sliding_window_width": 7, "num_kv_heads": 2},
    {"norm": "scalenorm", "gpt_j_residual": True, "gpt_j_tied": True},
    {"pos_emb": "rpe"},
    {"attention_config": [[["amlp"], "all"]]},
    {"attention_config": [[["mamba"], "all"]], "intermediate_size": 96},
    {"attention_config": [[["rwkv"], "all"]], "dim_att": 64, "head_size": 16, "ffn_dim": 96},
    {"mlp_type": "llama", "activation": "silu"},
    {"moe_num_experts": 4, "moe_router_type": "topk", "moe_expert_interval": 1},
    {"expert_interval": 1, "moe_num_experts": 4, "moe_router_type": "topk"},
    {"moe_num_experts": 4, "moe_type": "deepspeed", "moe_token_dropping": True},
    {
        "train_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "fp32_allreduce": True,
        "data_types": {"grad_accum_dtype": "fp32"},
    },
    {
        "save": "a",
        "checkpoint_factor": 2,
        "extra_save_iters": [1],
        "keep_last_n_checkpoints": 1,
        "load": "b",
        "finetune": True,
        "tensorboard_dir": "t",
        "log_dir": "l",
        "checkpoint_activations": True,
    },
    {"data_path": "d", "vocab_file": "v", "merge_file": "m", "lr_decay_iters": 5},
    {"train_data_paths": ["a"], "valid_data_paths": ["b"], "test_data_paths": ["c"], "lr_decay_fraction": 0.5},
    {"deepspeed_extra_args": {"comms_logger": {}}},
    {
        "use_mup": True,
        "base_shapes_file": "b",
        "save_base_shapes": True,
        "mup_width_scale": 4,
        "mup_init_scale": 0.5,
        "mup_attn_temp": 2.0,
        "mup_output_temp": 2.0,
        "mup_embedding_mult": 2.0,
        "mup_rp_embedding_mult": 2.0,
        "coord_check": True,
    },
    {"te_fp8_mha": True, "te_fp8_format": "e4m3", "te_fp8_wgrad": False},
    {
        "train_impl": "dpo",
        "dataset_impl": "pairwise",
        "dpo_beta": 0.2,
        "dpo_reference_free": False,
        "precompute_model_name": "ref",
        "pack_impl": "unpacked",
        **{
            f"{side}_{split}_{kind}": ["p"]
            for side in ("pos", "neg")
            for split in ("train", "valid", "test")
            for kind in ("data_paths", "label_data_paths")
        },
    },
    {
        "train_impl": "rm",
        "dataset_impl": "pairwise",
        "z_loss": 0.1,
        "pack_impl": "unpacked",
        "pos_train_data_paths": ["a"],
        "neg_train_data_paths": ["b"],
    },
    {
        "train_impl": "kto",
        "kto_beta": 0.2,
        "kto_desirable_weight": 1.5,
        "kto_undesirable_weight": 0.5,
        "pack_impl": "unpacked",
        **{
            f"{split}_{kind}": ["p"]
            for split in ("train", "valid", "test")
            for kind in ("data_paths", "label_data_paths", "reward_data_paths")
        },
    },
    {"train_impl": "reinforce", "reinforce_leave_one_out": True, "kl_impl": "abs", "kl_div_beta": 0.05},
]
"""Files that between them take every branch of the translation."""


def test_every_mapped_key_is_read_by_the_translation():
    read = set().union(*(translate({**MODEL, **keys}, "run").read for keys in READERS))
    mapped = {key.name for key in NEOX_KEYS.values() if key.status is KeyStatus.MAPPED}
    assert sorted(mapped - read - {"deepspeed_extra_args"}) == []


def _other_value(default: Any) -> Any:
    if isinstance(default, bool):
        return not default
    if isinstance(default, int | float):
        return default + 3
    if isinstance(default, str):
        return default + "x"
    return {"enabled": True} if default is None else None


NOTICED = [key for key in NEOX_KEYS.values() if key.status is KeyStatus.NOTICE]
REFUSED = [key for key in NEOX_KEYS.values() if key.status is KeyStatus.REFUSED]


@pytest.mark.parametrize("key", NOTICED, ids=lambda key: key.name)
def test_each_notice_key_set_away_from_its_default_gets_a_notice(tmp_path, key):
    found = notices(tmp_path, {**MODEL, key.name: _other_value(key.default)})
    assert any(f": {key.name}: accepted, changes nothing here: {key.note}" in notice for notice in found), found


@pytest.mark.parametrize("key", REFUSED, ids=lambda key: key.name)
def test_each_refused_key_set_away_from_its_default_is_refused_by_name(tmp_path, key):
    value = _other_value(key.default)
    found = errors(tmp_path, {**MODEL, key.name: value})
    assert any(f"f0.yml: {key.name}: expected " in message and key.note in message for message in found), found


def test_a_disabled_deepspeed_block_is_no_request(tmp_path):
    config = load(
        tmp_path, {**MODEL, "amp": {"enabled": False}, "curriculum_learning": {"enabled": False}, "use_wandb": False}
    )
    assert config.model.num_layers == 4


def test_extra_deepspeed_args_are_read_as_top_level_deepspeed_keys(tmp_path):
    found = notices(tmp_path, {**MODEL, "deepspeed_extra_args": {"comms_logger": {"enabled": True}}})
    assert any("comms_logger: accepted" in notice for notice in found)
    amp = {"amp": {"enabled": True}}
    assert load(tmp_path, {**MODEL, "deepspeed_extra_args": amp}).precision.type == "fp16_autocast"
    assert "amp.opt_level: expected" in " ".join(
        errors(tmp_path, {**MODEL, "deepspeed_extra_args": {"amp": {"enabled": True, "opt_level": "O3"}}})
    )


# --------------------------------------------------------------------------- NeoX's defaults and derivations


def test_a_file_silent_on_a_key_gets_neox_defaults_not_nxdt_ones(tmp_path):
    c = load(tmp_path, MODEL)
    m = c.model
    assert (m.hidden_dropout, m.attention_dropout, m.apply_query_key_layer_scaling) == (0.0, 0.0, False)
    assert (m.position_embedding_type, m.normalization, m.layernorm_epsilon, m.activation) == (
        "learned_absolute",
        "layernorm",
        1e-5,
        "gelu",
    )
    assert (m.make_vocab_size_divisible_by, m.share_embeddings_and_output_weights, m.transformer_block_type) == (
        128,
        True,
        "pre_ln",
    )
    assert (m.init_method, m.output_layer_init_method, m.init_method_std) == ("normal", "scaled_normal", 0.02)
    assert m.ffn_hidden_size == 4 * 64 and m.attention_bias and m.mlp_bias
    assert (m.optim.name, m.optim.weight_decay, m.optim.betas) == ("adamw", 0.1, (0.9, 0.95))
    sched = m.optim.sched
    assert (sched.name, sched.decay_style, sched.warmup_ratio, sched.min_lr) == ("NeoXAnnealing", "linear", 0.01, 0.0)
    assert (c.seed, c.data.num_workers, c.trainer.gradient_clip_val, c.precision.type) == (1234, 2, 1.0, "fp32")
    assert (c.trainer.val_check_interval, c.trainer.limit_val_batches, c.trainer.log_every_n_steps) == (1000, 100, 100)
    assert c.exp_manager.create_checkpoint_callback is False and c.distributed_strategy.zero1 is False


@pytest.mark.parametrize(
    ("batch", "micro", "global_batch"),
    [
        ({"train_micro_batch_size_per_gpu": 2}, 2, 4),  # 2 x 1 step x 2 data-parallel ranks
        ({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3}, 2, 12),
        ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2}, 2, 16),  # 4 steps
        ({"train_batch_size": 16, "gradient_accumulation_steps": 4}, 2, 16),
        ({"train_batch_size": 8}, 4, 8),
        ({"train_batch_size": 12, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2}, 3, 12),
    ],
)
def test_any_two_batch_keys_give_the_third(tmp_path, batch, micro, global_batch):
    model = {key: value for key, value in MODEL.items() if key != "train_micro_batch_size_per_gpu"}
    config = load(tmp_path, {**model, **batch, "num_gpus": 2})
    assert (config.data.micro_batch_size, config.global_batch_size) == (micro, global_batch)


def test_batch_keys_that_disagree_are_refused(tmp_path):
    model = {key: value for key, value in MODEL.items() if key != "train_micro_batch_size_per_gpu"}
    bad = {"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}
    assert errors(tmp_path, {**model, **bad, "num_gpus": 2}) == [
        f"{tmp_path / 'f0.yml'}: train_batch_size: expected train_micro_batch_size_per_gpu x gradient_accumulation_"
        f"steps x data-parallel size (2 x 2 x 2 = 8), found 10"
    ]
    assert (
        "train_batch_size: expected train_batch_size or train_micro_batch_size_per_gpu, found neither"
        in errors(tmp_path, model)[0]
    )


@pytest.mark.parametrize(
    ("keys", "width"),
    [
        ({}, 256),  # 4 x 64
        ({"activation": "swiglu"}, 85),  # int(256 x 2/3) = 170, split in two
        (
            {
                "activation": "swiglu",
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "intermediate_size": 32768,
                "mlp_multiple_of": 256,
            },
            11008,
        ),  # NeoX's llama/7B.yml: int(32768 x 2/3) = 21845 -> 22016 / 2
        ({"expansion_factor": 2.5}, 160),
        ({"activation": "geglu", "intermediate_size": 300, "mlp_multiple_of": 4}, 100),  # 200 -> 200 and 100 -> 100
        ({"mlp_type": "llama", "activation": "silu"}, 256),  # 256 x ceil(int(170.67) / 256)
    ],
)
def test_the_mlp_width_follows_neox_rule(tmp_path, keys, width):
    assert load(tmp_path, {**MODEL, **keys}).model.ffn_hidden_size == width


def test_an_mlp_width_rule_giving_mismatched_shapes_is_refused(tmp_path):
    """NeoX's own mistral/7B.yml: intermediate_size 14336 without mlp_multiple_of makes NeoX crash."""
    found = errors(tmp_path, {**MODEL, "activation": "swiglu", "intermediate_size": 14336})
    assert found == [
        f"{tmp_path / 'f0.yml'}: intermediate_size: intermediate_size 14336 with mlp_multiple_of 1 gives the first MLP "
        "linear 9558 outputs and the second 4778 inputs; expected twice the second's (GPT-NeoX fails on these "
        "shapes: set mlp_multiple_of, or an intermediate_size that rounds evenly)"
    ]


@pytest.mark.parametrize(
    ("config", "flash"),
    [
        ([[["global"], 4]], True),
        ([[["flash", "global"], 2]], True),
        ([[["flash"], "all"]], True),
        (["global", "flash", "global", "flash"], True),
    ],
)
def test_attention_config_expands_as_neox_expands_it(tmp_path, config, flash):
    assert load(tmp_path, {**MODEL, "attention_config": config}).model.fusions.flash_attention is flash


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ([[["global"], 3]], "attention_config: expected one kind per layer (num_layers: 4), found 3 after expansion"),
    ],
)
def test_attention_kinds_nxd_lacks_and_miscounted_configs_are_refused(tmp_path, config, message):
    assert any(message in found for found in errors(tmp_path, {**MODEL, "attention_config": config}))


def test_sparse_layers_and_their_sparsity_config_become_nxd_keys(tmp_path):
    """NeoX's configs/sparse.yml pattern; each sparsity_config entry NeoX reads lands in model.sparse_attention."""
    sparsity = {
        "block": 8,
        "num_local_blocks": 32,
        "different_layout_per_head": True,
        "num_random_blocks": 2,
        "local_window_blocks": [2, 4],
        "global_block_indices": [0, 5],
        "global_block_end_indices": [1, 7],
        "num_sliding_window_blocks": 5,
        "num_global_blocks": 2,
        "num_different_global_patterns": 2,
    }
    model = load(
        tmp_path, {**MODEL, "attention_config": [[["local", "global"], "all"]], "sparsity_config": sparsity}
    ).model
    assert model.attention_layers == ("local", "dense", "local", "dense")
    assert model.sparse_attention.model_dump() == {
        **sparsity,
        "local_window_blocks": (2, 4),
        "global_block_indices": (0, 5),
        "global_block_end_indices": (1, 7),
    }
    kinds = [[["sparse_fixed", "sparse_variable", "bigbird", "bslongformer"], 1]]
    assert load(tmp_path, {**MODEL, "attention_config": kinds}).model.attention_layers == tuple(kinds[0][0])
    assert load(tmp_path, {**MODEL, "attention_config": [[["flash"], 4]]}).model.attention_layers is None


@pytest.mark.parametrize(
    ("keys", "message", "notice"),
    [
        (
            {"sparsity_config": {"mode": "fixed", "block": 16}},
            "sparsity_config.mode: accepted, changes nothing here: attention_config sets each layer's kind",
            True,
        ),
        (
            {"sparsity_config": {"horizontal_global_attention": True}},
            "sparsity_config.horizontal_global_attention: accepted, changes nothing here",
            True,
        ),
        (
            {"sparsity_config": {"blocks": 16}},
            "sparsity_config.blocks: expected one of block, different_layout_per_head",
            False,
        ),
        (
            {"sparsity_config": [16]},
            "sparsity_config: expected a mapping of DeepSpeed's sparsity settings, found [16]",
            False,
        ),
        (
            {"pos_emb": "alibi"},
            "attention_config: expected global or flash layers with pos_emb: alibi, found local: "
            "NeoX's sparse layers add no ALiBi bias",
            False,
        ),
    ],
)
def test_sparsity_entries_neox_overrides_are_noticed_and_unknown_ones_refused(tmp_path, keys, message, notice):
    content = {**MODEL, "attention_config": [[["local", "global"], "all"]], **keys}
    found = notices(tmp_path, content) if notice else errors(tmp_path, content)
    assert any(message in line for line in found), found


def test_gmlp_and_amlp_layers_and_gmlp_attn_dim_become_nxd_keys(tmp_path):
    """NeoX's configs/gmlp_small.yml pattern, grown to amlp layers beside global ones."""
    config = load(tmp_path, {**MODEL, "attention_config": [[["gmlp"], "all"]], "pos_emb": "none"})
    assert config.model.attention_layers == ("gmlp",) * 4 and not config.model.is_set("gmlp_attention_dim")
    mixed = {**MODEL, "attention_config": [[["amlp", "global"], "all"]], "gmlp_attn_dim": 16}
    model = load(tmp_path, mixed).model
    assert model.attention_layers == ("amlp", "dense", "amlp", "dense") and model.gmlp_attention_dim == 16


@pytest.mark.parametrize(
    ("keys", "message", "notice"),
    [
        (
            {"attention_config": [[["gmlp"], "all"]], "gmlp_attn_dim": 32},
            "gmlp_attn_dim: accepted, changes nothing here: only amlp layers read it",
            True,
        ),
        (
            {"attention_config": [[["gmlp"], "all"]], "model_parallel_size": 2},
            "attention_config: gmlp layers are whole on every tensor-parallel rank in nxd",
            True,
        ),
        (
            {"attention_config": [[["amlp"], "all"]], "activation": "swiglu"},
            "(nxd: model.activation): amlp layers split their inner activations",
            False,
        ),
        (
            {"attention_config": [[["gmlp"], "all"]], "model_parallel_size": 2, "sequence_parallel": True},
            "gmlp layers mix every position of the sequence through one weight matrix, which sequence parallelism splits",
            False,
        ),
    ],
)
def test_gmlp_settings_are_noticed_or_refused_by_name(tmp_path, keys, message, notice):
    found = notices(tmp_path, {**MODEL, **keys}) if notice else errors(tmp_path, {**MODEL, **keys})
    assert any(message in line for line in found), found


def test_mamba_layers_and_their_keys_become_nxd_keys(tmp_path):
    """NeoX's configs/mamba/*.yml pattern: every layer mamba, rmsnorm, no positions."""
    keys = {
        **MODEL,
        "attention_config": [[["mamba"], 4]],
        "norm": "rmsnorm",
        "pos_emb": "none",
        "mamba_use_bias_in_conv": False,
        "mamba_use_bias_in_linears": True,
        "expansion_factor": 3,
        "mamba_inner_func_fusion": True,
    }
    model = load(tmp_path, keys).model
    assert model.attention_layers == ("mamba",) * 4
    assert (model.mamba_conv_bias, model.mamba_linear_bias, model.mamba_inner_size) == (False, True, 192)
    found = notices(tmp_path, keys)
    assert any(
        "mamba_inner_func_fusion: accepted, changes nothing here: a kernel choice of causal-conv1d / mamba-ssm" in line
        for line in found
    ), found
    found = notices(tmp_path, {**MODEL, "mamba_use_bias_in_conv": False})
    assert any(
        "mamba_use_bias_in_conv: accepted, changes nothing here: only mamba layers read it" in line for line in found
    ), found
    found = errors(tmp_path, {**keys, "model_parallel_size": 2, "sequence_parallel": True})
    assert any(
        "mamba layers scan the whole sequence from its start, which sequence parallelism splits" in line
        for line in found
    ), found


def test_rwkv_layers_and_their_keys_become_nxd_keys(tmp_path):
    """NeoX's configs/rwkv/170M.yml pattern."""
    keys = {**MODEL, "attention_config": [[["rwkv"], 4]], "norm": "rmsnorm", "dim_att": 128, "head_size": 32}
    model = load(tmp_path, keys).model
    assert model.attention_layers == ("rwkv",) * 4 and model.rwkv_dim_att == 128 and model.rwkv_ffn_size is None
    assert load(tmp_path, {**keys, "expansion_factor": 2.6}).model.rwkv_ffn_size == 160  # 166 down to 32s
    assert load(tmp_path, {**keys, "ffn_dim": 200}).model.rwkv_ffn_size == 200
    found = errors(tmp_path, {**keys, "head_size": 16})
    assert any(
        "head_size: expected dim_att / num_attention_heads (32), as NeoX computes it, found 16" in line
        for line in found
    ), found
    found = notices(tmp_path, {**MODEL, "dim_att": 64})
    assert any("dim_att: accepted, changes nothing here: only rwkv layers read it" in line for line in found), found


def test_a_sparsity_config_without_sparse_layers_is_noticed(tmp_path):
    found = notices(tmp_path, {**MODEL, "sparsity_config": {"block": 32}})
    assert any(
        "sparsity_config: accepted, changes nothing here: attention_config names no sparse layer" in line
        for line in found
    ), found


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (
            {"norm": "te_rmsnorm_typo"},
            "norm: expected one of layernorm, rmsnorm, scalenorm, non_parametric_layernorm, "
            "te_layernorm, te_rmsnorm, found 'te_rmsnorm_typo'",
        ),
        (
            {"norm": "non_parametric_layernorm", "layernorm_fusion": True},
            "layernorm_fusion: expected false with norm: non_parametric_layernorm",
        ),
        (
            {"opt_pos_emb_offset": 2, "max_position_embeddings": 64, "seq_length": 64},
            "expected at least the sequence length (64) plus position_embedding_offset 2 with learned_absolute positions",
        ),
        ({"pos_emb": "t5"}, "pos_emb: expected one of learned, rotary, sinusoidal, alibi, rpe, none, found 't5'"),
        (
            {"pos_emb": "rpe", "apply_query_key_layer_scaling": True},
            "apply_query_key_layer_scaling: expected false with pos_emb: rpe, found true",
        ),
        (
            {"pos_emb": "rpe", "pipe_parallel_size": 2, "num_gpus": 2, "no_weight_tying": True},
            "rpe's one table serves every layer, so pipeline stages would each train a copy",
        ),
        ({"pos_emb": "rotary", "rotary_pct": 1.5}, "rotary_pct (nxd: model.rotary_percentage): expected a value <= 1"),
        ({"pos_emb": "rotary", "rotary_pct": 0}, "rotary_pct (nxd: model.rotary_percentage): expected a value > 0"),
        (
            {"te_fp8_mha": True, "te_fp8_margin": 1},
            "te_fp8_margin: expected 0, found 1: torchao's float8 scales to the format's full range, with no margin",
        ),
        (
            {"moe_num_experts": 4, "moe_router_type": "expert_choice"},
            "moe_router_type: expected topk or sinkhorn, found 'expert_choice'",
        ),
        (
            {"fp16": {"enabled": True, "loss_scal": 0}},
            "fp16.loss_scal: unknown fp16 setting; expected one of enabled, loss_scale",
        ),
        (
            {"fp16": {"enabled": True}, "bf16": {"enabled": True}},
            "bf16: expected one of the fp16 and bf16 blocks enabled",
        ),
        ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage: expected 0, 1, 2 or 3, found 4"),
        (
            {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}, "num_gpus": 2},
            "zero_optimization.offload_optimizer.device: expected cpu or none, found 'nvme': offloading to NVMe is not in "
            "nxd",
        ),
        (
            {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}, "num_gpus": 2},
            "zero_optimization.offload_optimizer.ratio: expected 1 (the whole state offloaded",
        ),
        (
            {"zero_optimization": {"stage": 2, "offload_optimizer": True}, "num_gpus": 2},
            "zero_optimization.offload_optimizer: expected a mapping such as {device: cpu}, found True",
        ),
        (
            {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}, "num_gpus": 2},
            "zero_optimization.offload_param: expected ZeRO stage 3 with it",
        ),
        (
            {"zero_optimization": {"stage": 0, "cpu_offload": True}},
            "zero_optimization.cpu_offload: expected ZeRO stage 1",
        ),
        (
            {"zero_optimization": {"stage": 1, "cpu_offload": True}},
            "zero_optimization (nxd: distributed_strategy.cpu_offload): expected more than one data-parallel rank",
        ),
        (
            {"optimizer": {"type": "adagrad", "params": {"lr": 1e-4}}},
            "optimizer.type: expected Adam, AdamW, cpu_adam, sgd, lion, madgrad_wd or sm3, found 'adagrad'",
        ),
        (
            {"optimizer": {"type": "sm3", "params": {"lr": 1e-4, "betas": [0.9, 0.9]}}},
            "optimizer.params.betas: unknown "
            "parameter of sm3; expected one of beta, eps, lr, momentum (did you mean 'beta'?)",
        ),
        (
            {"optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-4}}},
            "found 'OneBitAdam': onebitadam compresses DeepSpeed's engine's gradient communication",
        ),
        (
            {"optimizer": {"type": "lion", "params": {"lr": 1e-4, "eps": 1e-8}}},
            "optimizer.params.eps: unknown parameter of lion; expected one of betas, lr",
        ),
        (
            {"optimizer": {"type": "Adam", "params": {"lr": 1e-4, "weight_decay": 0.1}}},
            "optimizer.params.weight_decay: GPT-NeoX takes weight decay from the top-level weight_decay key",
        ),
        ({"train_impl": "reinforce"}, "data.train_dir: expected the GRPO training data"),
        ({"train_impl": "reinforce", "kl_impl": "full"}, "kl_impl: expected abs, mse or kl, found full"),
        ({"train_impl": "kto"}, "train_data_paths: expected the training examples with train_impl kto, found none"),
        (
            {"pos_emb": "alibi", "model_parallel_size": 1, "num_gpus": 2},
            None,
        ),  # alibi is fine without context parallelism
    ],
)
def test_architectures_and_settings_nxd_lacks_are_refused_by_key(tmp_path, keys, message):
    if message is None:
        assert load(tmp_path, {**MODEL, **keys}).model.position_embedding_type == "alibi"
        return
    assert any(message in found for found in errors(tmp_path, {**MODEL, **keys})), errors(tmp_path, {**MODEL, **keys})


def test_neox_model_shapes_become_nxd_keys(tmp_path):
    m = load(
        tmp_path,
        {
            **MODEL,
            "pos_emb": "rotary",
            "rotary_pct": 0.25,
            "rotary_emb_base": 50000,
            "gpt_j_residual": True,
            "bias_gelu_fusion": True,
            "no_weight_tying": True,
            "init_method": "small_init",
            "output_layer_init_method": "wang_init",
            "use_bias_in_attn_linear": False,
            "sliding_window_width": 31,
            "num_kv_heads": 2,
            "norm": "rmsnorm",
            "rms_norm_epsilon": 1e-6,
        },
    ).model
    assert (m.position_embedding_type, m.rotary_percentage, m.rope_theta) == ("rope", 0.25, 50000.0)
    assert (m.transformer_block_type, m.activation, m.share_embeddings_and_output_weights) == (
        "gpt_neox",
        "approx-gelu",
        False,
    )
    assert (m.init_method, m.output_layer_init_method, m.attention_bias, m.mlp_bias) == (
        "small_init",
        "wang_init",
        False,
        True,
    )
    assert (m.sliding_window_size, m.num_kv_heads, m.normalization, m.layernorm_epsilon) == (32, 2, "rmsnorm", 1e-6)
    tied = load(
        tmp_path,
        {
            **MODEL,
            "gpt_j_residual": True,
            "gpt_j_tied": True,
            "norm": "scalenorm",
            "scalenorm_epsilon": 1e-4,
            "activation": "swish",
            "pos_emb": "sinusoidal",
        },
    ).model
    assert (tied.transformer_block_type, tied.normalization, tied.layernorm_epsilon) == ("gpt_j", "scalenorm", 1e-4)
    assert (tied.activation, tied.position_embedding_type) == ("silu", "sinusoidal")


def test_norms_without_weights_transformer_engine_kernels_and_opts_position_offset(tmp_path):
    """non_parametric_layernorm keeps its name; te_* norms are the same arithmetic with a notice; Transformer
    Engine's layer kernels are noticed; OPT's offset shifts learned (and sinusoidal) positions, not rotary ones."""
    keys = {
        **MODEL,
        "norm": "non_parametric_layernorm",
        "layernorm_epsilon": 1e-6,
        "opt_pos_emb_offset": 2,
        "max_position_embeddings": 2050,
        "te_mha": True,
        "te_columnparallel": True,
    }
    m = load(tmp_path, keys).model
    assert (m.normalization, m.layernorm_epsilon, m.position_embedding_type, m.position_embedding_offset) == (
        "non_parametric_layernorm",
        1e-6,
        "learned_absolute",
        2,
    )
    said = notices(tmp_path, keys)
    assert sum("Transformer Engine's kernel for a layer nxd's own layers compute" in n for n in said) == 1, said
    assert any("te_mha: " in n and "nxd computes NeoX's own layers as the file describes them" in n for n in said)
    te = {**MODEL, "norm": "te_rmsnorm", "rms_norm_epsilon": 1e-5, "pos_emb": "rotary", "opt_pos_emb_offset": 2}
    m = load(tmp_path, te).model
    assert (m.normalization, m.layernorm_epsilon, m.position_embedding_offset) == ("rmsnorm", 1e-5, 0)
    said = notices(tmp_path, te)
    assert any("norm: te_rmsnorm: Transformer Engine's kernel for rmsnorm" in n for n in said), said
    assert any("opt_pos_emb_offset: accepted, changes nothing here: pos_emb is 'rotary'" in n for n in said), said
    assert load(tmp_path, {**MODEL, "norm": "te_layernorm"}).model.normalization == "layernorm"


def test_use_qk_layernorm_becomes_the_query_key_norm(tmp_path):
    assert load(tmp_path, {**MODEL, "use_qk_layernorm": True}).model.qk_layernorm is True
    assert load(tmp_path, {**MODEL, "use_qk_layernorm": True, "norm": "rmsnorm"}).model.normalization == "rmsnorm"
    found = errors(tmp_path, {**MODEL, "use_qk_layernorm": True, "num_kv_heads": 2})
    assert any("expected num_kv_heads 4 (or null) with it, found 2" in line for line in found), found
    found = errors(tmp_path, {**MODEL, "use_qk_layernorm": True, "norm": "te_layernorm"})
    assert any("use_qk_layernorm: expected false with norm: te_layernorm" in line for line in found), found
    said = notices(tmp_path, {**MODEL, "use_qk_layernorm": True, "model_parallel_size": 2, "num_gpus": 2})
    assert any(
        "use_qk_layernorm: with layernorm NeoX standardises each of its 2 tensor-parallel ranks' heads apart" in line
        for line in said
    ), said


def test_rpe_becomes_t5s_relative_buckets_with_neox_sizes(tmp_path):
    m = load(tmp_path, {**MODEL, "pos_emb": "rpe", "rpe_num_buckets": 16, "rpe_max_distance": 64}).model
    assert (m.position_embedding_type, m.rpe_num_buckets, m.rpe_max_distance) == ("rpe", 16, 64)
    said = notices(tmp_path, {**MODEL, "pos_emb": "rotary", "rpe_num_buckets": 16})
    assert any("rpe_num_buckets: accepted, changes nothing here: pos_emb is 'rotary', not rpe" in n for n in said)
    said = notices(tmp_path, {**MODEL, "pos_emb": "sinusoidal", "rpe_max_distance": 64, "opt_pos_emb_offset": 2})
    assert any("rpe_max_distance: accepted, changes nothing here" in n for n in said), said
    assert any("opt_pos_emb_offset: accepted, changes nothing here: pos_emb is 'sinusoidal'" in n for n in said)


def test_moe_keys_become_the_dropless_top_k_moe(tmp_path):
    c = load(
        tmp_path,
        {
            **MODEL,
            "moe_num_experts": 4,
            "moe_top_k": 2,
            "moe_router_type": "topk",
            "moe_expert_parallel_size": 2,
            "num_gpus": 2,
        },
    )
    moe = c.model.moe
    assert (moe.num_experts, moe.top_k, moe.frequency, moe.dropless, moe.routing_algorithm) == (4, 2, 1, True, "top_k")
    assert moe.normalize_top_k_affinities is False and moe.router_aux_loss_coef == 0.0
    assert c.distributed_strategy.expert_model_parallel_size == 2 and c.model.ffn_hidden_size == 256
    assert moe.jitter_eps is None
    jittered = {**MODEL, "moe_num_experts": 4, "moe_router_type": "topk", "moe_jitter_eps": 0.01}
    assert load(tmp_path, jittered).model.moe.jitter_eps == 0.01
    found = notices(tmp_path, {**MODEL, "moe_jitter_eps": 0.01})
    assert any(
        "moe_jitter_eps: accepted, changes nothing here: moe_num_experts makes no MoE layer" in line for line in found
    ), found


def test_deepspeed_moe_becomes_deepspeed_routing_with_its_capacity_residual_and_loss(tmp_path):
    keys = {
        **MODEL,
        "moe_num_experts": 4,
        "moe_top_k": 2,
        "moe_type": "deepspeed",
        "moe_token_dropping": True,
        "moe_train_capacity_factor": 1.5,
        "moe_eval_capacity_factor": 2.0,
        "moe_min_capacity": 2,
        "moe_loss_coeff": 0.05,
        "moe_glu": True,
        "intermediate_size": 96,
    }
    c = load(tmp_path, keys)
    moe = c.model.moe
    assert (
        moe.routing_algorithm,
        moe.top_k,
        moe.dropless,
        moe.capacity_factor,
        moe.eval_capacity_factor,
        moe.min_capacity,
    ) == ("deepspeed", 2, False, 1.5, 2.0, 2)
    assert moe.residual and moe.glu and moe.output_router_logits  # moe_use_residual: NeoX's default true
    assert moe.router_aux_loss_coef == pytest.approx(0.05 * 4)  # summed over NeoX's 4 layers, averaged by nxd
    assert c.model.ffn_hidden_size == 96  # the experts are NeoX's dense MLP
    dropless = load(tmp_path, {**MODEL, "moe_num_experts": 4, "moe_type": "deepspeed", "moe_use_residual": False})
    assert (
        dropless.model.moe.dropless and not dropless.model.moe.residual and dropless.model.moe.capacity_factor is None
    )


@pytest.mark.parametrize(
    ("keys", "message", "notice"),
    [
        (
            {"moe_type": "deepspeed", "moe_min_capacity": 8},
            "moe_min_capacity: accepted, changes nothing here: read only with moe_token_dropping true",
            True,
        ),
        (
            {"moe_type": "deepspeed", "moe_router_type": "topk"},
            "moe_router_type: accepted, changes nothing here: DeepSpeed's gate routes",
            True,
        ),
        (
            {"moe_use_residual": False},
            "moe_use_residual: accepted, changes nothing here: read only by moe_type: deepspeed",
            True,
        ),
        ({"moe_token_dropping": True}, "moe_token_dropping: expected false with moe_type: megablocks", False),
        ({"moe_type": "deepspeed", "moe_top_k": 3}, "moe_top_k: expected 1 or 2 with moe_type: deepspeed", False),
        ({"moe_type": "tutel"}, "moe_type: expected one of megablocks, deepspeed, found 'tutel'", False),
    ],
)
def test_deepspeed_moe_keys_are_noticed_or_refused_by_name(tmp_path, keys, message, notice):
    content = {**MODEL, "moe_num_experts": 4, "moe_router_type": "topk", **keys}
    found = notices(tmp_path, content) if notice else errors(tmp_path, content)
    assert any(message in line for line in found), found


@pytest.mark.parametrize(("top_k", "activation"), [(1, "sigmoid"), (2, "softmax")])
def test_neox_sinkhorn_router_becomes_neox_sinkhorn_routing(tmp_path, top_k, activation):
    moe = load(tmp_path, {**MODEL, "moe_num_experts": 4, "moe_top_k": top_k}).model.moe  # sinkhorn: NeoX's default
    assert (moe.routing_algorithm, moe.top_k, moe.router_activation) == ("neox_sinkhorn", top_k, activation)
    found = notices(tmp_path, {**MODEL, "moe_num_experts": 4, "moe_jitter_eps": 0.1})
    assert any(
        "moe_jitter_eps: accepted, changes nothing here: GPT-NeoX's Sinkhorn router does not jitter" in line
        for line in found
    ), found


def test_layout_keys(tmp_path):
    c = load(
        tmp_path,
        {
            **MODEL,
            "pipe_parallel_size": 2,
            "model_parallel_size": 2,
            "sequence_parallel": True,
            "zero_optimization": {"stage": 1, "overlap_comm": True},
            "num_layers": 5,
            "gradient_accumulation_steps": 2,
        },
    )
    ds = c.distributed_strategy
    assert (ds.pipeline_model_parallel_size, ds.tensor_model_parallel_size, ds.sequence_parallel, ds.zero1) == (
        2,
        2,
        True,
        True,
    )
    assert c.trainer.devices == 4  # no num_gpus: the processes the layout needs
    assert c.model.pipeline_cuts == ("model.layers.2",)  # 3 + 2 layers, the first stage one more (DeepSpeed's rule)
    assert load(tmp_path, {**MODEL, "pipe_parallel_size": 0}).distributed_strategy.pipeline_model_parallel_size == 1
    for stage, zero1, zero3 in ((0, False, False), (1, True, False), (2, True, False), (3, True, True)):
        ds = load(tmp_path, {**MODEL, "zero_optimization": {"stage": stage}}).distributed_strategy
        assert (ds.zero1, ds.zero3) == (zero1, zero3), stage
    for zero in (
        {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}},
        {"stage": 1, "cpu_offload": True},
        {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
    ):
        assert load(tmp_path, {**MODEL, "num_gpus": 2, "zero_optimization": zero}).distributed_strategy.cpu_offload
    assert not load(
        tmp_path, {**MODEL, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"}}}
    ).distributed_strategy.cpu_offload
    assert any(
        "FSDP2 offloads each rank's parameter shards with the optimizer state" in message
        for message in notices(
            tmp_path,
            {**MODEL, "num_gpus": 2, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}},
        )
    )
    assert errors(tmp_path, {**MODEL, "pipe_parallel_size": 2}) == [
        f"{tmp_path / 'f0.yml'}: train_micro_batch_size_per_gpu (nxd: data.global_batch_size): expected at least 2 micro-batches per step with 2 pipeline stages (1F1B), found "
        "global_batch_size / (micro_batch_size * data-parallel size) = 2 / (2 * 1) = 1"
    ]


@pytest.mark.parametrize(
    ("keys", "kind"),
    [
        ({}, "fp32"),
        ({"precision": "fp32"}, "fp32"),
        ({"bf16": {"enabled": True}}, "mixed_precision"),
        ({"precision": "bfloat16"}, "mixed_precision"),
        ({"bf16": {"enabled": False}}, "fp32"),
        ({"fp16": {"enabled": True, "type": "bfloat16", "loss_scale": 0}}, "mixed_precision"),  # pythia/1B.yml
        ({"fp16": {"fp16": True, "enabled": True}}, "fp16"),
        ({"precision": "fp16"}, "fp16"),
        (
            {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}, "fp32_allreduce": True},
            "mixed_precision",
        ),
    ],
)
def test_precision(tmp_path, keys, kind):
    assert load(tmp_path, {**MODEL, **keys}).precision.type == kind


@pytest.mark.parametrize("allreduce", [False, True])
def test_bf16_gradient_accumulation_is_deepspeeds_bf16_sum_over_fp32_masters(tmp_path, allreduce):
    """NeoX's post-training benchmarking files (mistral-dpo.yml, llama-13b-dpo.yml) accumulate in bf16."""
    p = load(
        tmp_path,
        {**MODEL, "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "bf16"}, "fp32_allreduce": allreduce},
    ).precision
    assert (p.type, p.xla_use_bf16, p.master_weights, p.fp32_grad_acc, p.fp32_grads_cc) == (
        "manual",
        "1",
        True,
        False,
        allreduce,
    )


@pytest.mark.parametrize("keys", [{"precision": "fp32"}, {"fp16": {"enabled": True}}])
def test_bf16_gradient_accumulation_needs_bf16_training(tmp_path, keys):
    assert any(
        "data_types.grad_accum_dtype: expected fp32, or bf16 with bf16 training (nxd accumulates fp16 and "
        "fp32 runs' gradients in fp32), found 'bf16'" in message
        for message in errors(tmp_path, {**MODEL, **keys, "data_types": {"grad_accum_dtype": "bf16"}})
    )


def test_an_fp16_block_sets_deepspeed_loss_scaling(tmp_path):
    """NeoX's pythia/160M.yml block; DeepSpeed's defaults where a block is silent."""
    block = {
        "fp16": True,
        "enabled": True,
        "loss_scale": 0,
        "loss_scale_window": 1000,
        "initial_scale_power": 12,
        "hysteresis": 2,
        "min_loss_scale": 1,
    }
    p = load(tmp_path, {**MODEL, "fp16": block}).precision
    assert (p.type, p.loss_scale, p.initial_scale_power, p.loss_scale_window, p.hysteresis, p.min_loss_scale) == (
        "fp16",
        0.0,
        12,
        1000,
        2,
        1.0,
    )
    p = load(tmp_path, {**MODEL, "fp16": {"enabled": True, "loss_scale": 128}}).precision
    assert (p.type, p.loss_scale, p.initial_scale_power, p.hysteresis) == ("fp16", 128.0, 16, 2)


def test_an_fp16_block_of_type_bfloat16_is_read_as_bf16_with_a_notice(tmp_path):
    found = notices(tmp_path, {**MODEL, "fp16": {"enabled": True, "type": "bfloat16"}})
    assert any("fp16: the block holds type: bfloat16, which GPT-NeoX's DeeperSpeed reads as bf16" in n for n in found)


def test_the_schedule_is_neox_annealing_over_neox_horizon(tmp_path):
    sched = load(
        tmp_path, {**MODEL, "lr_decay_style": "cosine", "warmup": 0.1, "min_lr": 6e-5, "lr_decay_iters": 8}
    ).model.optim.sched
    assert (sched.decay_style, sched.warmup_ratio, sched.min_lr, sched.max_steps) == ("cosine", 0.1, 6e-5, 8)
    assert load(tmp_path, {**MODEL, "lr_decay_fraction": 0.55}).model.optim.sched.max_steps == math.floor(10 * 0.55)
    assert load(tmp_path, MODEL).model.optim.sched.max_steps is None  # train_iters: the run's length
    assert any(
        "min_lr: expected at most the learning rate (0.0006), found 0.001" in message
        for message in errors(tmp_path, {**MODEL, "min_lr": 0.001})
    )


def test_checkpoint_keys(tmp_path):
    c = load(
        tmp_path,
        {
            **MODEL,
            "save": "runs/a",
            "load": "runs/a",
            "checkpoint_factor": 2,
            "checkpoint_scale": "log",
            "extra_save_iters": [0, 3],
            "keep_last_n_checkpoints": 2,
        },
    )
    params = c.exp_manager.checkpoint_callback_params
    assert params.save_at_steps == (1, 2, 3, 4, 8) and params.every_n_train_steps is None  # 2^k <= 10, and 3
    assert (params.save_top_k, params.monitor, params.save_last) == (2, "step", True)
    assert c.exp_manager.resume_if_exists and c.exp_manager.resume_ignore_no_checkpoint
    other = load(tmp_path, {**MODEL, "load": "hub/pythia", "finetune": True})
    assert other.exp_manager.resume_from_checkpoint == "hub/pythia" and other.model.weight_init_only
    assert any(
        "save: expected checkpoint_factor or extra_save_iters with save" in message
        for message in errors(tmp_path, {**MODEL, "save": "runs/a"})
    )


def test_wandb_keys(tmp_path):
    exp = load(
        tmp_path, {**MODEL, "use_wandb": True, "wandb_group": "g", "wandb_team": "t", "wandb_run_name": "r"}
    ).exp_manager
    w = exp.wandb_logger_kwargs
    assert exp.create_wandb_logger and (w.project, w.group, w.entity, w.name, w.host) == ("neox", "g", "t", "r", None)
    assert not load(tmp_path, {**MODEL, "wandb_project": "p"}).exp_manager.create_wandb_logger  # null: off
    assert any(
        "wandb_project: used only with use_wandb: true" in message
        for message in notices(tmp_path, {**MODEL, "wandb_project": "p"})
    )
    assert any(
        "wandb_init_all_ranks: accepted, changes nothing here: nxd logs the job's global values once" in message
        for message in notices(tmp_path, {**MODEL, "use_wandb": True, "wandb_init_all_ranks": True})
    )


def test_profiler_keys(tmp_path):
    """NeoX counts iterations from 0 and profiles profile_step_start..profile_step_stop (nsys's range): the same
    steps, counted from 1."""
    p = load(
        tmp_path,
        {
            **MODEL,
            "profile": True,
            "profile_step_start": 0,
            "profile_step_stop": 2,
            "memory_profiling": True,
            "memory_profiling_path": "mem",
        },
    ).exp_manager.profiler
    assert (p.enabled, p.memory, p.start_step, p.stop_step, p.memory_dir) == (True, True, 1, 3, "mem")
    default = load(tmp_path, {**MODEL, "memory_profiling": True}).exp_manager.profiler
    assert (default.enabled, default.memory, default.start_step, default.stop_step) == (False, True, 11, 13)
    assert not load(tmp_path, MODEL).exp_manager.profiler.enabled
    assert any(
        "profile_step_start: used only with profile or memory_profiling" in message
        for message in notices(tmp_path, {**MODEL, "profile_step_start": 3})
    )
    assert any(
        "memory_profiling_path: used only with memory_profiling" in message
        for message in notices(tmp_path, {**MODEL, "profile": True, "memory_profiling_path": "m"})
    )
    assert any(
        "profile_step_stop: expected an iteration at or after profile_step_start (10), found 5" in message
        for message in errors(tmp_path, {**MODEL, "profile": True, "profile_step_stop": 5})
    )


def test_statistics_keys(tmp_path):
    exp = load(
        tmp_path,
        {
            **MODEL,
            "log_grad_pct_zeros": True,
            "log_optimizer_states": True,
            "log_gradient_noise_scale": True,
            "gradient_noise_scale_n_batches": 3,
            "gradient_noise_scale_cpu_offload": True,
        },
    ).exp_manager
    noise = exp.gradient_noise_scale
    assert (
        exp.log_gradient_zeros
        and exp.log_optimizer_states
        and (noise.enabled, noise.n_batches, noise.cpu_offload) == (True, 3, True)
    )
    plain = load(tmp_path, MODEL).exp_manager
    assert not (plain.log_gradient_zeros or plain.log_optimizer_states or plain.gradient_noise_scale.enabled)
    assert plain.gradient_noise_scale.n_batches == 5  # NeoX's default, nxd's too
    assert (
        load(tmp_path, {**MODEL, "char_level_ppl": True}).trainer.char_level_ppl
        and not load(tmp_path, MODEL).trainer.char_level_ppl
    )
    assert any(
        "gradient_noise_scale_n_batches: used only with log_gradient_noise_scale" in message
        for message in notices(tmp_path, {**MODEL, "gradient_noise_scale_n_batches": 3})
    )


def test_curriculum_learning_block(tmp_path):
    block = {
        "enabled": True,
        "curriculum_type": "seqlen",
        "min_difficulty": 64,
        "max_difficulty": 128,
        "schedule_type": "fixed_root",
        "schedule_config": {"total_curriculum_step": 100, "difficulty_step": 8, "root_degree": 2},
    }
    c = load(tmp_path, {**MODEL, "curriculum_learning": block}).data.curriculum
    assert (c.enabled, c.min_length, c.max_length, c.schedule, c.total_steps, c.length_step, c.root_degree) == (
        True,
        64,
        128,
        "fixed_root",
        100,
        8,
        2,
    )
    discrete = {
        **block,
        "schedule_type": "fixed_discrete",
        "schedule_config": {"difficulty": [64, 128], "max_step": [10]},
    }
    d = load(tmp_path, {**MODEL, "curriculum_learning": discrete}).data.curriculum
    assert (d.schedule, d.lengths, d.max_steps) == ("fixed_discrete", (64, 128), (10,))
    assert not load(tmp_path, {**MODEL, "curriculum_learning": {**block, "enabled": False}}).data.curriculum.enabled
    assert any(
        "curriculum_learning.curriculum_type: expected seqlen" in message
        for message in errors(
            tmp_path, {**MODEL, "curriculum_learning": {**block, "curriculum_type": "vocabularyrarity"}}
        )
    )
    assert any(
        "curriculum_learning.schedule_config.total_step: expected one of" in message
        for message in errors(
            tmp_path, {**MODEL, "curriculum_learning": {**block, "schedule_config": {"total_step": 3}}}
        )
    )


def test_deepspeed_scheduler_block(tmp_path):
    block = {
        "type": "OneCycle",
        "params": {"cycle_min_lr": 1e-5, "cycle_max_lr": 1e-3, "cycle_first_step_size": 50, "last_batch_iteration": -1},
    }
    sched = load(tmp_path, {**MODEL, "scheduler": block}).model.optim.sched
    assert (sched.name, sched.type, sched.cycle_min_lr, sched.cycle_max_lr, sched.cycle_first_step_size) == (
        "DeepSpeedSchedule",
        "OneCycle",
        1e-5,
        1e-3,
        50,
    )
    assert any(
        "lr_decay_style: DeepSpeed's scheduler block sets the learning rates instead" in message
        for message in notices(tmp_path, {**MODEL, "scheduler": block, "lr_decay_style": "cosine"})
    )
    assert any(
        "scheduler.type: expected one of WarmupLR" in message
        for message in errors(tmp_path, {**MODEL, "scheduler": {"type": "Cyclic", "params": {}}})
    )
    assert any(
        "WarmupDecayLR needs total_num_steps" in message
        for message in errors(tmp_path, {**MODEL, "scheduler": {"type": "WarmupDecayLR", "params": {}}})
    )


def test_apex_amp_block(tmp_path):
    p = load(tmp_path, {**MODEL, "amp": {"enabled": True, "opt_level": "O1"}}).precision
    assert (p.type, p.initial_scale_power, p.loss_scale_window, p.hysteresis, p.loss_scale) == (
        "fp16_autocast",
        16,
        2000,
        1,
        0.0,
    )  # apex's dynamic scaler
    o2 = load(tmp_path, {**MODEL, "amp": {"enabled": True, "opt_level": "O2", "loss_scale": 128.0}}).precision
    assert (o2.type, o2.loss_scale) == ("fp16", 128.0)
    assert load(tmp_path, {**MODEL, "amp": {"enabled": False, "opt_level": "O2"}}).precision.type == "fp32"
    assert any(
        "amp.opt_level: expected O0, O1 or O2, found 'O3': O3 trains fp16 weights without" in message
        for message in errors(tmp_path, {**MODEL, "amp": {"enabled": True, "opt_level": "O3"}})
    )
    assert any(
        "amp.master_weights: overrides a property of the opt level" in message
        for message in errors(tmp_path, {**MODEL, "amp": {"enabled": True, "opt_level": "O1", "master_weights": True}})
    )
    assert any(
        "amp: expected amp without an fp16 or bf16 block" in message
        for message in errors(tmp_path, {**MODEL, "amp": {"enabled": True}, "fp16": {"enabled": True}})
    )


def test_weight_by_num_documents(tmp_path):
    paths = {
        "train_data_paths": ["a", "b"],
        "train_data_weights": [2.0, 1.0],
        "valid_data_paths": ["c"],
        "test_data_paths": ["d"],
        "weight_by_num_documents": True,
        "weighted_sampler_alpha": 0.3,
    }
    assert load(tmp_path, {**MODEL, **paths}).data.blend_by_documents == 0.3
    assert any(
        "train_data_weights: replaced by weights from document counts" in message
        for message in notices(tmp_path, {**MODEL, **paths})
    )
    assert load(tmp_path, {**MODEL, "weighted_sampler_alpha": 0.3}).data.blend_by_documents is None
    assert any(
        "weighted_sampler_alpha: expected a number from 0, found -1" in message
        for message in errors(tmp_path, {**MODEL, **paths, "weighted_sampler_alpha": -1})
    )


def test_label_data_paths(tmp_path):
    paths = {
        "train_data_paths": ["a", "b"],
        "valid_data_paths": ["c"],
        "test_data_paths": ["d"],
        "train_label_data_paths": ["la", "lb"],
        "valid_label_data_paths": ["lc"],
    }
    assert load(tmp_path, {**MODEL, **paths}).data.label_prefixes == {"a": "la", "b": "lb", "c": "lc"}
    found = errors(tmp_path, {**MODEL, **paths, "train_label_data_paths": ["la"]})
    assert any(
        "train_label_data_paths: expected one label prefix per train_data_paths entry (['a', 'b']), found "
        "['la']" in message
        for message in found
    )
    found = errors(tmp_path, {**MODEL, "data_path": "x", "train_label_data_paths": ["la"]})
    assert any(
        "train_label_data_paths: expected train/valid/test_data_paths with label data paths" in message
        for message in found
    )


def test_resume_keys(tmp_path):
    """load elsewhere starts fresh when empty (NeoX's rule); iteration picks global_stepN; no_load_optim and
    no_load_rng skip what they name; the schedule on resume follows NeoX's three cases."""
    plain = load(tmp_path, {**MODEL, "load": "runs/old"}).exp_manager
    assert (plain.resume_from_checkpoint, plain.resume_from_checkpoint_optional) == ("runs/old", True)
    assert (plain.resume_optimizer, plain.resume_rng, plain.resume_schedule) == (True, True, "same")
    picked = load(
        tmp_path,
        {
            **MODEL,
            "load": "runs/old",
            "iteration": 2000,
            "no_load_optim": True,
            "no_load_rng": True,
            "use_checkpoint_lr_scheduler": True,
        },
    ).exp_manager
    assert (picked.resume_from_checkpoint, picked.resume_from_checkpoint_optional) == (
        "runs/old/global_step2000",
        False,
    )
    assert (picked.resume_optimizer, picked.resume_rng, picked.resume_schedule) == (False, False, "checkpoint")
    both = {"override_lr_scheduler": True, "use_checkpoint_lr_scheduler": True}
    assert load(tmp_path, {**MODEL, **both}).exp_manager.resume_schedule == "config"  # NeoX checks override first
    found = errors(tmp_path, {**MODEL, "iteration": 5})
    assert any("iteration: expected load (the folder holding global_stepN) with it, found no load" in m for m in found)
    found = errors(tmp_path, {**MODEL, "load": "runs/old", "iteration": "last", "no_load_optim": "yes"})
    assert any("iteration: expected a checkpoint's iteration (a whole number), found 'last'" in m for m in found)
    assert any("no_load_optim: expected true or false, found 'yes'" in m for m in found)


def test_data_keys(tmp_path):
    d = load(tmp_path, {**MODEL, "data_path": "data/x_text_document", "split": "949,50,1"}).data
    assert (d.data_prefix, d.splits_string, d.data_impl) == ("data/x_text_document", "949,50,1", "infer")
    for impl in ("mmap", "cached"):  # NeoX's default is infer: the file's magic decides
        assert load(tmp_path, {**MODEL, "data_path": "d", "data_impl": impl}).data.data_impl == impl
    paths = {
        "train_data_paths": ["a", "b"],
        "train_data_weights": [2.0, 1.0],
        "valid_data_paths": ["c"],
        "test_data_paths": ["d"],
    }
    blends = load(tmp_path, {**MODEL, **paths}).data.data_prefix
    assert (blends.train, blends.validation, blends.test) == ((2.0, "a", 1.0, "b"), (1.0, "c"), (1.0, "d"))
    assert any(
        "valid_data_paths: expected train, valid and test data paths together" in message
        for message in errors(tmp_path, {**MODEL, "train_data_paths": ["a"], "test_data_paths": ["d"]})
    )


def test_label_files_without_their_data_files_are_refused(tmp_path):
    """Only the label keys: the run would otherwise train on the built-in corpus and never read them."""
    labels = {f"{split}_label_data_paths": [f"{split}_label_document"] for split in ("train", "valid", "test")}
    assert any(
        "train_label_data_paths: expected train/valid/test_data_paths beside label data paths (a label file "
        "masks the loss of its data file's documents), found none" in message
        for message in errors(tmp_path, {**MODEL, **labels})
    )


@pytest.mark.parametrize(
    ("keys", "tokenizer"),
    [
        (
            {"vocab_file": "v.json", "merge_file": "m.txt"},
            {"library": "megatron", "type": "GPT2BPETokenizer", "vocab_file": "v.json", "merge_file": "m.txt"},
        ),
        (
            {"tokenizer_type": "HFTokenizer", "vocab_file": "t/tokenizer.json"},
            {"library": "huggingface", "type": "t/tokenizer.json"},
        ),
        (
            {"tokenizer_type": "SPMTokenizer", "vocab_file": "spm/tokenizer.model"},
            {"library": "sentencepiece", "model": "spm/tokenizer.model"},
        ),
        (
            {"tokenizer_type": "SPMTokenizer", "vocab_file": "m/mistral.model"},
            {"library": "sentencepiece", "model": "m/mistral.model"},
        ),
        ({"tokenizer_type": "CharLevelTokenizer"}, {"library": "megatron", "type": "CharLevelTokenizer"}),
        (
            {"tokenizer_type": "TiktokenTokenizer", "vocab_file": "cl100k_base"},
            {"library": "megatron", "type": "TiktokenTokenizer", "vocab_file": "cl100k_base"},
        ),
    ],
)
def test_tokenizer_keys(tmp_path, keys, tokenizer):
    found = load(tmp_path, {**MODEL, **keys}).data.tokenizer
    assert {key: getattr(found, key) for key in tokenizer} == tokenizer


def test_neox_optimizers_lion_and_madgrad_wd(tmp_path):
    lion = load(
        tmp_path,
        {**MODEL, "weight_decay": 0.1, "optimizer": {"type": "Lion", "params": {"lr": 1e-4, "betas": [0.95, 0.98]}}},
    ).model.optim
    assert (lion.name, lion.lr, lion.betas, lion.weight_decay) == ("lion", 1e-4, (0.95, 0.98), 0.1)
    madgrad = load(
        tmp_path, {**MODEL, "optimizer": {"type": "madgrad_wd", "params": {"lr": 0.01, "momentum": 0.8, "eps": 1e-7}}}
    ).model.optim
    assert (madgrad.name, madgrad.lr, madgrad.momentum, madgrad.eps) == ("madgrad_wd", 0.01, 0.8, 1e-7)


def test_neox_sm3_takes_its_params_and_no_weight_decay(tmp_path):
    """NeoX builds SM3(param_groups, **params): the groups' weight_decay is never read, so nxd's is 0."""
    file = {
        **MODEL,
        "weight_decay": 0.01,
        "optimizer": {"type": "sm3", "params": {"lr": 0.05, "momentum": 0.5, "beta": 0.9, "eps": 1e-20}},
    }
    assert any(
        "weight_decay: GPT-NeoX's SM3 applies no weight decay, so nxd trains without it too (found 0.01)" in notice
        for notice in notices(tmp_path, file)
    )
    sm3 = load(tmp_path, file).model.optim
    assert (sm3.name, sm3.lr, sm3.momentum, sm3.beta, sm3.eps, sm3.weight_decay) == ("sm3", 0.05, 0.5, 0.9, 1e-20, 0.0)


def test_neox_bnb_optimizer_is_eight_bit_adam_and_a_stable_position_table(tmp_path):
    """NeoX's get_optimizer: bitsandbytes' Adam8bit(param_groups, weight_decay=..., **params) for type Adam; its
    Embedding: the learned position table a StableEmbedding whatever the optimizer."""
    file = {
        **MODEL,
        "use_bnb_optimizer": True,
        "weight_decay": 0.01,
        "pos_emb": "learned",
        "optimizer": {"type": "Adam", "params": {"lr": 0.002, "betas": [0.8, 0.9], "eps": 1e-7, "min_8bit_size": 100}},
    }
    config = load(tmp_path, file)
    optim = config.model.optim
    assert (optim.name, optim.lr, optim.betas, optim.eps, optim.min_8bit_size, optim.weight_decay) == (
        "adam8bit",
        0.002,
        (0.8, 0.9),
        1e-7,
        100,
        0.01,
    )
    assert config.model.position_embedding_norm is True
    assert load(tmp_path, {**file, "pos_emb": "rotary"}).model.position_embedding_norm is False
    assert any(
        "optimizer.params.adam_w_mode: unknown parameter of Adam; expected one of betas, eps, lr, "
        "min_8bit_size" in message
        for message in errors(
            tmp_path, {**file, "optimizer": {"type": "Adam", "params": {"lr": 0.002, "adam_w_mode": True}}}
        )
    )
    lion = {**file, "optimizer": {"type": "lion", "params": {"lr": 1e-4}}}
    assert any(
        "use_bnb_optimizer: GPT-NeoX steps with bitsandbytes' 8-bit Adam only for optimizer type Adam without "
        "use_mup; lion steps as without it, in nxd too" in notice
        for notice in notices(tmp_path, lion)
    )
    assert (load(tmp_path, lion).model.optim.name, load(tmp_path, lion).model.position_embedding_norm) == ("lion", True)
    paged = {**file, "optimizer": {"type": "Adam", "params": {"lr": 0.002, "amsgrad": False, "is_paged": True}}}
    assert load(tmp_path, paged).model.optim.name == "adam8bit"
    assert any(
        "optimizer.params.is_paged: bitsandbytes pages its state to host memory" in notice
        for notice in notices(tmp_path, paged)
    )
    assert any(
        "optimizer.params.optim_bits: expected 8 with use_bnb_optimizer" in message
        for message in errors(
            tmp_path, {**file, "optimizer": {"type": "Adam", "params": {"lr": 0.002, "optim_bits": 32}}}
        )
    )
    assert any(
        "use_bnb_optimizer: expected true or false, found 'yes'" in message
        for message in errors(tmp_path, {**file, "use_bnb_optimizer": "yes"})
    )


def test_pack_impl_and_allow_chopped(tmp_path):
    d = load(tmp_path, {**MODEL, "pack_impl": "pack_until_overflow", "allow_chopped": False}).data
    assert (d.pack_impl, d.allow_chopped) == ("pack_until_overflow", False)
    assert load(tmp_path, {**MODEL}).data.pack_impl == "packed"
    assert any(
        "pack_impl: expected one of packed, pack_until_overflow, unpacked, found 'padded'" in message
        for message in errors(tmp_path, {**MODEL, "pack_impl": "padded"})
    )
    with pytest.warns(
        ConfigNotice,
        match=r"allow_chopped \(nxd: data.allow_chopped\): acted on only with pack_impl pack_until_overflow",
    ):
        load(tmp_path, {**MODEL, "allow_chopped": False})


def test_tokenizer_keys_that_cannot_work_are_refused(tmp_path):
    assert any(
        "vocab_file: expected a tiktoken encoding name (such as cl100k_base) for TiktokenTokenizer, found "
        "None" in message
        for message in errors(tmp_path, {**MODEL, "tokenizer_type": "TiktokenTokenizer"})
    )
    assert any(
        "tokenizer_type: expected GPT2BPETokenizer, HFTokenizer, HFGPT2Tokenizer, SPMTokenizer, "
        "CharLevelTokenizer or TiktokenTokenizer, found 'BertTokenizer'" in message
        for message in errors(tmp_path, {**MODEL, "tokenizer_type": "BertTokenizer"})
    )


def test_a_translated_run_writes_as_an_nxdt_file_that_loads_to_the_same_config(tmp_path):
    c = load(
        tmp_path,
        {
            **MODEL,
            "pos_emb": "rotary",
            "rotary_pct": 0.25,
            "gpt_j_residual": True,
            "bias_gelu_fusion": True,
            "lr_decay_style": "cosine",
            "bf16": {"enabled": True},
            "zero_optimization": {"stage": 1},
            "num_gpus": 2,
            "save": "runs/a",
            "checkpoint_factor": 5,
            "extra_save_iters": [1],
        },
    )
    text = to_nxdt_yaml(c)
    assert "transformer_block_type: gpt_neox  # nxd extension" in text
    assert "name: NeoXAnnealing  # nxd extension" in text and "position_embedding_type: rope\n" in text
    again = load_config(write(tmp_path, "translated.yaml", text))
    assert again.model_dump() == c.model_dump()


WRONG_VALUES = [
    "x",
    [1, [2]],
    {"a": 1},
    -1,
    0,
    1.5,
    True,
    None,
    [],
    {},
    [[["flash"], "x"]],
    {"stage": "x"},
    {"enabled": True, "type": 3},
    {"type": "Adam", "params": {"lr": "x"}},
    2**70,
]


def _fuzz_cases() -> list[tuple[str, Any]]:
    """300 (key, wrong value) pairs from a fixed seed, over every NeoX key."""
    import random

    generator = random.Random(20261125)
    keys = sorted(NEOX_KEYS)
    return [(generator.choice(keys), generator.choice(WRONG_VALUES)) for _ in range(300)]


@pytest.mark.parametrize(
    "cases", [slice(0, 100), pytest.param(slice(100, None), marks=pytest.mark.slow)], ids=["first 100", "the other 200"]
)
def test_any_value_of_any_key_gets_an_answer_never_a_traceback(cases, tmp_path):
    for key, value in _fuzz_cases()[cases]:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                load(tmp_path, {**MODEL, key: value})
        except ConfigError as error:
            assert all(": " in issue.render(error.source) for issue in error.issues), (key, value)


PAIRWISE = {
    "train_impl": "dpo",
    "dataset_impl": "pairwise",
    "pack_impl": "unpacked",
    "pos_train_data_paths": ["c"],
    "neg_train_data_paths": ["r"],
    "pos_train_label_data_paths": ["cl"],
    "neg_train_label_data_paths": ["rl"],
    "pos_valid_data_paths": ["vc"],
    "neg_valid_data_paths": ["vr"],
}
KTO = {
    "train_impl": "kto",
    "pack_impl": "unpacked",
    "kto_beta": 0.2,
    "kto_desirable_weight": 1.33,
    **{
        f"{split}_{kind}": [f"{split}_{kind}"]
        for split in ("train", "valid", "test")
        for kind in ("data_paths", "label_data_paths", "reward_data_paths")
    },
}


def test_post_training_keys_become_nxd_methods_and_documents(tmp_path):
    config = load(tmp_path, {**MODEL, **PAIRWISE, "dpo_beta": 0.05, "precompute_model_name": "ref"})
    dpo, pairs = config.model_alignment_strategy.dpo, config.data.pair_documents
    assert (dpo.kl_beta, dpo.reference_free) == (0.05, False)
    assert (
        pairs.train.chosen,
        pairs.train.rejected,
        pairs.train.chosen_labels,
        pairs.train.rejected_labels,
        pairs.train.chosen_reference,
        pairs.validation.rejected_reference,
    ) == ("c", "r", "cl", "rl", "c_ref", "vr_ref")
    assert pairs.validation.chosen_labels is None and pairs.test is None
    rm = load(tmp_path, {**MODEL, **PAIRWISE, "train_impl": "rm", "z_loss": 0.01})
    assert rm.model_alignment_strategy.reward_model.z_loss == 0.01
    kto = load(tmp_path, {**MODEL, **KTO})
    block, examples = kto.model_alignment_strategy.kto, kto.data.example_documents
    assert (block.beta, block.desirable_weight, block.kl_estimate) == (0.2, 1.33, "batch_halves")
    assert (examples.test.documents, examples.test.labels, examples.test.rewards) == (
        "test_data_paths",
        "test_label_data_paths",
        "test_reward_data_paths",
    )
    assert kto.data.data_prefix is None and kto.data.label_prefixes is None
    assert any(
        "kto_fp32: accepted, changes nothing here: nxd takes KTO's log-probs in fp32" in message
        for message in notices(tmp_path, {**MODEL, **KTO, "kto_fp32": False})
    )
    assert any(
        "split: accepted, changes nothing here: train_impl kto reads one path a split" in message
        for message in notices(tmp_path, {**MODEL, **KTO, "split": "90,5,5"})
    )


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"neg_train_data_paths": None}, "neg_train_data_paths: expected pos and neg train data paths together"),
        (
            {"neg_train_label_data_paths": None},
            "neg_train_label_data_paths: expected pos and neg train label paths together (or neither)",
        ),
        (
            {"pos_train_data_paths": ["a", "b"]},
            "pos_train_data_paths: expected one path prefix in a list (nxd reads one "
            "set of post-training files a split",
        ),
        ({"data_path": "d"}, "data_path: expected it unset with train_impl dpo, which reads pos/neg_*_data_paths"),
        (
            {"dpo_reference_free": True, "precompute_model_name": "ref"},
            "precompute_model_name: expected none with dpo_reference_free: true",
        ),
        ({"train_impl": "kto"}, "pos_train_data_paths: expected none with train_impl kto"),
        (
            {"dataset_impl": "online"},
            "dataset_impl: expected pairwise with train_impl dpo (GPT-NeoX reads pos/neg pairs for it), found online",
        ),
        ({"train_impl": "normal"}, "dataset_impl: expected gpt2 with train_impl normal"),
    ],
)
def test_post_training_files_that_cannot_work_are_refused_by_key(tmp_path, keys, message):
    found = errors(tmp_path, {**MODEL, **{k: v for k, v in {**PAIRWISE, **keys}.items() if v is not None}})
    assert any(message in item for item in found), found


def test_kto_without_rewards_is_refused(tmp_path):
    found = errors(tmp_path, {**MODEL, **{k: v for k, v in KTO.items() if k != "train_reward_data_paths"}})
    assert any(
        "train_reward_data_paths: expected one reward document per example with train_impl kto" in item
        for item in found
    ), found


def test_launcher_keys_size_the_run_and_shape_its_job(tmp_path):
    """A hostfile of three 4-slot hosts with one excluded and num_gpus 2: two nodes of two processes (DeepSpeed's
    picking), a hosts job; launcher slurm makes it an sbatch job."""
    (tmp_path / "hostfile").write_text("a slots=4\nb slots=4\nc slots=4\n")
    keys = {
        "hostfile": str(tmp_path / "hostfile"),
        "exclude": "b",
        "num_gpus": 2,
        "master_port": 29600,
        "train_micro_batch_size_per_gpu": 2,
        "comment": "run 7",
    }
    config = load(tmp_path, MODEL | keys)
    t, cluster = config.trainer, config.trainer.cluster
    assert (t.devices, t.num_nodes, config.data.global_batch_size) == (2, 2, 8)
    assert (cluster.scheduler, cluster.exclude, cluster.master_port, cluster.comment) == ("hosts", "b", 29600, "run 7")
    assert load(tmp_path, MODEL | keys | {"launcher": "slurm"}).trainer.cluster.scheduler == "slurm"
    with pytest.raises(ConfigError, match=r"exclude: 'x' is not a host of the hostfile"):
        load(tmp_path, MODEL | keys | {"exclude": "x"})
    # DeepSpeed's launcher (fetch_hostfile) trains on this machine alone when the hostfile is not a file
    local = load(tmp_path, MODEL | {"hostfile": "/mock_path", "exclude": "b"})
    assert (local.trainer.num_nodes, local.trainer.cluster.scheduler, local.trainer.cluster.hostfile) == (
        1,
        "slurm",
        None,
    )
    assert any(
        "hostfile: /mock_path is not a file; DeepSpeed's launcher then trains on this machine's devices alone" in line
        for line in notices(tmp_path, MODEL | {"hostfile": "/mock_path"})
    )


def test_shared_layers_map_and_a_style_alone_is_noticed(tmp_path):
    model = load(tmp_path, {**MODEL, "num_unique_layers": 2, "param_sharing_style": "spaced"}).model
    assert (model.num_unique_layers, model.param_sharing_style) == (2, "spaced")
    found = notices(tmp_path, {**MODEL, "param_sharing_style": "spaced"})
    assert any("param_sharing_style: accepted, changes nothing here" in line for line in found), found
    found = errors(tmp_path, {**MODEL, "num_unique_layers": 3})
    assert any(
        "num_unique_layers (nxd: model.num_unique_layers): expected a divisor of num_layers (4), found 3" in line
        for line in found
    ), found


def test_soft_prompt_tuning_becomes_the_soft_prompt_when_enabled(tmp_path):
    prompt = {"enabled": True, "n_tokens": 6, "init_string": "def main", "init_range": 0.25}
    soft = load(tmp_path, {**MODEL, "soft_prompt_tuning": prompt}).model.soft_prompt
    assert (soft.n_tokens, soft.init_string, soft.init_range) == (6, "def main", 0.25)
    assert (
        load(tmp_path, {**MODEL, "soft_prompt_tuning": {"enabled": True, "num_tokens": 4}}).model.soft_prompt.n_tokens
        == 4
    )
    found = notices(tmp_path, {**MODEL, "soft_prompt_tuning": {"n_tokens": 6}})
    assert any(
        "soft_prompt_tuning: accepted, changes nothing here: NeoX prompt-tunes only with enabled: true" in line
        for line in found
    ), found
    found = errors(tmp_path, {**MODEL, "soft_prompt_tuning": {"enabled": True, "tokens": 6}})
    assert any(
        "soft_prompt_tuning.tokens: expected entries among enabled, n_tokens, num_tokens, init_string, "
        "init_range, found tokens" in line
        for line in found
    ), found


def test_exit_interval_becomes_trainer_exit_interval(tmp_path):
    assert load(tmp_path, {**MODEL, "exit_interval": 4}).trainer.exit_interval == 4
    assert load(tmp_path, MODEL).trainer.exit_interval is None


def test_deepspeed_moe_kernel_and_grouping_keys_are_noticed(tmp_path):
    """Choices of DeepSpeed's MoE engine with the arithmetic nxd's MoE computes anyway."""
    found = notices(
        tmp_path,
        {**MODEL, "use_tutel": True, "create_moe_param_group": False, "enable_expert_tensor_parallelism": True},
    )
    for key in ("use_tutel", "create_moe_param_group", "enable_expert_tensor_parallelism"):
        assert any(f"{key}: accepted, changes nothing here" in line for line in found), (key, found)


def test_use_mup_becomes_model_mup_stepped_by_mups_adam(tmp_path):
    keys = {
        "use_mup": True,
        "base_shapes_file": "base.bsh",
        "mup_init_scale": 0.5,
        "mup_attn_temp": 2.0,
        "mup_output_temp": 3.0,
        "mup_embedding_mult": 4.0,
        "mup_rp_embedding_mult": 0.25,
        "mup_width_scale": 4,
    }
    model = load(tmp_path, {**MODEL, **keys}).model
    assert (
        model.mup.base_shapes_file,
        model.mup.init_scale,
        model.mup.attention_temperature,
        model.mup.output_temperature,
        model.mup.embedding_multiplier,
        model.mup.width_scale,
    ) == ("base.bsh", 0.5, 2.0, 3.0, 4.0, 4)
    assert model.position_embedding_multiplier == 0.25 and model.optim.name == "adam"  # MuAdam: torch's Adam
    plain = load(tmp_path, {**MODEL, "mup_rp_embedding_mult": 0.25}).model
    assert plain.mup is None and plain.position_embedding_multiplier == 0.25  # NeoX scales positions without muP
    found = notices(tmp_path, {**MODEL, "mup_attn_temp": 2.0})
    assert any(
        "mup_attn_temp: accepted, changes nothing here: NeoX reads it only with use_mup: true" in line for line in found
    ), found
    assert load(tmp_path, {**MODEL, **keys, "coord_check": True}).model.mup.coord_check


def test_te_fp8_mha_becomes_torchaos_float8(tmp_path):
    fp8 = load(tmp_path, {**MODEL, "te_fp8_mha": True, "te_fp8_format": "e4m3", "te_fp8_wgrad": False}).precision.fp8
    assert (fp8.recipe, fp8.format, fp8.weight_gradient, fp8.emulate) == ("tensorwise", "e4m3", False, False)
    assert load(tmp_path, MODEL).precision.fp8 is None
    found = notices(tmp_path, {**MODEL, "te_fp8_mha": True, "te_fp8_amax_history_len": 16})
    assert any(
        "te_fp8_amax_history_len: 16: Transformer Engine's delayed scaling keeps a history of amaxes" in line
        for line in found
    ), found
    found = notices(tmp_path, {**MODEL, "te_fp8_format": "e4m3"})
    assert any(
        "te_fp8_format: accepted, changes nothing here: NeoX reads it only with te_fp8_mha: true" in line
        for line in found
    ), found
    found = errors(tmp_path, {**MODEL, "te_fp8_mha": True, "te_fp8_margin": 2})
    assert any(
        "te_fp8_margin: expected 0, found 2: torchao's float8 scales to the format's full range" in line
        for line in found
    ), found


def test_neox_comet_keys(tmp_path):
    comet = {
        "use_comet": True,
        "comet_workspace": "team",
        "comet_project": "neox",
        "comet_experiment_name": "run-1",
        "comet_tags": ["a", "b"],
        "comet_others": {"owner": "me"},
    }
    exp = load(tmp_path, {**MODEL, **comet}).exp_manager
    assert exp.create_comet_logger
    kwargs = exp.comet_logger_kwargs
    assert (kwargs.workspace, kwargs.project, kwargs.name, kwargs.tags, kwargs.others) == (
        "team",
        "neox",
        "run-1",
        ("a", "b"),
        {"owner": "me"},
    )
    found = notices(tmp_path, {**MODEL, "comet_project": "neox"})
    assert any("comet_project: used only with use_comet: true, which this run does not set" in n for n in found)
    assert not load(tmp_path, {**MODEL, "comet_project": "neox"}).exp_manager.create_comet_logger


def test_neox_s3_keys(tmp_path):
    exp = load(
        tmp_path,
        {**MODEL, "save": "runs/x", "checkpoint_factor": 10, "s3_path": "s3://bucket/neox", "s3_chunk_size": 8388608},
    ).exp_manager
    assert (exp.s3_checkpoints.path, exp.s3_checkpoints.chunk_size) == ("s3://bucket/neox", 8388608)
    assert load(tmp_path, {**MODEL}).exp_manager.s3_checkpoints.path is None
    found = notices(tmp_path, {**MODEL, "s3_chunk_size": 8388608})
    assert any("s3_chunk_size: used only with s3_path, which this run does not set" in n for n in found)
    assert any("s3_path: expected save with it" in m for m in errors(tmp_path, {**MODEL, "s3_path": "s3://bucket"}))
    wrong = errors(tmp_path, {**MODEL, "save": "runs/x", "checkpoint_factor": 10, "s3_path": "bucket/neox"})
    assert any("expected s3://bucket or s3://bucket/prefix, found 'bucket/neox'" in m for m in wrong), wrong
    small = errors(
        tmp_path, {**MODEL, "save": "runs/x", "checkpoint_factor": 10, "s3_path": "s3://b", "s3_chunk_size": 1024}
    )
    assert any("chunk_size" in m and "5242880" in m for m in small), small


def test_reinforce_becomes_grpo_with_neox_settings():
    """train_impl reinforce: GRPO with GPT-NeoX's baseline, unscaled rewards, its KL estimate and beta and no
    importance correction; the generation server's keys are notices (nxd samples the completions itself)."""
    keys = {"train_impl": "reinforce", "dataset_impl": "online", "online_dataserver_ports": [10000, 10001]}
    for extra, baseline, estimator in (
        ({"reinforce_leave_one_out": True, "kl_impl": "abs", "kl_div_beta": 0.05}, "leave_one_out", "abs"),
        ({"kl_impl": "kl"}, "running_mean", "k1"),
        ({}, "running_mean", "mse"),
    ):
        t = translate({**MODEL, **keys, **extra}, "run")
        assert t.tree["model_alignment_strategy"]["grpo"] == {
            "baseline": baseline,
            "scale_rewards": "none",
            "loss_type": "dapo",
            "beta": extra.get("kl_div_beta", 0.1),
            "kl_estimator": estimator,
            "kl_importance_correction": False,
            "max_new_tokens": 64,  # half of seq_length
        }
        said = " ".join(t.notices)
        assert "dataset_impl: accepted: online reads the samples a generation server sends" in said
        assert "online_dataserver_ports: accepted, changes nothing here" in said
        assert not t.issues
