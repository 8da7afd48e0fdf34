"""gMLP and aMLP layers against GPT-NeoX's GMLPBlock written out from its source (megatron/model/gmlp.py) on the
same weights; NeoX's initialisation; decoding against whole sequences; documents; the FLOP count worked by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from nxd_models import GMLPSpec, GPTConfig, ModelConfigError, build_causal_lm
from nxd_models.decoding import decoding_cache, decoding_logits
from nxd_models.flops import training_flops_per_token


def _config(**changes) -> GPTConfig:
    return GPTConfig(
        **{
            **dict(
                vocab_size=64,
                num_layers=3,
                hidden_size=16,
                num_attention_heads=2,
                seq_length=12,
                hidden_dropout=0.0,
                attention_dropout=0.0,
                make_vocab_size_divisible_by=8,
                position_embedding_type="none",
                attention_layers=("gmlp", "amlp", "dense"),
                layer_settings=(GMLPSpec(attention_dim=8),),
            ),
            **changes,
        }
    )


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """NeoX starts W at 0 and b at 1 (the gate as the identity): weights drawn away from the start so that the
    spatial mixing shows."""
    with torch.no_grad():
        generator = torch.Generator().manual_seed(3)
        for name, parameter in model.named_parameters():
            if "spatial_gating" in name:
                parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))
    return model


def _neox_gmlp_block(layer, x: torch.Tensor) -> torch.Tensor:
    """NeoX's GMLPBlock.forward on one rank, as its source computes it ([s, b, h] inside, -10000 masking)."""
    sgu = layer.spatial_gating
    x = x.transpose(0, 1)  # NeoX's [s, b, h]
    x = F.layer_norm(x, x.shape[-1:], layer.input_layernorm.weight, layer.input_layernorm.bias, 1e-5)
    x = F.gelu(x @ layer.input_proj.weight.T)  # skip_bias_add: NeoX's bias is never added
    # SpatialGatingUnit.forward
    n = x.shape[0]
    x = x.transpose(0, 1)
    res, gate = x.chunk(2, dim=-1)
    gate = F.layer_norm(gate, gate.shape[-1:], sgu.norm.weight, sgu.norm.bias, 1e-5)
    weight, bias = sgu.proj.weight[:n, :n], sgu.proj.bias[:n]
    weight = weight.masked_fill(torch.ones(weight.shape[:2]).triu_(1).bool(), 0.0)
    gate = F.linear(gate.transpose(2, 1), weight, bias).transpose(2, 1)
    if sgu.attn is not None:  # TinyAttention.forward
        q, k, v = torch.chunk(x @ sgu.attn.proj_qkv.weight.T + sgu.attn.proj_qkv.bias, 3, dim=-1)
        w = torch.einsum("bnd,bmd->bnm", q, k) * sgu.attn.dim**-0.5
        w = w.masked_fill(torch.ones(n, n).triu_(1).bool(), -10000.0)
        a = torch.softmax(w, dim=-1)
        gate = gate + torch.einsum("bnm,bmd->bnd", a, v) @ sgu.attn.proj_ffn.weight.T + sgu.attn.proj_ffn.bias
    x = (gate * res).transpose(0, 1)
    return (x @ layer.output_proj.weight.T).transpose(0, 1)  # no residual: the block's output is the stream


