"""RWKV layers against GPT-NeoX's RWKVResidualLayer written out from megatron/model/rwkv/v6 (its CUDA kernel's loop
as Python) on the same weights; NeoX's initialisation curves as its loops compute them; decoding; packed documents."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from nxd_models import GPTConfig, ModelConfigError, RWKVSpec, build_causal_lm
from nxd_models.decoding import decoding_cache, decoding_logits
from nxd_models.rwkv import wkv, wkv_steps


def _config(**changes) -> GPTConfig:
    return GPTConfig(
        **{
            **dict(
                vocab_size=64,
                num_layers=2,
                hidden_size=32,
                num_attention_heads=2,
                seq_length=12,
                hidden_dropout=0.0,
                attention_dropout=0.0,
                make_vocab_size_divisible_by=8,
                position_embedding_type="none",
                attention_layers=("rwkv", "rwkv"),
            ),
            **changes,
        }
    )


def _perturbed(model):
    """NeoX starts the low-rank projections near zero: drawn larger, so that the data-dependent parts show."""
    with torch.no_grad():
        generator = torch.Generator().manual_seed(3)
        for name, parameter in model.named_parameters():
            if "_w1" in name or "_w2" in name:
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
    return model


def _kernel(r, k, v, ew, u, heads):
    """wkv6_cuda.cu's kernel_forward: per batch row, head and value channel i, over t: y = sum_j r[j] (u[j] k[j] v
    + s[j]); s[j] = s[j] exp(ew[j]) + k[j] v."""
    batch, seq, channels = r.shape
    n = channels // heads
    y = torch.zeros(batch, seq, channels)
    for b in range(batch):
        for h in range(heads):
            state = torch.zeros(n, n)  # [j][i]
            for t in range(seq):
                rs, ks, vs = r[b, t, h * n : (h + 1) * n], k[b, t, h * n : (h + 1) * n], v[b, t, h * n : (h + 1) * n]
                ws, us = torch.exp(ew[b, t, h * n : (h + 1) * n]), u[h]
                for i in range(n):
                    x = ks * vs[i]
                    y[b, t, h * n + i] = (rs * (us * x + state[:, i])).sum()
                    state[:, i] = state[:, i] * ws + x
    return y


def _neox_layer(layer, x, first: bool):
    """RWKVResidualLayer.forward (attention and hidden dropout 0)."""
    att, ffn = layer.att, layer.ffn
    shift = torch.nn.ZeroPad2d((0, 0, 1, -1))
    if first:
        x = layer.ln1(x)
    # RWKV_TimeMix.jit_func
    h = layer.ln1(x)
    B, T, C = h.size()
    xx = shift(h) - h
    xxx = h + xx * att.time_maa_x
    xxx = torch.tanh(xxx @ att.time_maa_w1).view(B * T, 5, -1).transpose(0, 1)
    xxx = torch.bmm(xxx, att.time_maa_w2).view(5, B, T, -1)
    mw, mk, mv, mr, mg = xxx.unbind(dim=0)
    xw, xk = h + xx * (att.time_maa_w + mw), h + xx * (att.time_maa_k + mk)
    xv, xr, xg = h + xx * (att.time_maa_v + mv), h + xx * (att.time_maa_r + mr), h + xx * (att.time_maa_g + mg)
    r, k, v = xr @ att.receptance.weight.T, xk @ att.key.weight.T, xv @ att.value.weight.T
    g = F.silu(xg @ att.gate.weight.T)
    w = att.time_decay + torch.tanh(xw @ att.time_decay_w1) @ att.time_decay_w2
    y = _kernel(r, k, v, -torch.exp(w), att.time_faaaa, att.heads)
    y = F.group_norm(y.view(B * T, C), att.heads, att.ln_x.weight, att.ln_x.bias, 1e-5 * 8**2).view(B, T, C)
    x = x + (y * g) @ att.output.weight.T
    # RWKV_ChannelMix.forward
    h = layer.ln2(x)
    xx = shift(h) - h
    kk = torch.relu((h + xx * ffn.time_maa_k) @ ffn.key.weight.T) ** 2
    return x + torch.sigmoid((h + xx * ffn.time_maa_r) @ ffn.receptance.weight.T) * (kk @ ffn.value.weight.T)


@pytest.mark.parametrize("index", [0, 1], ids=["first-layer", "second-layer"])
def test_each_layer_is_neoxs_rwkv_layer_on_the_same_weights(index):
    model = _perturbed(build_causal_lm(_config(), seed=0))
    layer = model.model.layers[index]
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(layer(x, None), _neox_layer(layer, x, first=index == 0), atol=1e-5)


def test_neoxs_initialisation_curves():
    layers, hidden = 3, 32
    model = build_causal_lm(_config(num_layers=layers, attention_layers=("rwkv",) * layers), seed=0)
    for index in range(layers):
        att, ffn = model.model.layers[index].att, model.model.layers[index].ffn
        ratio_0_to_1, ratio_1_to_almost0 = index / (layers - 1), 1.0 - index / layers
        ddd = torch.ones(1, 1, hidden)
        for i in range(hidden):
            ddd[0, 0, i] = i / hidden
        assert torch.allclose(att.time_maa_x, 1.0 - torch.pow(ddd, ratio_1_to_almost0), atol=1e-6)
        assert torch.allclose(
            att.time_maa_v, 1.0 - (torch.pow(ddd, ratio_1_to_almost0) + 0.3 * ratio_0_to_1), atol=1e-6
        )
        assert torch.allclose(att.time_maa_g, 1.0 - torch.pow(ddd, 0.5 * ratio_1_to_almost0), atol=1e-6)
        assert torch.allclose(ffn.time_maa_r, 1.0 - torch.pow(ddd, ratio_1_to_almost0), atol=1e-6)
        decay_speed, tmp = torch.ones(hidden), torch.zeros(hidden)
        for n in range(hidden):
            decay_speed[n] = -6 + 5 * (n / (hidden - 1)) ** (0.7 + 1.3 * ratio_0_to_1)
            tmp[n] = ratio_0_to_1 * (1 - (n / (hidden - 1))) + ((n + 1) % 3 - 1) * 0.1
        assert torch.allclose(att.time_decay.flatten(), decay_speed, atol=1e-6)
        assert torch.allclose(att.time_faaaa, tmp.reshape(2, 16), atol=1e-6)
        assert att.time_maa_w1.abs().max() <= 1e-4 and att.time_decay_w2.abs().max() <= 1e-4
        assert att.receptance.weight.abs().max() <= hidden**-0.5  # torch's default draw
    assert model.model.layers[0].ffn.key.weight.shape == (3.5 * 32 // 32 * 32, 32)  # NeoX's ffn_dim


def test_decoding_with_a_cache_equals_whole_sequences():
    model = _perturbed(
        build_causal_lm(_config(attention_layers=("rwkv", "dense"), position_embedding_type="rope"), seed=0)
    ).eval()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = model(ids)
        cache = decoding_cache(model)
        first = decoding_logits(model, ids[:, :5], torch.arange(5)[None], cache)
        rest = [decoding_logits(model, ids[:, i : i + 1], torch.tensor([[i]]), cache) for i in range(5, 12)]
    assert torch.allclose(torch.cat([first, *rest], 1), whole, atol=1e-5)


def test_each_packed_document_runs_as_if_alone():
    model = _perturbed(build_causal_lm(_config(), seed=0)).eval()
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    documents = torch.tensor([[0] * 5 + [1] * 7])
    with torch.no_grad():
        packed = model(ids, document_ids=documents)
        assert torch.allclose(packed[:, :5], model(ids[:, :5]), atol=1e-5)
        assert torch.allclose(packed[:, 5:], model(ids[:, 5:]), atol=1e-5)
        assert not torch.allclose(packed[:, 5:], model(ids)[:, 5:], atol=1e-3)


def test_a_width_the_heads_do_not_divide_is_refused():
    with pytest.raises(
        ModelConfigError,
        match="model.rwkv_dim_att: an rwkv layer's time mix has num_attention_heads "
        "heads; expected a multiple of 2, found 33",
    ):
        _config(layer_settings=(RWKVSpec(dim_att=33),))


def test_the_chunked_recurrence_is_neoxs_kernel():
    """wkv's chunked form (16 tokens a chunk) on 37 tokens equals NeoX's kernel written out, decays strong enough that
    a chunk's products span e^-100; with packed documents each equals the kernel on that document alone; its gradients
    equal the token-by-token loop's."""
    generator = torch.Generator().manual_seed(5)
    batch, seq, heads, size = 2, 37, 2, 4
    r, k, v = (torch.randn(batch, seq, heads, size, generator=generator) for _ in range(3))
    w = torch.randn(batch, seq, heads, size, generator=generator) * 2.0  # exp(w) up to e^6 per token
    u = torch.randn(heads, size, generator=generator)
    flat = [t.reshape(batch, seq, heads * size) for t in (r, k, v, -torch.exp(w))]
    expected = _kernel(*flat, u, heads).view(batch, seq, heads, size)
    assert torch.allclose(wkv(r, k, v, w, u), expected, rtol=1e-4, atol=1e-4)
    starts = torch.zeros(batch, seq, dtype=torch.bool)
    bounds = [0, 5, 16, 17, 33, seq]
    starts[:, bounds[:-1]] = True
    packed = wkv(r, k, v, w, u, starts)
    for first, end in zip(bounds, bounds[1:], strict=False):
        alone = _kernel(*(t[:, first:end] for t in flat), u, heads).view(batch, end - first, heads, size)
        assert torch.allclose(packed[:, first:end], alone, rtol=1e-4, atol=1e-4), (first, end)
    inputs = [t.clone().requires_grad_() for t in (r, k, v, w, u)]
    chunked = torch.autograd.grad((wkv(*inputs, starts) ** 2).sum(), inputs)
    steps = torch.autograd.grad((wkv_steps(*inputs, starts) ** 2).sum(), inputs)
    for ours, theirs in zip(chunked, steps, strict=True):  # fp32 rounding: a decay's gradient sums partials of
        assert (ours - theirs).abs().max() <= 1e-4 * theirs.abs().max()  # hundreds that cancel to it
