"""Document-wise attention (data.reset_attention_mask): a packed sample gives, for each document, the
logits of that document run alone — the independent reference is the model on each document."""

from __future__ import annotations

import json

import pytest
import torch
from nxd_models import AttentionKernel, GPTConfig, build_causal_lm, causal_lm_logits, load_hf_config

LENGTHS = (5, 7, 4)  # three documents in one sample of 16 tokens


def packed(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids, restarting position ids and document ids of two packed samples."""
    ids = torch.randint(0, vocab, (2, sum(LENGTHS)), generator=torch.Generator().manual_seed(0))
    positions = torch.cat([torch.arange(n) for n in LENGTHS]).expand(2, -1)
    documents = torch.cat([torch.full((n,), d) for d, n in enumerate(LENGTHS)]).expand(2, -1)
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
    config = GPTConfig(vocab_size=200, num_layers=2, hidden_size=32, num_attention_heads=4, num_kv_heads=2,
                       seq_length=16, ffn_hidden_size=48, hidden_dropout=0.0, attention_dropout=0.0)  # fmt: skip
    torch.manual_seed(0)
    assert_documents_independent(build_causal_lm(config, attention=kernel), 200)


def hf_llama(tmp_path, kernel: AttentionKernel) -> torch.nn.Module:
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 200, "max_position_embeddings": 64}))  # fmt: skip
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
