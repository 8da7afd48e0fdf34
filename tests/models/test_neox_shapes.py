"""GPT-NeoX's model pieces against references worked by hand (or torch's own functions): norms, positions,
activations, the parallel blocks and the init methods."""

from __future__ import annotations

import math

import pytest
import torch
from nxd_models import GPTConfig, ModelConfigError, build_causal_lm
from nxd_models.activations import ACTIVATIONS
from nxd_models.attention import AttentionKernel, CoreAttention
from nxd_models.init_methods import init_weight
from nxd_models.norms import QueryKeyNorm, ScaleNorm, build_norm
from nxd_models.positions import (
    RelativePositionBias,
    StableEmbedding,
    alibi_bias,
    alibi_slopes,
    relative_position_bucket,
    sinusoidal_embedding,
)

BASE = dict(
    vocab_size=64,
    num_layers=2,
    hidden_size=16,
    num_attention_heads=4,
    seq_length=8,
    ffn_hidden_size=24,
    hidden_dropout=0.0,
    attention_dropout=0.0,
    make_vocab_size_divisible_by=8,
)


def _config(**changes) -> GPTConfig:
    return GPTConfig(**{**BASE, **changes})


def test_scalenorm_divides_by_the_clamped_l2_norm_and_scales_by_one_scalar():
    norm = ScaleNorm(eps=0.5)
    with torch.no_grad():
        norm.weight.fill_(3.0)
    x = torch.tensor([[3.0, 4.0], [0.1, 0.0]])
    # rows: ||(3, 4)|| = 5 -> 3 x (0.6, 0.8); ||(0.1, 0)|| = 0.1 is clamped to eps 0.5 -> 3 x (0.2, 0)
    assert torch.allclose(norm(x), torch.tensor([[1.8, 2.4], [0.6, 0.0]]))


def test_non_parametric_layernorm_standardises_each_row_and_learns_nothing():
    norm = build_norm("non_parametric_layernorm", 4, eps=1e-5)
    assert list(norm.parameters()) == []
    x = torch.tensor([[1.0, 2.0, 3.0, 6.0]])  # mean 3, biased variance (4 + 1 + 0 + 9) / 4 = 3.5
    expected = [(value - 3.0) / math.sqrt(3.5 + 1e-5) for value in (1.0, 2.0, 3.0, 6.0)]
    assert norm(x)[0].tolist() == pytest.approx(expected, abs=1e-6)
    model = build_causal_lm(_config(normalization="non_parametric_layernorm"), seed=0)
    assert not any("layernorm" in name or name.startswith("model.norm") for name, _ in model.named_parameters())


