"""Mamba layers against transformers' MambaForCausalLM (its PyTorch path) on the same weights; the scan against the
paper's recurrence looped element by element; GPT-NeoX's initialisation; decoding and packed documents."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from nxd_models import GPTConfig, build_causal_lm
from nxd_models.decoding import decoding_cache, decoding_logits
from nxd_models.selective_state_space import STATE_SIZE, selective_scan
from transformers import MambaConfig, MambaForCausalLM


def _config(**changes) -> GPTConfig:
    return GPTConfig(
        **{
            **dict(
                vocab_size=64,
                num_layers=2,
                hidden_size=16,
                num_attention_heads=2,
                seq_length=12,
                hidden_dropout=0.0,
                attention_dropout=0.0,
                make_vocab_size_divisible_by=8,
                position_embedding_type="none",
                normalization="rmsnorm",
                attention_layers=("mamba", "mamba"),
            ),
            **changes,
        }
    )


def test_a_mamba_model_is_transformers_mamba_on_the_same_weights():
    model = build_causal_lm(_config(), seed=0).eval()
    reference = MambaForCausalLM(
        MambaConfig(
            vocab_size=64,
            hidden_size=16,
            state_size=16,
            num_hidden_layers=2,
            layer_norm_epsilon=1e-5,
            expand=2,
            conv_kernel=4,
            use_bias=False,
            use_conv_bias=True,
            hidden_act="silu",
            time_step_rank=1,
            residual_in_fp32=True,
            tie_word_embeddings=True,
            use_mambapy=False,
        )
    ).eval()
    ours = dict(model.named_parameters())
    theirs = {
        "backbone.embeddings.weight": ours["model.embed_tokens.weight"],
        "backbone.norm_f.weight": ours["model.norm.weight"],
    }
    for index in range(2):
        theirs[f"backbone.layers.{index}.norm.weight"] = ours[f"model.layers.{index}.input_layernorm.weight"]
        for part in (
            "in_proj.weight",
            "conv1d.weight",
            "conv1d.bias",
            "x_proj.weight",
            "dt_proj.weight",
            "dt_proj.bias",
            "out_proj.weight",
            "D",
        ):
            theirs[f"backbone.layers.{index}.mixer.{part}"] = ours[f"model.layers.{index}.mixer.{part}"]
        theirs[f"backbone.layers.{index}.mixer.A_log"] = ours[f"model.layers.{index}.mixer.A_log"].view(32, 16)
    missing = reference.load_state_dict(theirs, strict=False)
    assert set(missing.missing_keys) <= {"lm_head.weight"} and not missing.unexpected_keys
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(model(ids), reference(ids).logits, atol=1e-5)


def test_the_scan_is_the_papers_recurrence_looped_element_by_element():
    generator = torch.Generator().manual_seed(4)
    batch, inner, state, seq = 2, 3, 2, 5
    x, delta, z = (torch.randn(batch, inner, seq, generator=generator) for _ in range(3))
    delta = F.softplus(delta)
    a = -torch.rand(inner, state, generator=generator) * 2
    b, c = (torch.randn(batch, state, seq, generator=generator) for _ in range(2))
    d = torch.randn(inner, generator=generator)
    expected = torch.zeros(batch, inner, seq)
    for i in range(batch):
        for channel in range(inner):
            h = [0.0] * state
            for t in range(seq):
                step = delta[i, channel, t].item()
                y = 0.0
                for n in range(state):  # h_t = exp(step a) h_{t-1} + step b_t x_t; y_t = c_t . h_t + d x_t
                    h[n] = math.exp(step * a[channel, n].item()) * h[n] + step * b[i, n, t].item() * x[i, channel, t]
                    y += c[i, n, t].item() * h[n]
                y += d[channel].item() * x[i, channel, t].item()
                expected[i, channel, t] = y * z[i, channel, t].item() / (1 + math.exp(-z[i, channel, t].item()))
    assert torch.allclose(selective_scan(x, delta, a, b, c, d, z), expected, atol=1e-5)


def test_neoxs_initialisation():
    mixer = build_causal_lm(_config(), seed=0).model.layers[0].mixer
    assert torch.allclose(mixer.A_log.view(32, 16), torch.log(torch.arange(1.0, 17.0)).expand(32, 16))
    assert torch.equal(mixer.D, torch.ones(32)) and mixer.A_log.dim() == 1  # flat: no weight decay, as NeoX
    steps = F.softplus(mixer.dt_proj.bias)
    assert steps.min() >= 0.001 - 1e-7 and steps.max() <= 0.1 + 1e-7
    assert mixer.dt_proj.weight.abs().max() <= 1.0  # U(+-dt_rank^-0.5), dt_rank = ceil(16 / 16)
    assert mixer.conv1d.weight.abs().max() <= 0.5 and mixer.conv1d.weight.abs().max() > 0  # torch's: 1/sqrt(4)
    assert mixer.in_proj.bias is None and mixer.conv1d.bias is not None  # NeoX's mamba_use_bias_* defaults


def test_decoding_with_a_cache_equals_whole_sequences():
    model = build_causal_lm(_config(attention_layers=("mamba", "dense"), position_embedding_type="rope"), seed=0)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.eval()
        whole = model(ids)
        cache = decoding_cache(model)
        first = decoding_logits(model, ids[:, :5], torch.arange(5)[None], cache)
        rest = [decoding_logits(model, ids[:, i : i + 1], torch.tensor([[i]]), cache) for i in range(5, 12)]
    assert torch.allclose(torch.cat([first, *rest], 1), whole, atol=1e-5)


def test_each_packed_document_is_scanned_as_if_alone():
    model = build_causal_lm(_config(), seed=0).eval()
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    documents = torch.tensor([[0] * 5 + [1] * 7])
    with torch.no_grad():
        packed = model(ids, document_ids=documents)
        assert torch.allclose(packed[:, :5], model(ids[:, :5]), atol=1e-5)
        assert torch.allclose(packed[:, 5:], model(ids[:, 5:]), atol=1e-5)
        assert not torch.allclose(packed[:, 5:], model(ids)[:, 5:], atol=1e-3)


def _mamba_ssm_on_cuda() -> bool:
    try:
        import mamba_ssm  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(not _mamba_ssm_on_cuda(), reason="mamba-ssm's kernel runs on CUDA with mamba-ssm installed")
def test_mamba_ssms_kernel_computes_the_pytorch_scan():
    """On CUDA the scan is mamba-ssm's fused kernel: its outputs and gradients equal the PyTorch scan's (run on the
    CPU, where no kernel is used) in fp32; packed documents keep the PyTorch scan."""
    generator = torch.Generator().manual_seed(5)
    batch, inner, seq = 2, 64, 40
    tensors = {
        "x": torch.randn(batch, inner, seq, generator=generator),
        "delta": F.softplus(torch.randn(batch, inner, seq, generator=generator)),
        "a": -torch.rand(inner, STATE_SIZE, generator=generator) * 2,
        "b": torch.randn(batch, STATE_SIZE, seq, generator=generator),
        "c": torch.randn(batch, STATE_SIZE, seq, generator=generator),
        "d": torch.randn(inner, generator=generator),
        "z": torch.randn(batch, inner, seq, generator=generator),
    }
    starts = torch.zeros(batch, seq, dtype=torch.bool)
    starts[:, [0, 17]] = True

    def run(device: str, **extra):
        leaves = {name: value.detach().clone().to(device).requires_grad_() for name, value in tensors.items()}
        out = selective_scan(**leaves, **extra)
        out.pow(2).sum().backward()
        return out.detach().cpu(), {name: leaf.grad.cpu() for name, leaf in leaves.items()}

    for extra in ({}, {"starts": starts}):
        (out, grads), (reference, reference_grads) = (
            run("cuda", **{k: v.cuda() for k, v in extra.items()}),
            run("cpu", **extra),
        )
        # mamba-ssm's own fp32 tolerances (its kernel is built with fast math)
        assert torch.allclose(out, reference, rtol=6e-4, atol=2e-3)
        for name, grad in grads.items():
            assert torch.allclose(
                grad, reference_grads[name], rtol=6e-4, atol=2e-3 * reference_grads[name].abs().max().item()
            ), name
