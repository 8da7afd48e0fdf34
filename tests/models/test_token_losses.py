"""The chunked loss against the loss of whole logits: the same per-token values and gradients, and no
tensor of a whole micro-batch's logits kept for the backward. Layouts (TP2 with loss_parallel, SP,
PP, CP, ZeRO-1) are compared, chunked, with one process computing whole logits in
tests/parallel/test_parity.py."""

from __future__ import annotations

import math

import pytest
import torch
from nxd_models import GPTConfig, build_causal_lm, model_family
from nxd_models.token_losses import chunked_token_cross_entropy, token_cross_entropy

SEQ, VOCAB = 24, 1000


def spec(chunk: int, tied: bool = False) -> GPTConfig:
    return GPTConfig(
        vocab_size=VOCAB,
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        seq_length=SEQ,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        normalization="rmsnorm",
        activation="swiglu",
        position_embedding_type="rope",
        share_embeddings_and_output_weights=tied,
        loss_chunk_tokens=chunk,
    )


def batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (2, SEQ + 1), generator=torch.Generator().manual_seed(3))
    labels = ids[:, 1:].clone()
    labels[0, :5] = -100  # a prompt that does not count
    labels[1, -3:] = -100
    return {"input_ids": ids[:, :-1], "labels": labels, "position_ids": torch.arange(SEQ).expand(2, SEQ)}


def losses_and_gradients(chunk: int, tied: bool, dtype: torch.dtype) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    config = spec(chunk, tied)
    model = build_causal_lm(config).to(dtype)
    losses = model_family(config).token_losses(model, batch())
    (losses * torch.linspace(0.5, 1.5, losses.numel(), dtype=losses.dtype).view_as(losses)).sum().backward()
    return losses.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("chunk", [1, 5, 7, 16])
def test_chunked_losses_and_gradients_equal_those_of_whole_logits(chunk, tied):
    """Per-token weights in the backward (as DPO's are) reach each chunk's recomputed logits."""
    for dtype, tolerance in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        whole, whole_grads = losses_and_gradients(0, tied, dtype)
        chunked, chunked_grads = losses_and_gradients(chunk, tied, dtype)
        assert whole.shape == (2, SEQ) and chunked.dtype == dtype
        torch.testing.assert_close(chunked, whole, rtol=tolerance, atol=tolerance)
        assert (chunked[0, :5] == 0).all() and (chunked[1, -3:] == 0).all()
        # relative to each tensor (fp32 rounds the sums differently), or for a gradient that is 0 but for
        # rounding (the key bias's: softmax ignores a shift shared by all keys) to 1% of the whole gradient
        whole_norm = torch.cat([gradient.flatten() for gradient in whole_grads.values()]).norm()
        for name, gradient in whole_grads.items():
            error = (chunked_grads[name] - gradient).norm() / max(gradient.norm(), whole_norm / 100)
            assert error < tolerance, (name, dtype, error.item())


def test_the_model_per_token_losses_are_the_cross_entropy_of_its_logits():
    """Worked by hand from the logits: -log softmax at each label."""
    torch.manual_seed(0)
    config, data = spec(7), batch()
    model = build_causal_lm(config).double()
    with torch.no_grad():
        logits = model_family(config).logits(model, data)
        losses = model_family(config).token_losses(model, data)
    b, t = 1, 4
    label = data["labels"][b, t].item()
    expected = math.log(logits[b, t].exp().sum().item()) - logits[b, t, label].item()
    assert losses[b, t].item() == pytest.approx(expected, rel=1e-12)


def largest_saved_tensor(chunk: int) -> int:
    """The most elements of any tensor autograd keeps from the forward for the backward."""
    torch.manual_seed(0)
    config = spec(chunk)
    model = build_causal_lm(config)
    sizes = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        sizes.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        losses = model_family(config).token_losses(model, batch())
    losses.sum().backward()
    return max(sizes)


def test_no_whole_logits_are_kept_for_the_backward():
    counted, padded = int((batch()["labels"] != -100).sum()), spec(0).padded_vocab_size
    assert largest_saved_tensor(0) == counted * padded  # the counted tokens' logits: the measure sees them
    assert largest_saved_tensor(8) < 8 * padded + 1  # chunked: nothing larger than one chunk's logits


def test_ignored_positions_never_reach_the_output_layer():
    head = torch.nn.Linear(4, 10, bias=False)
    seen = []
    head.register_forward_hook(lambda _, args, __: seen.append(args[0].shape[0]))
    hidden, labels = torch.randn(2, 3, 4), torch.tensor([[1, 2, -100], [-100, -100, 5]])
    losses = chunked_token_cross_entropy(hidden, head, labels, 0)
    assert seen == [3] and losses[0, 2] == losses[1, 0] == 0.0
    expected = token_cross_entropy(head(hidden), labels)
    assert torch.allclose(losses, expected)


def test_one_chunk_or_none_is_the_plain_head():
    head = torch.nn.Linear(4, 10, bias=False)
    hidden, labels = torch.randn(2, 3, 4), torch.tensor([[1, 2, -100], [3, 4, 5]])
    expected = token_cross_entropy(head(hidden), labels)
    for chunk in (0, 6, 100):
        assert torch.equal(chunked_token_cross_entropy(hidden, head, labels, chunk), expected)


@pytest.mark.parametrize("chunk", [5, 16])
def test_a_transformers_model_computes_its_loss_in_chunks_as_whole(chunk):
    """model_family(hf config, loss_chunk_tokens=n): the stage forward takes the counted positions' losses
    n tokens at a time; values and gradients equal the unchunked ones, and the exported config gains no key."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
        tie_word_embeddings=False,
    )
    results = []
    for tokens in (0, chunk):
        family = model_family(config, loss_chunk_tokens=tokens)
        assert family.loss_chunk_tokens == tokens and family.with_head("score").loss_chunk_tokens == tokens
        model = family.build(seed=0).double()
        losses = family.token_losses(model, batch())
        (losses * torch.linspace(0.5, 1.5, losses.numel(), dtype=losses.dtype).view_as(losses)).sum().backward()
        results.append((losses.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])))
        assert "nxd_loss_chunk_tokens" not in model.config.to_dict()
    (whole, whole_grads), (chunked, chunked_grads) = results
    torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-12)
    assert (chunked_grads - whole_grads).norm() / whole_grads.norm() < 1e-12