def test_qk_layernorm_is_torchs_norm_over_neoxs_heads_by_head_dim_shape():
    """NeoX's norm([heads, head_dim]): torch's layer_norm with that normalized_shape (all heads of a token at
    once); its RMSNorm and ScaleNorm reduce over the last dimension, so each head on its own."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 4, 8)
    norm = QueryKeyNorm("layernorm", 4, 8, eps=1e-5)
    torch.nn.init.normal_(norm.weight), torch.nn.init.normal_(norm.bias)
    weight, bias = norm.weight.view(4, 8), norm.bias.view(4, 8)
    assert torch.allclose(norm(x), torch.nn.functional.layer_norm(x, [4, 8], weight, bias, 1e-5), atol=1e-5)
    plain = QueryKeyNorm("non_parametric_layernorm", 4, 8, eps=1e-5)
    assert list(plain.parameters()) == [] and torch.allclose(
        plain(x), torch.nn.functional.layer_norm(x, [4, 8]), atol=1e-5
    )
    rms = QueryKeyNorm("rmsnorm", 4, 8, eps=1e-6)
    torch.nn.init.normal_(rms.weight)
    expected = torch.nn.functional.rms_norm(x, [8], eps=1e-6) * rms.weight.view(4, 8)
    assert torch.allclose(rms(x), expected, atol=1e-5)
    scale = QueryKeyNorm("scalenorm", 4, 8, eps=1e-8)
    assert torch.allclose(scale(x), x / x.norm(dim=-1, keepdim=True), atol=1e-6)
    model = build_causal_lm(_config(qk_layernorm=True), seed=0)
    assert model.model.layers[0].self_attn.qk_norm.weight.shape == (16,)  # (heads, head_dim) kept flat: a norm weight
    with pytest.raises(Exception, match="expected num_kv_heads 4 with it, found 2"):
        _config(qk_layernorm=True, num_kv_heads=2)


@pytest.mark.parametrize("positions", ["learned_absolute", "sinusoidal"])
def test_opts_position_offset_reads_the_table_that_many_rows_on(positions):
    """Token t at position p reads row p + 2 of the learned table (OPT's offset): the same logits as a model
    without an offset whose table starts two rows later; sinusoids are taken at p + 2."""
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    shifted = build_causal_lm(
        _config(position_embedding_type=positions, position_embedding_offset=2, max_position_embeddings=10), seed=0
    ).eval()
    plain = build_causal_lm(_config(position_embedding_type=positions, max_position_embeddings=10), seed=0).eval()
    state = shifted.state_dict()
    if positions == "learned_absolute":
        table = state["model.position_embeddings.weight"]
        state["model.position_embeddings.weight"] = torch.cat([table[2:], table[:2]])
    plain.load_state_dict(state)
    with torch.no_grad():
        if positions == "learned_absolute":
            assert torch.equal(shifted(ids), plain(ids))
        else:  # the plain model at positions 2 ... 9 is the shifted one at 0 ... 7
            assert torch.equal(shifted(ids), plain(ids, torch.arange(2, 10).expand(2, 8)))
    with pytest.raises(Exception, match="expected max_position_embeddings of at least 10, found 9"):
        _config(position_embedding_offset=2, max_position_embeddings=9)


@pytest.mark.parametrize(("buckets", "distance"), [(32, 128), (8, 20), (2, 4)])
def test_rpe_buckets_are_t5s_causal_buckets(buckets, distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    relative = torch.arange(300)[None, :] - torch.arange(300)[:, None]  # key - query
    expected = T5Attention._relative_position_bucket(
        relative, bidirectional=False, num_buckets=buckets, max_distance=distance
    )
    assert torch.equal(relative_position_bucket(relative, buckets, distance), expected)


@pytest.mark.parametrize("kernel", list(AttentionKernel), ids=str)
def test_rpe_adds_its_bucket_of_each_distance_times_sqrt_head_dim(kernel):
    torch.manual_seed(0)
    batch, heads, seq, dim = 2, 4, 12, 8
    table = RelativePositionBias(heads, dim, num_buckets=6, max_distance=8)
    torch.nn.init.normal_(table.weight)
    q, k, v = (torch.randn(batch, heads, seq, dim) for _ in range(3))
    found = CoreAttention(3, kernel, 0.0, False)(q, k, v, bias=table(seq))
    # distances 0, 1, 2 exact; then 3 + floor(3 log(n / 3) / log(8 / 3)), at most 5: n = 3, 4 -> 3 (0, 0.88),
    # 5 -> 4 (1.56), 6, 7 -> 5 (2.12, 2.59), 8 and beyond -> 5
    bucket = [0, 1, 2, 3, 3, 4, 5, 5] + [5] * seq
    expected = torch.empty_like(found)
    for h in range(heads):
        bias = torch.tensor(
            [
                [
                    table.weight[bucket[i - j], h].item() * math.sqrt(dim) if j <= i else float("-inf")
                    for j in range(seq)
                ]
                for i in range(seq)
            ]
        )
        expected[:, h] = torch.softmax(q[:, h] @ k[:, h].transpose(-1, -2) / math.sqrt(dim) + bias, -1) @ v[:, h]
    assert torch.allclose(found, expected, atol=1e-5)


def test_an_rpe_model_decodes_with_a_cache_as_it_computes_whole_sequences():
    from nxd_models.decoding import decoding_cache, decoding_logits

    model = build_causal_lm(_config(position_embedding_type="rpe", rpe_num_buckets=4, rpe_max_distance=6), seed=0)
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = model.eval()(ids)
        cache = decoding_cache(model)
        first = decoding_logits(model, ids[:, :5], torch.arange(5)[None], cache)
        rest = decoding_logits(model, ids[:, 5:], torch.arange(5, 8)[None], cache)
    assert torch.allclose(torch.cat([first, rest], 1), whole, atol=1e-5)
    assert model.model.relative_position_bias.weight.shape == (4, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_stable_position_table_is_bitsandbytes_stable_embedding(dtype):
    """bitsandbytes' own StableEmbedding on the same weights is the reference (GPT-NeoX builds its learned position
    table as one with use_bnb_optimizer); it computes the norm in fp32 (on the CPU, its module only with fp32
    weights: it is given the bf16 weights as fp32) and returns the table's dtype."""
    import bitsandbytes as bnb

    torch.manual_seed(0)
    ours, reference = StableEmbedding(12, 16).to(dtype), bnb.nn.StableEmbedding(12, 16)
    with torch.no_grad():
        ours.norm.weight.uniform_(0.5, 1.5)
        ours.norm.bias.uniform_(-0.1, 0.1)
    reference.load_state_dict({name: value.float() for name, value in ours.state_dict().items()})
    positions = torch.tensor([[0, 3, 11, 5]])
    assert ours(positions).dtype == dtype
    assert torch.equal(ours(positions), reference(positions).to(dtype))


