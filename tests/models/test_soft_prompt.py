"""Soft prompt tuning (GPT-NeoX's soft_prompt_tuning; prompt tuning, Lester et al. 2021): learned vectors before
every sequence, against transformers' Llama fed the same vectors as input embeddings (PEFT's prompt tuning);
packed documents each see the prompt; decoding with a cache computes what whole sequences do."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from nxd_models import GPTConfig, ModelConfigError, build_causal_lm
from nxd_models.hf_mapping import hf_mapping
from transformers import LlamaConfig, LlamaForCausalLM

PROMPT = 3


def _config(**changes) -> GPTConfig:
    base = dict(
        vocab_size=96,
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_kv_heads=2,
        seq_length=10,
        ffn_hidden_size=48,
        normalization="rmsnorm",
        activation="swiglu",
        position_embedding_type="rope",
        has_bias=False,
        share_embeddings_and_output_weights=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        make_vocab_size_divisible_by=32,
        soft_prompt_tokens=PROMPT,
    )
    return GPTConfig(**{**base, **changes})


def test_the_prompt_is_input_embeddings_before_the_tokens_as_transformers_computes_them():
    config = _config()
    ours = build_causal_lm(config, seed=0).eval()
    mapping = hf_mapping(dataclasses.replace(config, soft_prompt_tokens=0))
    reference = LlamaForCausalLM(LlamaConfig(**mapping.config)).eval()
    state = ours.state_dict()
    reference.load_state_dict(
        {
            theirs: state[key][: config.vocab_size] if key in mapping.vocab_padded_keys else state[key]
            for key, theirs in mapping.keys.items()
        }
    )
    ids = torch.randint(0, config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(0))
    prompt = ours.model.soft_prompt.weight
    with torch.no_grad():
        embeds = torch.cat([prompt.expand(2, -1, -1), reference.model.embed_tokens(ids)], dim=1)
        expected = reference(inputs_embeds=embeds).logits[:, PROMPT:]
        found = ours(ids)[..., : config.vocab_size]
    assert found.shape == (2, 10, config.vocab_size)
    assert torch.allclose(found, expected, atol=1e-5)
    assert (prompt.abs() <= 0.5).all() and prompt.std() > 0.2  # NeoX's U(-init_range, init_range)


@pytest.mark.parametrize("positions", ["rope", "learned_absolute"])
def test_each_packed_document_sees_the_prompt_as_if_alone(positions):
    model = build_causal_lm(_config(position_embedding_type=positions, max_position_embeddings=16), seed=0).eval()
    ids = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(1))
    documents = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1, 1]])
    position_ids = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5]])
    with torch.no_grad():
        packed = model(ids, position_ids, documents)
        first, second = model(ids[:, :4]), model(ids[:, 4:])
    assert torch.allclose(packed, torch.cat([first, second], 1), atol=1e-5)


def test_decoding_with_a_cache_prepends_the_prompt_once():
    from nxd_models.decoding import decoding_cache, decoding_logits

    model = build_causal_lm(_config(), seed=0).eval()
    ids = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        whole = model(ids)
        cache = decoding_cache(model)
        first = decoding_logits(model, ids[:, :4], torch.arange(4)[None], cache)
        rest = [decoding_logits(model, ids[:, i : i + 1], torch.tensor([[i]]), cache) for i in range(4, 10)]
    assert torch.allclose(torch.cat([first, *rest], 1), whole, atol=1e-5)
    assert cache.length == PROMPT + 10


def test_learned_positions_must_cover_the_prompt_and_the_hugging_face_mapping_leaves_it_out():
    with pytest.raises(
        ModelConfigError,
        match=r"model.max_position_embeddings: the soft prompt's 3 positions come "
        r"before the sequence's; expected at least 13, found 10",
    ):
        _config(position_embedding_type="learned_absolute")
    assert hf_mapping(_config()).keys == hf_mapping(_config(soft_prompt_tokens=0)).keys


def test_only_the_prompt_trains_and_it_starts_from_its_init_strings_rows():
    model = build_causal_lm(_config(soft_prompt_init_ids=(5, 9, 11), soft_prompt_tokens=4), seed=0)
    model.start_soft_prompt()
    table = model.model.embed_tokens.weight.detach()
    assert torch.equal(model.model.soft_prompt.weight.detach(), table[[5, 9, 11, 5]])  # repeated to n_tokens
    assert [name for name, p in model.named_parameters() if p.requires_grad] == ["model.soft_prompt.weight"]
    before = {name: value.clone() for name, value in model.state_dict().items()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    ids = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(3))
    model(ids, labels=ids).mean().backward()
    optimizer.step()
    changed = [name for name, value in model.state_dict().items() if not torch.equal(value, before[name])]
    assert changed == ["model.soft_prompt.weight"]
