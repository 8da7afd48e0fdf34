"""GPT-NeoX checkpoints load into nxd's model: written in NeoX's layout (tests/neox_checkpoints.py) from
transformers' GPTNeoXForCausalLM and LlamaForCausalLM, whose logits are the reference."""

from __future__ import annotations

import pytest
import torch
from nxd_ckpt import (
    CheckpointError,
    check_neox_weights,
    find_neox_checkpoint,
    load_neox_weights,
    neox_iteration,
)
from nxd_models import GPTConfig, build_causal_lm, causal_lm_logits, model_family
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM

from tests.neox_checkpoints import llama_parts, pythia_parts, write_neox_checkpoint

from .test_hf import SEQ, random_weights, tokens
from .test_hf_gpt_neox import VOCAB, pythia_shaped

NEOX_VOCAB = 384
"""NeoX pads the vocabulary to its own multiple (make_vocab_size_divisible_by x tensor-parallel size)."""


def _pythia(parallel: bool = True) -> GPTNeoXForCausalLM:
    config = GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=SEQ,
        rotary_pct=0.25,
        use_parallel_residual=parallel,
        hidden_act="gelu",
        tie_word_embeddings=False,
    )
    torch.manual_seed(5)
    model = GPTNeoXForCausalLM(config).eval()
    random_weights(model)
    return model