def test_a_model_with_the_stable_position_table_normalises_its_rows_and_keeps_its_state_fp32():
    model = build_causal_lm(_config(position_embedding_norm=True))
    table = model.model.position_embeddings
    assert isinstance(table, StableEmbedding)
    assert (table.norm.weight.tolist(), table.norm.bias.tolist()) == ([1.0] * 16, [0.0] * 16)
    from nxd_models import model_family

    names = [name for name, _ in model.named_parameters()]
    flags = model_family(model.config).fp32_state_parameters(names)
    assert [name for name, flag in zip(names, flags, strict=True) if flag] == ["model.position_embeddings.weight"]
    assert model_family(_config()).fp32_state_parameters(names) is None
    with pytest.raises(
        ModelConfigError,
        match="model.position_embedding_norm: normalises the learned position "
        "table's rows; expected learned_absolute positions with it, found 'rope'",
    ):
        build_causal_lm(_config(position_embedding_norm=True, position_embedding_type="rope"))


def test_sinusoids_are_all_sines_then_all_cosines():
    hidden, positions = 6, torch.tensor([[0, 1, 5]])
    found = sinusoidal_embedding(positions, hidden, torch.float32)
    for row, p in enumerate([0, 1, 5]):
        frequencies = [10000 ** (-i / hidden) for i in (0, 2, 4)]
        expected = [math.sin(p * w) for w in frequencies] + [math.cos(p * w) for w in frequencies]
        assert found[0, row].tolist() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    ("heads", "slopes"),
    [
        (8, [2**-i for i in range(1, 9)]),  # 2^(-8/8) to the powers 1 ... 8
        (4, [2**-2, 2**-4, 2**-6, 2**-8]),  # 2^(-8/4) = 1/4 to the powers 1 ... 4
        (6, [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]),  # the 4 of 4 heads, then 8 heads' 1st and 3rd
    ],
)
def test_alibi_slopes_follow_the_papers_rule(heads, slopes):
    assert alibi_slopes(heads) == pytest.approx(slopes)


@pytest.mark.parametrize("kernel", list(AttentionKernel), ids=str)
def test_alibi_biases_scores_by_distance_under_every_kernel(kernel):
    torch.manual_seed(0)
    batch, heads, seq, dim = 2, 4, 6, 8
    q, k, v = (torch.randn(batch, heads, seq, dim) for _ in range(3))
    slopes = alibi_slopes(heads)
    found = CoreAttention(3, kernel, 0.0, True)(q, k, v, bias=alibi_bias(slopes, seq, q.device))
    expected = torch.empty_like(found)
    for h in range(heads):  # softmax(q k / sqrt(d) - slope (i - j)) over j <= i, written out
        for i in range(seq):
            scores = torch.tensor([(q[:, h, i] * k[:, h, j]).sum(-1).tolist() for j in range(i + 1)]).T
            scores = scores / math.sqrt(dim) - slopes[h] * torch.tensor([i - j for j in range(i + 1)])
            expected[:, h, i] = torch.einsum("bj,bjd->bd", torch.softmax(scores, dim=-1), v[:, h, : i + 1])
    assert torch.allclose(found, expected, atol=1e-5)


