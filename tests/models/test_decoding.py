"""Incremental decoding: logits of tokens fed one at a time through the key/value cache equal the logits of
the whole sequence in one forward, for every shape the Megatron-style decoder has and for transformers models
through their own cache; generation with the cache and without it (recompute) chooses the same tokens."""

from __future__ import annotations

import pytest
import torch
from nxd_models import AttentionKernel, GPTConfig, MoESpec, build_causal_lm, causal_lm_logits
from nxd_models.decoding import decoding_cache, decoding_logits, prepare_for_decoding
from nxd_models.generation import Sampling, generate
from transformers import LlamaConfig, MistralConfig, MixtralConfig, Qwen3Config

SHAPES = {
    "llama_gqa": {},
    "sliding_window": {"sliding_window": 5},
    "alibi": {"position_embedding_type": "alibi"},
    "pythia": {
        "transformer_block_type": "gpt_neox",
        "rotary_percentage": 0.25,
        "normalization": "layernorm",
        "activation": "gelu",
        "has_bias": True,
        "num_kv_heads": 4,
    },
    "gpt_j": {"transformer_block_type": "gpt_j", "rotary_percentage": 0.5},
    "learned_absolute": {"position_embedding_type": "learned_absolute", "normalization": "layernorm"},
    "sinusoidal": {"position_embedding_type": "sinusoidal"},
    "moe": {"moe": MoESpec(num_experts=4, top_k=2, normalize_top_k_affinities=True)},
    "sinkhorn_moe": {"moe": MoESpec(num_experts=4, top_k=1, routing="sinkhorn")},
    "capacity_moe": {"moe": MoESpec(num_experts=4, top_k=1, capacity_factor=1.0)},
}
SEQ = 12
GREEDY = Sampling()


def _megatron(shape: str) -> torch.nn.Module:
    settings = {"num_kv_heads": 2, **SHAPES[shape]}
    config = GPTConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        vocab_size=97,
        seq_length=32,
        init_method_std=0.3,
        **settings,
    )
    return prepare_for_decoding(build_causal_lm(config, seed=5, attention=AttentionKernel.UNFUSED))


