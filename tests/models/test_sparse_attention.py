"""DeepSpeed's block-sparse layouts as GPT-NeoX builds them (unidirectional, no horizontal global attention), each
worked by hand from the rules DeepSpeed documents in sparsity_config.py; the attention they allow against a loop
over every query and key; FlexAttention's block mask against the boolean mask; decoding against whole sequences."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from nxd_models import GPTConfig, ModelConfigError, SparsitySpec, build_causal_lm
from nxd_models.sparse_attention import BlockSparseLayout, block_layout, flex_block_sparse


def _drawn(picture: str) -> torch.Tensor:
    return torch.tensor([[cell == "#" for cell in row] for row in picture.split()])


# Seven blocks each. Rules (DeepSpeed's sparsity_config.py, attention="unidirectional"):
HAND_WORKED = {
    # LocalSlidingWindow, num_sliding_window_blocks 3: w = 3 // 2 = 1, row r sees r - 1 .. r.
    "local": (SparsitySpec(num_local_blocks=3), "#...... ##..... .##.... ..##... ...##.. ....##. .....##"),
    # Fixed, 2 local blocks, 1 global: windows {0,1} {2,3} {4,5} {6}; a window's last block (1, 3, 5) is seen from
    # its own row on; the short last window's global block is min(6 + 1, 7 - 1) = 6.
    "sparse_fixed": (SparsitySpec(num_local_blocks=2), "#...... ##..... .##.... .###... .#.##.. .#.###. .#.#.##"),
    # Variable, windows of 1 then 2 (repeating), global ranges [0, 1) and [3, 5) seen from their own rows on.
    "sparse_variable": (
        SparsitySpec(local_window_blocks=(1, 2), global_block_indices=(0, 3), global_block_end_indices=(1, 5)),
        "#...... ##..... ###.... #..#... #..##.. #..###. #..####",
    ),
    # BigBird without random blocks: window 3 (r - 1 .. r after tril), block 0 global.
    "bigbird": (SparsitySpec(num_random_blocks=0), "#...... ##..... ###.... #.##... #..##.. #...##. #....##"),
    # BSLongformer: window 3, global block 2 sees every earlier block and is seen by every later one.
    "bslongformer": (
        SparsitySpec(global_block_indices=(2,)),
        "#...... ##..... ###.... ..##... ..###.. ..#.##. ..#..##",
    ),
}


@pytest.mark.parametrize("kind", HAND_WORKED)
def test_each_layout_is_deepspeeds_worked_by_hand(kind):
    spec, picture = HAND_WORKED[kind]
    layout = block_layout(kind, spec, heads=2, blocks=7, layer_number=1)
    assert layout.shape == (2, 7, 7)
    assert torch.equal(layout[0], _drawn(picture)) and torch.equal(layout[1], _drawn(picture))


def test_fixed_heads_take_their_global_pattern_with_a_layout_per_head():
    # 4 local blocks, 1 global, 2 patterns: head 0's global block is a window's 4th (index 3), head 1's its 3rd
    # (index 2); the short last window {4, 5, 6} puts the global block at min(4 + first, 6).
    spec = SparsitySpec(num_local_blocks=4, different_layout_per_head=True, num_different_global_patterns=2)
    layout = block_layout("sparse_fixed", spec, heads=4, blocks=7, layer_number=1)
    head0 = "#...... ##..... ###.... ####... ...##.. ...###. ...####"
    head1 = "#...... ##..... ###.... ####... ..#.#.. ..#.##. ..#.###"
    for head, picture in enumerate((head0, head1, head0, head1)):
        assert torch.equal(layout[head], _drawn(picture)), head


def test_random_blocks_are_drawn_per_row_the_same_on_every_build_and_differ_by_layer():
    spec = SparsitySpec(num_random_blocks=2, local_window_blocks=(1,), global_block_indices=(99,))
    first = block_layout("sparse_variable", spec, heads=1, blocks=16, layer_number=3)[0]
    assert torch.equal(first, block_layout("sparse_variable", spec, heads=1, blocks=16, layer_number=3)[0])
    assert not torch.equal(first, block_layout("sparse_variable", spec, heads=1, blocks=16, layer_number=4)[0])
    assert first.diagonal().all()  # the one-block windows
    extra = first.sum(1) - 1  # beyond the diagonal: the past ones of two random blocks
    assert (extra <= 2).all() and extra.sum() > 0
    bigbird = block_layout("bigbird", SparsitySpec(num_sliding_window_blocks=1), heads=1, blocks=16, layer_number=3)[0]
    # window 1 (the diagonal), global block 0 and one random past block per row
    assert ((bigbird.sum(1) - bigbird[:, 0].int() - 1) <= 1).all() and bigbird[:, 0].all()


def _reference(query, key, value, layout, block):
    """softmax over the keys j <= i whose block pair is in the head's layout, one query at a time."""
    heads, seq, dim = query.shape[1], query.shape[2], query.shape[3]
    out = torch.zeros_like(query)
    for h in range(heads):
        for i in range(seq):
            keys = [j for j in range(i + 1) if layout[h, i // block, j // block]]
            scores = torch.stack([query[0, h, i] @ key[0, h, j] for j in keys]) / math.sqrt(dim)
            out[0, h, i] = torch.softmax(scores, 0) @ value[0, h, keys]
    return out


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("kind", HAND_WORKED)
def test_the_mask_allows_what_the_layout_allows_and_flex_attention_computes_the_same(kind):
    spec = SparsitySpec(
        block=4,
        different_layout_per_head=True,
        num_local_blocks=2,
        num_random_blocks=1,
        num_different_global_patterns=2,
    )
    heads, seq = 4, 26  # a short last block
    sparse = BlockSparseLayout(kind, spec, heads, seq_length=28, layer_number=2)
    q, k, v = torch.randn(3, 1, heads, seq, 8, generator=torch.Generator().manual_seed(0))
    mask = sparse.mask(slice(0, heads), seq, seq, q.device)
    found = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(found, _reference(q, k, v, sparse.layout, 4), atol=1e-6)
    # a rank holding heads 2 and 3 reads their rows of the layout
    assert torch.equal(sparse.mask(slice(2, 4), seq, seq, q.device), mask[:, 2:])
    # FlexAttention (its forward runs eagerly on the CPU) over the block mask drawn from the same rule, on whole
    # blocks: the two padded keys are in every real query's future
    with torch.no_grad():
        padded = [F.pad(t, (0, 0, 0, 2)) for t in (q, k, v)]
        flex = flex_block_sparse(*padded, sparse.block_mask(slice(0, heads), 28, q.device), compiled=False)
    assert torch.allclose(flex[:, :, :seq], found, atol=1e-6)


def _model(**changes):
    layers = ("local", "sparse_fixed", "sparse_variable", "bigbird", "bslongformer", "dense")
    config = GPTConfig(
        **{
            **dict(
                vocab_size=64,
                num_layers=6,
                hidden_size=32,
                num_attention_heads=4,
                seq_length=16,
                hidden_dropout=0.0,
                attention_dropout=0.0,
                make_vocab_size_divisible_by=8,
                position_embedding_type="rope",
                attention_layers=layers,
                layer_settings=(SparsitySpec(block=4, different_layout_per_head=True, num_random_blocks=1),),
            ),
            **changes,
        }
    )
    return build_causal_lm(config, seed=0)


def test_a_sparse_model_decodes_with_a_cache_as_it_computes_whole_sequences():
    from nxd_models.decoding import decoding_cache, decoding_logits

    model = _model().eval()
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = model(ids)
        cache = decoding_cache(model)
        first = decoding_logits(model, ids[:, :7], torch.arange(7)[None], cache)
        rest = [decoding_logits(model, ids[:, i : i + 1], torch.tensor([[i]]), cache) for i in range(7, 16)]
    assert torch.allclose(torch.cat([first, *rest], 1), whole, atol=1e-5)


def test_sparse_layers_differ_from_dense_ones_and_drop_their_output_as_neox_does():
    model = _model(attention_dropout=0.5)
    dense = build_causal_lm(
        GPTConfig(
            vocab_size=64,
            num_layers=6,
            hidden_size=32,
            num_attention_heads=4,
            seq_length=16,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            make_vocab_size_divisible_by=8,
            position_embedding_type="rope",
        ),
        seed=0,
    )
    ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert not torch.allclose(model.eval()(ids), dense.eval()(ids))
    attention = model.model.layers[0].self_attn
    assert attention.core_attention.dropout == 0.0 and attention.context_dropout.p == 0.5
    assert model.model.layers[5].self_attn.core_attention.dropout == 0.5  # the dense layer drops probabilities


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            dict(num_local_blocks=3, num_global_blocks=2),
            "num_local_blocks: expected a positive multiple of num_global_blocks (2), found 3",
        ),
        (
            dict(num_different_global_patterns=2),
            "num_different_global_patterns: more than one pattern needs different_layout_per_head true",
        ),
        (
            dict(global_block_indices=(0, 2), global_block_end_indices=(1,)),
            "global_block_end_indices: expected one end after each",
        ),
        (dict(num_random_blocks=5), "num_random_blocks: expected 0 up to the 4 blocks of a sequence, found 5"),
        (dict(num_sliding_window_blocks=9), "num_sliding_window_blocks: expected 1 up to the 4 blocks"),
    ],
)
def test_what_deepspeed_refuses_is_refused_by_key(changes, message):
    with pytest.raises(
        ModelConfigError, match="model.sparse_attention." + message.replace("(", r"\(").replace(")", r"\)")
    ):
        _model_spec(SparsitySpec(block=4, **changes))