GELU = lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))  # noqa: E731
FORMULAS = {
    "gelu": GELU,
    "approx-gelu": lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "relu": lambda x: x.clamp(min=0),
    "silu": lambda x: x / (1 + torch.exp(-x)),
    "mish": lambda x: x * torch.tanh(torch.log1p(torch.exp(x))),
    "softsign": lambda x: x / (1 + x.abs()),
    "swiglu": lambda x: x / (1 + torch.exp(-x)),
    "geglu": GELU,
    "reglu": lambda x: x.clamp(min=0),
    "bilinear": lambda x: x,
    "glu": lambda x: 1 / (1 + torch.exp(-x)),
}
"""Each activation of the gate (gated ones: multiplied by up) or of up, written out."""


@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_each_activation_is_its_formula(name):
    assert set(FORMULAS) == set(ACTIVATIONS)
    model = build_causal_lm(_config(activation=name, mlp_bias=False), seed=3)
    mlp = model.model.layers[0].mlp
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(1))
    up = x @ mlp.up_proj.weight.T
    inner = FORMULAS[name](x @ mlp.gate_proj.weight.T) * up if ACTIVATIONS[name][1] else FORMULAS[name](up)
    assert torch.allclose(mlp(x), inner @ mlp.down_proj.weight.T, atol=1e-6)
    assert hasattr(mlp, "gate_proj") == ACTIVATIONS[name][1]


@pytest.mark.parametrize("block", ["gpt_j", "gpt_neox"])
def test_parallel_blocks_add_attention_and_mlp_to_the_input(block):
    model = build_causal_lm(_config(transformer_block_type=block, position_embedding_type="rope"), seed=5).eval()
    layer = model.model.layers[0]
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(2))
    positions = torch.arange(8).expand(2, 8)
    from nxd_models.attention import rotary_cos_sin

    rotary = rotary_cos_sin(positions, model.config.rotary_dim, 10000.0, x.dtype)
    normed = layer.input_layernorm(x)
    mlp_input = normed if block == "gpt_j" else layer.post_attention_layernorm(x)
    expected = x + layer.self_attn(normed, rotary) + layer.mlp(mlp_input)
    assert torch.allclose(layer(x, rotary), expected, atol=1e-6)
    assert hasattr(layer, "post_attention_layernorm") == (block == "gpt_neox")


def test_attention_and_mlp_biases_are_set_apart():
    model = build_causal_lm(_config(attention_bias=False, mlp_bias=True))
    layer = model.model.layers[0]
    assert layer.self_attn.q_proj.bias is None and layer.self_attn.o_proj.bias is None
    assert layer.mlp.up_proj.bias is not None and layer.mlp.down_proj.bias is not None


LAYERS, HIDDEN, STD = 4, 64, 0.02
NORMAL_STDS = {
    "normal": STD,
    "scaled_normal": STD / math.sqrt(2 * LAYERS),
    "single_residual_scaled_normal": STD / math.sqrt(LAYERS),
    "small_init": math.sqrt(2 / (5 * HIDDEN)),
    "wang_init": 2 / (LAYERS * math.sqrt(HIDDEN)),
}
"""GPT-NeoX's init_functions.py, worked out for 4 layers of width 64."""


@pytest.mark.parametrize("method", sorted(NORMAL_STDS))
def test_normal_inits_draw_with_neox_standard_deviations(method):
    weight = torch.empty(512, 512)
    torch.manual_seed(0)
    init_weight(weight, method, std=STD, layers=LAYERS, hidden=HIDDEN)
    assert weight.mean().abs() < 0.01 * NORMAL_STDS[method]
    assert weight.std().item() == pytest.approx(NORMAL_STDS[method], rel=0.01)


def test_xavier_inits_use_the_given_fans():
    uniform, normal = torch.empty(300, 200), torch.empty(300, 200)
    torch.manual_seed(0)
    init_weight(uniform, "xavier_uniform", std=STD, layers=LAYERS, hidden=HIDDEN, fans=(200, 900))  # a q of qkv
    init_weight(normal, "xavier_normal", std=STD, layers=LAYERS, hidden=HIDDEN)
    bound = math.sqrt(6 / (200 + 900))
    assert uniform.abs().max() <= bound and uniform.abs().max() > 0.99 * bound
    assert normal.std().item() == pytest.approx(math.sqrt(2 / (200 + 300)), rel=0.01)