def _incremental(model: torch.nn.Module, ids: torch.Tensor, first: int) -> torch.Tensor:
    """Logits of `ids`: the first `first` tokens in one call, then one token per call, through one cache."""
    cache, parts = decoding_cache(model), []
    for start, end in [(0, first), *((p, p + 1) for p in range(first, ids.shape[1]))]:
        positions = torch.arange(start, end).expand(ids.shape[0], -1)
        parts.append(decoding_logits(model, ids[:, start:end], positions, cache))
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_cache_gives_the_whole_sequences_logits(shape):
    model = _megatron(shape)
    ids = torch.randint(0, 97, (3, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = causal_lm_logits(model, ids, torch.arange(SEQ).expand(3, -1))
        step = _incremental(model, ids, first=4)
    torch.testing.assert_close(step, whole, rtol=1e-5, atol=1e-5)


HF = {
    "llama": LlamaConfig(num_key_value_heads=2),
    "mistral_window": MistralConfig(num_key_value_heads=2, sliding_window=5),
    "mixtral": MixtralConfig(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
    "qwen3": Qwen3Config(num_key_value_heads=2, head_dim=8),
}


@pytest.mark.parametrize("name", list(HF))
def test_a_transformers_model_decodes_through_its_own_cache(name):
    config = HF[name]
    for key, value in {
        "vocab_size": 97,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 32,
    }.items():
        setattr(config, key, value)
    model = prepare_for_decoding(build_causal_lm(config, seed=5))
    ids = torch.randint(0, 97, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = causal_lm_logits(model, ids, torch.arange(SEQ).expand(2, -1))
        step = _incremental(model, ids, first=3)
    torch.testing.assert_close(step, whole, rtol=1e-5, atol=1e-5)


def _continuations(model: torch.nn.Module, cached: bool, sampling: Sampling = GREEDY, seed: int = 0):
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]]
    with torch.no_grad():
        return generate(
            lambda i, p, c: decoding_logits(model, i, p, c),
            (lambda: decoding_cache(model)) if cached else None,
            prompts,
            maximum_tokens=10,
            context=32,
            end_id=0,
            vocab_size=97,
            sampling=sampling,
            generator=torch.Generator().manual_seed(seed),
        )


@pytest.mark.parametrize("shape", ["llama_gqa", "alibi", "moe"])
def test_cached_and_recomputed_generation_choose_the_same_tokens(shape):
    model = _megatron(shape)
    cached, recomputed = _continuations(model, True), _continuations(model, False)
    assert [c.tokens for c in cached] == [c.tokens for c in recomputed]
    assert len({t for c in cached for t in c.tokens}) > 3  # varied continuations: the comparison can fail
    alone = [_continuations_one(model, prompt) for prompt in ([1, 2, 3], [4, 5, 6, 7, 8, 9], [10])]
    assert [c.tokens for c in cached] == alone  # a row of a batch gets what it gets alone


def _continuations_one(model: torch.nn.Module, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        return generate(
            lambda i, p, c: decoding_logits(model, i, p, c),
            lambda: decoding_cache(model),
            [prompt],
            maximum_tokens=10,
            context=32,
            end_id=0,
            vocab_size=97,
        )[0].tokens


def test_sampling_follows_the_seed_and_the_filters():
    model = _megatron("llama_gqa")
    sampling = Sampling(temperature=1.5, top_k=5, top_p=0.9)
    first, again = _continuations(model, True, sampling, 7), _continuations(model, True, sampling, 7)
    other = _continuations(model, True, sampling, 8)
    assert [c.tokens for c in first] == [c.tokens for c in again]
    assert [c.tokens for c in first] != [c.tokens for c in other]
    greedy = _continuations(model, True)
    assert [c.tokens for c in first] != [c.tokens for c in greedy]


def test_a_row_ends_at_the_end_of_document_token():
    model = _megatron("llama_gqa")
    greedy = _continuations(model, True)[0].tokens
    with torch.no_grad():
        [ended] = generate(
            lambda i, p, c: decoding_logits(model, i, p, c),
            lambda: decoding_cache(model),
            [[1, 2, 3]],
            maximum_tokens=10,
            context=32,
            end_id=greedy[2],
            vocab_size=97,
        )
    assert ended.finished and ended.tokens == greedy[: greedy.index(greedy[2])]
    with pytest.raises(Exception, match="leaves no room in the model's context of 32 positions"):
        generate(lambda i, p, c: None, None, [list(range(32))], maximum_tokens=4, context=32, end_id=0, vocab_size=97)


def test_a_row_with_a_stream_of_its_own_samples_alike_whatever_else_the_batch_holds():
    """Online RL's sampling: with one generator a row, a row's completion depends on its stream only, not on the
    other rows (a shorter prompt beside it starts decoding earlier), and `entropies` gets each of its tokens'."""
    table = torch.randn(20, 20, generator=torch.Generator().manual_seed(0))

    def step(ids: torch.Tensor, positions: torch.Tensor, cache: object) -> torch.Tensor:
        return table[ids]  # each position's logits from its own token

    def sample(prompts: list[list[int]]) -> tuple[list[list[int]], list[list[float]]]:
        streams = [torch.Generator().manual_seed(7 + row) for row in range(len(prompts))]
        entropies: list[list[float]] = []
        found = generate(
            step,
            None,
            prompts,
            maximum_tokens=5,
            context=30,
            end_id=19,
            vocab_size=20,
            sampling=Sampling(1.0, 0, 0.0),
            generator=streams,
            entropies=entropies,
        )
        return [completion.tokens for completion in found], entropies

    (alone,), (alone_entropies,) = sample([[3, 4, 5, 6]])
    (beside, _), (beside_entropies, _) = sample([[3, 4, 5, 6], [1]])
    assert alone == beside and alone_entropies == beside_entropies
    logits = table[torch.tensor([6, *alone[:-1]])]
    expected = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    assert len(alone_entropies) == len(alone) and alone_entropies == pytest.approx(expected[: len(alone)].tolist())


def _llama_hf() -> torch.nn.Module:
    config = LlamaConfig(
        num_key_value_heads=2,
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
    )
    return prepare_for_decoding(build_causal_lm(config, seed=5))


@pytest.mark.parametrize("family", ["megatron", "transformers"])
def test_rows_that_end_leave_the_batch_and_the_others_sample_as_alone(family):
    """A row that has ended leaves the batch with its rows of the cache (nxd's KVCache or transformers'): the
    forwards shrink, and every row's completion is still the one it samples alone from its stream."""
    model = _megatron("llama_gqa") if family == "megatron" else _llama_hf()
    prompts = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12, 13]]
    sizes: list[int] = []

    def step(ids: torch.Tensor, positions: torch.Tensor, cache: object) -> torch.Tensor:
        sizes.append(ids.shape[0])
        return decoding_logits(model, ids, positions, cache)

    def sample(rows: list[list[int]], places: list[int], end_id: int) -> list[list[int]]:
        with torch.no_grad():
            found = generate(
                step,
                lambda: decoding_cache(model),
                rows,
                maximum_tokens=12,
                context=32,
                end_id=end_id,
                vocab_size=97,
                sampling=Sampling(1.0, 0, 0.0),
                generator=[torch.Generator().manual_seed(40 + place) for place in places],
            )
        return [[*c.tokens, *([end_id] if c.finished else [])] for c in found]

    free = sample(prompts, [0, 1, 2, 3], end_id=0)
    end_id = free[0][2]  # row 0 ends at its third token; the others when they draw it, or at 12 tokens
    together = sample(prompts, [0, 1, 2, 3], end_id)
    alone = [sample([prompt], [place], end_id)[0] for place, prompt in enumerate(prompts)]
    assert together == alone
    assert len({len(tokens) for tokens in together}) > 1  # rows end apart: the comparison covers a pruned batch
    sizes.clear()
    sample(prompts, [0, 1, 2, 3], end_id)
    assert sizes[-1] < sizes[0] == len(prompts)


def test_inverse_cdf_sampling_by_hand():
    """Probabilities (0.1, 0, 0.6, 0.3): cumulative (0.1, 0.1, 0.7, 1.0); a draw u takes the first token whose
    cumulative probability exceeds u, so the zero-probability token 1 is never taken."""
    from nxd_models.generation import _inverse_cdf

    probabilities = torch.tensor([[0.1, 0.0, 0.6, 0.3]]).expand(6, -1)
    draws = torch.tensor([0.05, 0.1, 0.5, 0.7, 0.95, 0.999999], dtype=torch.float64)
    assert _inverse_cdf(probabilities, draws).tolist() == [0, 2, 2, 3, 3, 3]
    filtered = torch.tensor([[0.25, 0.75, 0.0, 0.0]])  # top-k zeroed the tail: a draw near 1 stays inside
    assert _inverse_cdf(filtered, torch.tensor([1 - 1e-17], dtype=torch.float64)).tolist() == [1]


def test_rows_with_streams_of_their_own_sample_the_models_distribution():
    """4,000 rows of one prompt, each with its own stream: the first tokens' frequencies follow the softmax of the
    logits (each within 4 standard errors)."""
    logits = torch.tensor([1.0, 0.0, 2.0, -1.0, 0.5])
    found = generate(
        lambda ids, positions, cache: logits.expand(ids.shape[0], ids.shape[1], -1),
        None,
        [[0]] * 4000,
        maximum_tokens=1,
        context=4,
        end_id=4,
        vocab_size=5,
        sampling=Sampling(1.0, 0, 0.0),
        generator=[torch.Generator().manual_seed(row) for row in range(4000)],
    )
    counts = torch.bincount(torch.tensor([c.tokens[0] if c.tokens else 4 for c in found]), minlength=5)
    expected = torch.softmax(logits, -1)
    error = (expected * (1 - expected) / 4000).sqrt()
    assert ((counts / 4000 - expected).abs() < 4 * error).all(), (counts / 4000, expected)
