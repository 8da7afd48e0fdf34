"""Document-wise attention (data.reset_attention_mask): a packed sample gives, for each document, the
logits of that document run alone — the independent reference is the model on each document."""

from __future__ import annotations

import json

import pytest
import torch
from nxd_models import AttentionKernel, GPTConfig, build_causal_lm, causal_lm_logits, load_hf_config

LENGTHS = (5, 7, 4)  # three documents in one sample of 16 tokens


def packed(vocab: int, lengths: tuple[int, ...] = LENGTHS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids, restarting position ids and document ids of two packed samples."""
    ids = torch.randint(0, vocab, (2, sum(lengths)), generator=torch.Generator().manual_seed(0))
    positions = torch.cat([torch.arange(n) for n in lengths]).expand(2, -1)
    documents = torch.cat([torch.full((n,), d) for d, n in enumerate(lengths)]).expand(2, -1)
    return ids, positions, documents


def assert_documents_independent(model: torch.nn.Module, vocab: int) -> None:
    ids, positions, documents = packed(vocab)
    with torch.no_grad():
        together = causal_lm_logits(model, ids, positions, documents)
        start = 0
        for length in LENGTHS:
            alone = causal_lm_logits(model, ids[:, start : start + length], torch.arange(length).expand(2, -1))
            torch.testing.assert_close(together[:, start : start + length], alone, rtol=1e-5, atol=1e-5)
            start += length


@pytest.mark.parametrize("kernel", [AttentionKernel.FLASH, AttentionKernel.UNFUSED])
def test_megatron_model_attends_within_documents(kernel: AttentionKernel) -> None:
    config = GPTConfig(
        vocab_size=200,
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_kv_heads=2,
        seq_length=16,
        ffn_hidden_size=48,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    torch.manual_seed(0)
    assert_documents_independent(build_causal_lm(config, attention=kernel), 200)


def hf_llama(tmp_path, kernel: AttentionKernel) -> torch.nn.Module:
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 200,
                "max_position_embeddings": 1024,
            }
        )
    )
    torch.manual_seed(0)
    return build_causal_lm(load_hf_config(tmp_path), attention=kernel)


@pytest.mark.parametrize("kernel", [AttentionKernel.FLASH, AttentionKernel.UNFUSED])  # sdpa and eager
def test_hugging_face_model_attends_within_documents(tmp_path, kernel: AttentionKernel) -> None:
    assert_documents_independent(hf_llama(tmp_path, kernel), 200)


def test_restarting_positions_alone_do_not_mask_attention(tmp_path) -> None:
    """Without document ids the whole sample is causal, even though transformers would read restarting
    position ids as packed sequences: the last document's logits depend on the first's tokens."""
    model = hf_llama(tmp_path, AttentionKernel.FLASH)
    ids, positions, _ = packed(200)
    changed = ids.clone()
    changed[:, 0] = (changed[:, 0] + 1) % 200
    with torch.no_grad():
        before, after = (causal_lm_logits(model, tokens, positions) for tokens in (ids, changed))
    assert not torch.allclose(before[:, -1], after[:, -1])


def test_document_spans_are_contiguous_runs_or_none() -> None:
    from nxd_models.attention import document_spans

    documents = torch.tensor([[0, 0, 0, 1, 1, 2], [0, 1, 1, 1, 1, 1]])
    assert document_spans(documents) == [[(0, 3), (3, 5), (5, 6)], [(0, 1), (1, 6)]]
    assert document_spans(torch.tensor([[0, 0, 1, 1, 0, 0]])) is None  # document 0 comes back: no spans


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_span_attention_equals_the_masked_product(kv_heads: int) -> None:
    """Per-document causal SDPA against one SDPA over the whole row with the document mask, rows with
    the same spans (one call per span) and with different ones."""
    from nxd_models.attention import document_mask, document_spans, span_attention

    generator = torch.Generator().manual_seed(0)
    query = torch.randn(3, 4, 16, 8, generator=generator)
    key, value = (torch.randn(3, kv_heads, 16, 8, generator=generator) for _ in range(2))
    for rows in ([(5, 7, 4)] * 3, [(5, 7, 4), (16,), (1, 2, 13)]):
        documents = torch.stack([torch.cat([torch.full((n,), d) for d, n in enumerate(row)]) for row in rows])
        expected = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=document_mask(documents), enable_gqa=kv_heads != 4
        )
        found = span_attention(query, key, value, document_spans(documents))
        torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ["megatron", "hf"])
def test_a_document_split_in_two_runs_is_masked_as_one(tmp_path, family: str) -> None:
    """Document ids that come back (0, 0, 1, 1, 0, 0 ...) fall back to the mask: the second run of
    document 0 sees the first, and document 1 sees only itself."""
    if family == "hf":
        model = hf_llama(tmp_path, AttentionKernel.FLASH)
    else:
        config = GPTConfig(
            vocab_size=200,
            num_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            num_kv_heads=2,
            seq_length=16,
            ffn_hidden_size=48,
            hidden_dropout=0.0,
            attention_dropout=0.0,
        )
        torch.manual_seed(0)
        model = build_causal_lm(config)
    ids = torch.randint(0, 200, (1, 12), generator=torch.Generator().manual_seed(1))
    documents = torch.tensor([[0] * 4 + [1] * 4 + [0] * 4])
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7]])
    with torch.no_grad():
        split = causal_lm_logits(model, ids, positions, documents)
        middle = causal_lm_logits(model, ids[:, 4:8], torch.arange(4)[None])
        joined = causal_lm_logits(model, torch.cat([ids[:, :4], ids[:, 8:]], dim=1), torch.arange(8)[None])
    torch.testing.assert_close(split[:, 4:8], middle, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(split[:, 8:], joined[:, 4:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["megatron", "hf"])
def test_contiguous_documents_of_long_rows_take_the_span_path(tmp_path, monkeypatch, family: str) -> None:
    """Rows longer than MASKED_ROWS_UP_TO attend each document span by span (a call per layer here, the rows'
    spans alike); shorter rows through one masked product. Either gives each document its logits alone."""
    import nxd_models.attention
    import nxd_models.build

    calls = []
    original = nxd_models.attention.span_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(nxd_models.build, "span_attention", counted)
    monkeypatch.setattr(nxd_models.attention, "span_attention", counted)
    if family == "hf":
        model = hf_llama(tmp_path, AttentionKernel.FLASH)
    else:
        config = GPTConfig(
            vocab_size=200,
            num_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            num_kv_heads=2,
            seq_length=1024,
            ffn_hidden_size=48,
            hidden_dropout=0.0,
            attention_dropout=0.0,
        )
        model = build_causal_lm(config)
    long = (300, 150, 100)
    assert sum(long) > nxd_models.attention.MASKED_ROWS_UP_TO >= sum(LENGTHS)
    ids, positions, documents = packed(200, long)
    with torch.no_grad():
        together = causal_lm_logits(model, ids, positions, documents)
        alone = causal_lm_logits(model, ids[:, 300:450], torch.arange(150).expand(2, -1))
    assert len(calls) == 2  # once per layer
    torch.testing.assert_close(together[:, 300:450], alone, rtol=1e-5, atol=1e-5)
    calls.clear()
    with torch.no_grad():
        causal_lm_logits(model, *packed(200))
    assert not calls


@pytest.mark.parametrize("kind", ["dense", "mamba", "rwkv", "gmlp", "local", "sparse_fixed"])
def test_a_family_packs_exactly_where_a_packed_document_computes_as_alone(kind: str) -> None:
    """`packs_exactly` (what online RL packs its completions by) against the model itself: a document packed after
    another (at row position 5, off any block boundary) gives its logits alone exactly where every layer kind reads
    only its document's tokens and position ids; gMLP's spatial projection and block-sparse layouts read row places."""
    from nxd_models import model_family
    from nxd_models.sparse_attention import SparsitySpec

    sparse = (SparsitySpec(block=2, num_local_blocks=2, num_sliding_window_blocks=2),)
    config = GPTConfig(
        vocab_size=64,
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_kv_heads=4,
        seq_length=16,
        ffn_hidden_size=48,
        activation="gelu",
        attention_layers=(kind, kind),
        layer_settings=sparse if kind in ("local", "sparse_fixed") else (),
    )
    family = model_family(config)
    model = family.build(seed=1).eval()
    noise = torch.Generator().manual_seed(2)
    with torch.no_grad():  # weights away from their initialisation (gMLP's spatial projection starts near 0)
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn(parameter.shape, generator=noise))
    ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(0))
    documents = torch.tensor([[0] * 5 + [1] * 11])
    positions = torch.tensor([[*range(5), *range(11)]])
    with torch.no_grad():
        packed = causal_lm_logits(model, ids, positions, documents)[:, 5:]
        alone = causal_lm_logits(model, ids[:, 5:], torch.arange(11)[None])
    assert family.packs_exactly == torch.allclose(packed, alone, atol=1e-5)
    assert family.packs_exactly == (kind in ("dense", "mamba", "rwkv"))