def _model_spec(sparsity: SparsitySpec) -> GPTConfig:
    return GPTConfig(
        vocab_size=64,
        num_layers=5,
        hidden_size=32,
        num_attention_heads=4,
        seq_length=16,
        attention_layers=("local", "sparse_fixed", "sparse_variable", "bigbird", "bslongformer"),
        layer_settings=(sparsity,),
    )


def test_a_kind_list_of_the_wrong_length_or_kind_is_refused():
    with pytest.raises(ModelConfigError, match=r"model.attention_layers: expected one kind per layer \(2\), found 1"):
        GPTConfig(
            vocab_size=64,
            num_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            seq_length=16,
            attention_layers=("local",),
        )
    with pytest.raises(ModelConfigError, match="expected kinds among dense, local, .*, mamba, rwkv, found hyena"):
        GPTConfig(
            vocab_size=64,
            num_layers=1,
            hidden_size=32,
            num_attention_heads=4,
            seq_length=16,
            attention_layers=("hyena",),
        )


def test_no_hugging_face_architecture_is_claimed_for_sparse_layers():
    from nxd_models.hf_mapping import hf_mapping

    with pytest.raises(ModelConfigError) as caught:
        hf_mapping(_model().config)
    assert caught.value.problems == [
        "no Hugging Face architecture matches this Megatron-style model: model.attention_layers has bigbird, "
        "bslongformer, local, sparse_fixed, sparse_variable layers (transformers' GPT and Llama decoders attend densely "
        "in every layer)"
    ]