@pytest.mark.parametrize("index", [0, 1], ids=["gmlp", "amlp"])
def test_each_layer_is_neoxs_gmlp_block_on_the_same_weights(index):
    model = _perturbed(build_causal_lm(_config(), seed=0))
    layer = model.model.layers[index]
    x = torch.randn(2, 12, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(layer(x, None), _neox_gmlp_block(layer, x), atol=1e-6)
        shorter = x[:, :7]  # NeoX's slice of W for a shorter sequence
        assert torch.allclose(layer(shorter, None), _neox_gmlp_block(layer, shorter), atol=1e-6)


def test_neoxs_initialisation_and_widths():
    model = build_causal_lm(_config(), seed=0)
    gmlp, amlp = model.model.layers[0], model.model.layers[1]
    assert gmlp.input_proj.weight.shape == (2 * 64, 16) and gmlp.input_proj.bias is None
    assert gmlp.output_proj.weight.shape == (16, 64) and gmlp.output_proj.bias is None
    assert torch.equal(gmlp.spatial_gating.proj.weight, torch.zeros(12, 12))
    assert torch.equal(gmlp.spatial_gating.proj.bias, torch.ones(12))
    assert gmlp.spatial_gating.attn is None and amlp.spatial_gating.attn.proj_qkv.weight.shape == (24, 128)
    # torch's default draw: kaiming_uniform(a=sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in)), bias likewise
    qkv = amlp.spatial_gating.attn.proj_qkv
    assert qkv.weight.abs().max() <= 128**-0.5 and qkv.bias.abs().max() <= 128**-0.5 and qkv.bias.abs().min() > 0
    assert abs(gmlp.input_proj.weight.std().item() - 0.02) < 0.003  # init_method normal, std 0.02
    assert abs(gmlp.output_proj.weight.std().item() - 0.02 / (2 * 3) ** 0.5) < 0.002  # scaled by 1 / sqrt(2 layers)


def test_decoding_with_a_cache_equals_whole_sequences():
    model = _perturbed(build_causal_lm(_config(), seed=0)).eval()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = model(ids)
        cache = decoding_cache(model)
        first = decoding_logits(model, ids[:, :5], torch.arange(5)[None], cache)
        rest = [decoding_logits(model, ids[:, i : i + 1], torch.tensor([[i]]), cache) for i in range(5, 12)]
        assert torch.allclose(torch.cat([first, *rest], 1), whole, atol=1e-5)
        with pytest.raises(ModelConfigError, match="covers 12 positions"):
            decoding_logits(model, ids[:, :1], torch.tensor([[12]]), cache)


def test_a_packed_document_reads_only_its_own_tokens():
    model = _perturbed(build_causal_lm(_config(), seed=0)).eval()
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    other = ids.clone()
    other[:, :5] = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(9))
    documents = torch.tensor([[0] * 5 + [1] * 7])
    with torch.no_grad():
        packed, changed = model(ids, document_ids=documents), model(other, document_ids=documents)
        alone = model(ids[:, :5])
    assert torch.allclose(packed[:, 5:], changed[:, 5:], atol=1e-6)  # the second document ignores the first
    assert not torch.allclose(packed[:, 5:], model(ids)[:, 5:], atol=1e-4)  # which a plain sequence reads
    assert torch.allclose(packed[:, :5], alone, atol=1e-6)


def test_gradients_reach_every_weight():
    model = _perturbed(build_causal_lm(_config(), seed=0))
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    model(ids, labels=ids).mean().backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum()]
    assert missing == []


def test_flops_count_the_spatial_mixing_per_token():
    config = _config(attention_layers=("gmlp", "amlp", "gmlp"), share_embeddings_and_output_weights=False)
    model = build_causal_lm(config, seed=0)
    h, inner, seq, d, vocab = 16, 64, 12, 8, 64
    gmlp = h * 2 * inner + inner * h  # in and out projections (the 12 x 12 W is not a per-token matmul)
    tiny = 2 * inner * 3 * d + d * inner
    by_hand = 6 * (3 * gmlp + tiny + h * vocab) + 12 * d * seq + 3 * 6 * inner * seq
    assert training_flops_per_token(model, seq) == by_hand


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(activation="swiglu"), "model.activation: amlp, gmlp layers split their inner activations"),
    ],
)
def test_config_problems_are_named(changes, message):
    with pytest.raises(ModelConfigError, match=message):
        _config(**changes)


def test_moe_with_gmlp_layers_is_refused():
    from nxd_models import MoESpec

    with pytest.raises(ModelConfigError, match="have no MLP to replace with experts"):
        _config(moe=MoESpec(num_experts=2, top_k=1))


def test_no_hugging_face_architecture_or_neox_checkpoint_is_claimed_for_gmlp_layers():
    from nxd_models.hf_mapping import hf_mapping
    from nxd_models.neox_layout import neox_layout

    with pytest.raises(ModelConfigError, match="attention_layers has amlp, gmlp layers"):
        hf_mapping(_config())
    with pytest.raises(
        ModelConfigError, match="a GPT-NeoX checkpoint of gmlp, amlp, mamba or rwkv layers is not read or written"
    ):
        neox_layout(_config())