@pytest.mark.parametrize(
    ("method", "gain"), [("orthogonal", math.sqrt(2)), ("scaled_orthogonal", math.sqrt(2 / LAYERS))]
)
def test_orthogonal_inits_have_orthogonal_rows_times_the_gain(method, gain):
    weight = torch.empty(8, 32)
    init_weight(weight, method, std=STD, layers=LAYERS, hidden=HIDDEN)
    assert torch.allclose(weight @ weight.T, gain**2 * torch.eye(8), atol=1e-5)


def test_model_inits_follow_init_method_and_output_layer_init_method():
    model = build_causal_lm(
        _config(
            num_layers=4,
            hidden_size=64,
            ffn_hidden_size=256,
            num_attention_heads=4,
            init_method="small_init",
            output_layer_init_method="wang_init",
            share_embeddings_and_output_weights=False,
        ),
        seed=7,
    )
    small, wang = math.sqrt(2 / (5 * 64)), 2 / (4 * math.sqrt(64))
    layer = model.model.layers[0]
    for weight in (
        layer.self_attn.q_proj.weight,
        layer.mlp.up_proj.weight,
        model.model.embed_tokens.weight,
        model.lm_head.weight,
    ):
        assert weight.std().item() == pytest.approx(small, rel=0.1)
    for weight in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight):
        assert weight.std().item() == pytest.approx(wang, rel=0.1)


@pytest.mark.parametrize(("style", "order"), [("grouped", (0, 1, 0, 1)), ("spaced", (0, 0, 1, 1))])
def test_shared_layers_compute_a_stack_of_copies_and_gather_their_gradients(style, order):
    """Megatron's parameter sharing against an unshared four-layer model holding copies of the two layers in the
    reference's order (grouped [1, 2, 1, 2], spaced [1, 1, 2, 2]): equal logits, and each shared weight's gradient
    is the sum of its copies'."""
    shape = dict(num_layers=4, hidden_dropout=0.0, attention_dropout=0.0, position_embedding_type="rope")
    shared = build_causal_lm(_config(**shape, num_unique_layers=2, param_sharing_style=style), seed=0)
    stack = build_causal_lm(_config(**shape), seed=1)
    assert shared.config.layer_order == order and len(shared.model.layers) == 2
    weights = {name: value for name, value in shared.state_dict().items() if not name.startswith("model.layers.")}
    for position, unique in enumerate(order):
        prefix = f"model.layers.{unique}."
        weights |= {
            name.replace(prefix, f"model.layers.{position}."): value
            for name, value in shared.state_dict().items()
            if name.startswith(prefix)
        }
    stack.load_state_dict(weights)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    shared(ids).logsumexp(-1).sum().backward()
    stack(ids).logsumexp(-1).sum().backward()
    assert torch.allclose(shared(ids), stack(ids), atol=1e-6)
    for unique in range(2):
        copies = [position for position, index in enumerate(order) if index == unique]
        found = shared.model.layers[unique].mlp.up_proj.weight.grad
        expected = sum(stack.model.layers[position].mlp.up_proj.weight.grad for position in copies)
        assert torch.allclose(found, expected, atol=1e-6)


def test_shared_layers_decode_with_a_cache_per_position():
    from nxd_models.decoding import decoding_cache, decoding_logits

    model = build_causal_lm(_config(num_layers=4, num_unique_layers=2, position_embedding_type="rope"), seed=0)
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = model.eval()(ids)
        cache = decoding_cache(model)
        first = decoding_logits(model, ids[:, :5], torch.arange(5)[None], cache)
        rest = decoding_logits(model, ids[:, 5:], torch.arange(5, 8)[None], cache)
    assert torch.allclose(torch.cat([first, rest], 1), whole, atol=1e-5)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(num_unique_layers=3), "model.num_unique_layers: expected a divisor of num_layers (4), found 3"),
        (
            dict(num_unique_layers=2, param_sharing_style="mixed"),
            "model.param_sharing_style: expected one of grouped, spaced, found 'mixed'",
        ),
    ],
)
def test_sharing_mistakes_are_named(changes, message):
    with pytest.raises(ModelConfigError) as caught:
        _config(num_layers=4, **changes)
    assert message in caught.value.problems


def test_shared_layers_count_the_flops_of_every_position_they_run():
    from nxd_models.flops import training_flops_per_token

    shared = build_causal_lm(_config(num_layers=4, num_unique_layers=2), seed=0)
    stack = build_causal_lm(_config(num_layers=4), seed=0)
    assert training_flops_per_token(shared, 8) == training_flops_per_token(stack, 8)