def _llama(kv_heads: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        intermediate_size=48,
        max_position_embeddings=SEQ,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    torch.manual_seed(6)
    model = LlamaForCausalLM(config).eval()
    random_weights(model)
    return model


def llama_shaped(kv_heads: int) -> GPTConfig:
    return GPTConfig(
        vocab_size=VOCAB,
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_kv_heads=kv_heads,
        seq_length=SEQ,
        ffn_hidden_size=48,
        normalization="rmsnorm",
        layernorm_epsilon=1e-6,
        position_embedding_type="rope",
        activation="swiglu",
        has_bias=False,
        share_embeddings_and_output_weights=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        make_vocab_size_divisible_by=64,
    )


def _loaded(spec: GPTConfig, load) -> torch.nn.Module:
    ours = build_causal_lm(spec).eval()
    family = model_family(spec)
    check_neox_weights(load, family.neox_layout(), family.parameter_shapes())
    load_neox_weights(load, family.neox_layout(), family.parameter_shapes(), dict(ours.state_dict()))
    return ours


def _difference(ours: torch.nn.Module, theirs: torch.nn.Module) -> float:
    ids, positions = tokens(VOCAB)
    with torch.no_grad():
        return (causal_lm_logits(ours, ids, positions)[..., :VOCAB] - theirs(input_ids=ids).logits).abs().max().item()


@pytest.mark.parametrize(
    ("ranks", "pipelined", "older"),
    [(2, True, False), (2, False, True), (1, False, False)],
    ids=["tp2-layer-files", "tp2-module-files-older-names", "tp1-module-file"],
)
def test_a_pythia_checkpoint_loads_with_the_logits_of_its_weights(tmp_path, ranks, pipelined, older):
    pythia = _pythia()
    parts = pythia_parts(pythia, ranks, NEOX_VOCAB, older_mlp_names=older)
    write_neox_checkpoint(tmp_path / "load", parts, iteration=40, pipelined=pipelined)
    ours = _loaded(pythia_shaped(activation="gelu"), tmp_path / "load")
    assert _difference(ours, pythia) < 1e-5
    assert neox_iteration(find_neox_checkpoint(tmp_path / "load")) == 40


def test_a_sequential_block_holds_its_row_parallel_bias_on_every_rank(tmp_path):
    pythia = _pythia(parallel=False)
    write_neox_checkpoint(
        tmp_path / "load", pythia_parts(pythia, 2, NEOX_VOCAB, parallel=False), iteration=3, pipelined=True
    )
    ours = _loaded(
        pythia_shaped(activation="gelu", transformer_block_type="pre_ln"), tmp_path / "load" / "global_step3"
    )
    assert _difference(ours, pythia) < 1e-5


@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
def test_a_llama_checkpoint_loads_with_the_logits_of_its_weights(tmp_path, kv_heads):
    llama = _llama(kv_heads)
    write_neox_checkpoint(tmp_path / "load", llama_parts(llama, 2, NEOX_VOCAB), iteration=7, pipelined=True)
    assert _difference(_loaded(llama_shaped(kv_heads), tmp_path / "load"), llama) < 1e-5


def test_a_tensor_parallel_model_keeps_its_own_part(tmp_path):
    """Loaded into DTensor shards of another layout, each rank's part is that of the whole tensor."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    pythia = _pythia()
    write_neox_checkpoint(tmp_path / "load", pythia_parts(pythia, 2, NEOX_VOCAB), iteration=1, pipelined=False)
    spec = pythia_shaped(activation="gelu")
    whole = _loaded(spec, tmp_path / "load").state_dict()
    family = model_family(spec)
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        targets = {key: distribute_tensor(torch.zeros_like(value), mesh, [Shard(0)]) for key, value in whole.items()}
        load_neox_weights(tmp_path / "load", family.neox_layout(), family.parameter_shapes(), targets)
        for key, value in targets.items():
            assert torch.equal(value.full_tensor(), whole[key]), key
    finally:
        torch.distributed.destroy_process_group()


def test_bad_neox_checkpoints_get_one_message_each(tmp_path):
    spec = pythia_shaped(activation="gelu")
    family = model_family(spec)
    layout, shapes = family.neox_layout(), family.parameter_shapes()
    load = tmp_path / "load"
    folder = write_neox_checkpoint(load, pythia_parts(_pythia(), 2, NEOX_VOCAB), iteration=9, pipelined=True)

    (load / "latest").write_text("global_step10")
    with pytest.raises(CheckpointError, match=r"latest: names 'global_step10', which is not a folder"):
        check_neox_weights(load, layout, shapes)
    (load / "latest").write_text("global_step9")

    (folder / "layer_03-model_01-model_states.pt").unlink()
    with pytest.raises(CheckpointError, match=r"layer_03-model_01-model_states.pt: missing"):
        check_neox_weights(load, layout, shapes)

    with pytest.raises(CheckpointError, match=r"found none"):
        check_neox_weights(tmp_path, layout, shapes)

    wider = pythia_shaped(activation="gelu", hidden_size=64, num_attention_heads=4)
    other = tmp_path / "other"
    write_neox_checkpoint(other, pythia_parts(_pythia(), 2, NEOX_VOCAB), iteration=9, pipelined=True)
    family = model_family(wider)
    with pytest.raises(
        CheckpointError,
        match=r"model.embed_tokens.weight is \[384, 32\] in the GPT-NeoX checkpoint; "
        r"this model's is \[256, 64\]",
    ):
        check_neox_weights(other, family.neox_layout(), family.parameter_shapes())

    deeper = model_family(pythia_shaped(activation="gelu", num_layers=3))
    with pytest.raises(CheckpointError, match=r"layer_04-model_00-model_states.pt: missing"):
        check_neox_weights(other, deeper.neox_layout(), deeper.parameter_shapes())

    llama = model_family(llama_shaped(2))
    with pytest.raises(CheckpointError, match=r"holds no input_layernorm.scale"):
        check_neox_weights(other, llama.neox_layout(), llama.parameter_shapes())

    one_head = model_family(pythia_shaped(activation="gelu", num_attention_heads=1))
    with pytest.raises(CheckpointError, match=r"saved over 2 tensor-parallel ranks, which do not divide the model's 1"):
        check_neox_weights(other, one_head.neox_layout(), one_head.parameter_shapes())

    (other / "global_step9" / "layer_00-model_03-model_states.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"holds the tensor-parallel ranks \[0, 1, 3\] of a GPT-NeoX checkpoint"):
        check_neox_weights(other, layout, shapes)

    (other / "global_step9" / "layer_00-model_03-model_states.pt").unlink()
    (other / "global_step9" / "layer_00-model_00-model_states.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match=r"layer_00-model_00-model_states.pt: not a checkpoint torch loads"):
        check_neox_weights(other, layout, shapes)
