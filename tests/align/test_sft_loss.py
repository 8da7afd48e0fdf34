"""The SFT loss against transformers' own Llama (its loss, its label shift) with labels masked by hand,
and packed rows against one record per row: the same per-record losses and gradients, and no token
of one record seeing another."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from nxd_align import TokenObjective
from nxd_data import load_tokenizer, sft_dataset
from nxd_models import GPTConfig, build_causal_lm, model_family
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

RECORDS = [
    {"input": "the quick brown fox", "output": "jumps over the lazy dog"},
    {"input": "pack my box with", "output": "five dozen liquor jugs"},
    {"input": "sphinx of", "output": "black quartz, judge my vow"},
]
TOLERANCE = 1e-6


def rows(tmp_path: Path, tokenizer_dir: Path, records: list, seq_length: int, packing: bool):
    source = tmp_path / f"records-{packing}.jsonl"
    source.write_text("".join(json.dumps(record) + "\n" for record in records))
    return sft_dataset(
        str(source), "data.train_dir", "train", load_tokenizer(tokenizer_dir), seq_length, packing=packing
    )


def llama(vocab_size: int) -> GPTConfig:
    return GPTConfig(
        vocab_size=vocab_size,
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_kv_heads=2,
        seq_length=64,
        ffn_hidden_size=64,
        normalization="rmsnorm",
        activation="swiglu",
        position_embedding_type="rope",
        has_bias=False,
        share_embeddings_and_output_weights=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        make_vocab_size_divisible_by=1,
    )


def families(vocab_size: int) -> dict[str, object]:
    return {
        "megatron": llama(vocab_size),
        "hf": LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        ),
    }


def batch_of(dataset, indices: list[int]) -> dict[str, torch.Tensor]:
    samples = [dataset[i] for i in indices]
    return {key: torch.stack([sample[key] for sample in samples]) for key in samples[0]}


def test_sft_loss_equals_transformers_loss_on_the_responses(tmp_path, chat_tokenizer_dir):
    """Two records in one batch: our mean over response tokens equals transformers' LlamaForCausalLM
    loss (which shifts labels itself) over the same weights, each record's prompt masked by hand."""
    reference_tokenizer = Tokenizer.from_file(str(chat_tokenizer_dir / "tokenizer.json"))
    vocab = reference_tokenizer.get_vocab_size()
    spec = llama(vocab)
    torch.manual_seed(0)
    ours = build_causal_lm(spec).eval()
    mapping = model_family(spec).hf_mapping()
    theirs = LlamaForCausalLM(LlamaConfig(**mapping.config)).eval()
    theirs.load_state_dict({hf: ours.state_dict()[key] for key, hf in mapping.keys.items()})
    dataset = rows(tmp_path, chat_tokenizer_dir, RECORDS[:2], 48, packing=False)
    batch, objective = batch_of(dataset, [0, 1]), TokenObjective("sft")
    with torch.no_grad():
        loss_sum, _ = objective.loss(model_family(spec).token_losses(ours, batch), batch)
        ours_mean = (loss_sum / objective.count(batch)).item()
        total, count = 0.0, 0
        bos, eos = reference_tokenizer.token_to_id("<s>"), reference_tokenizer.token_to_id("<|endoftext|>")
        for record in RECORDS[:2]:
            prompt = [bos, *reference_tokenizer.encode(record["input"], add_special_tokens=False).ids]
            response = [*reference_tokenizer.encode(record["output"], add_special_tokens=False).ids, eos]
            ids = torch.tensor([prompt + response])
            labels = torch.tensor([[-100] * len(prompt) + response])  # transformers shifts them itself
            total += theirs(input_ids=ids, labels=labels).loss.item() * len(response)
            count += len(response)
    assert objective.count(batch).item() == count
    assert abs(ours_mean - total / count) < TOLERANCE


def per_record(dataset, batch: dict[str, torch.Tensor], losses: torch.Tensor) -> list[float]:
    """Each record's loss (the mean over its response tokens) in the batch's rows, found by document
    id, or one record per row."""
    losses, counted = losses.view(batch["labels"].shape), batch["labels"] != -100
    if "document_ids" not in batch:
        return [(row.sum() / mask.sum()).item() for row, mask in zip(losses, counted, strict=True)]
    records = [batch["document_ids"] == document for document in range(len(dataset.rows[0]))]
    return [(losses[record].sum() / counted[record].sum()).item() for record in records]


@pytest.mark.parametrize("family", ["megatron", "hf"])
def test_packed_and_unpacked_records_give_the_same_losses_and_gradients(tmp_path, chat_tokenizer_dir, family):
    vocab = load_tokenizer(chat_tokenizer_dir).vocab_size
    spec = families(vocab)[family]
    unpacked = rows(tmp_path, chat_tokenizer_dir, RECORDS, 64, packing=False)
    packed = rows(tmp_path, chat_tokenizer_dir, RECORDS, 64, packing=True)
    assert len(packed) == 1 and len(unpacked) == 3
    results = {}
    for name, dataset, indices in (("unpacked", unpacked, [0, 1, 2]), ("packed", packed, [0])):
        torch.manual_seed(0)
        model = model_family(spec).build()
        batch = batch_of(dataset, indices)
        losses = model_family(spec).token_losses(model, batch)
        (losses.sum() / (batch["labels"] != -100).sum()).backward()
        results[name] = (
            per_record(dataset, batch, losses.detach()),
            {key: p.grad.clone() for key, p in model.named_parameters()},
        )
    (unpacked_losses, unpacked_grads), (packed_losses, packed_grads) = results["unpacked"], results["packed"]
    assert max(abs(a - b) for a, b in zip(unpacked_losses, packed_losses, strict=True)) < TOLERANCE
    assert max((unpacked_grads[k] - packed_grads[k]).abs().max().item() for k in unpacked_grads) < TOLERANCE


@pytest.mark.parametrize("family", ["megatron", "hf"])
def test_a_token_of_one_record_cannot_see_another(tmp_path, chat_tokenizer_dir, family):
    vocab = load_tokenizer(chat_tokenizer_dir).vocab_size
    spec = families(vocab)[family]
    packed = rows(tmp_path, chat_tokenizer_dir, RECORDS, 64, packing=True)
    batch = batch_of(packed, [0])
    changed = {**batch, "input_ids": batch["input_ids"].clone()}
    first = batch["document_ids"][0] == 0
    changed["input_ids"][0, first] = (changed["input_ids"][0, first] + 7) % vocab  # record A rewritten
    torch.manual_seed(0)
    model = model_family(spec).build().eval()
    with torch.no_grad():
        before, after = (model_family(spec).logits(model, b)[0] for b in (batch, changed))
    assert (before[first] - after[first]).abs().max() > 1e-3  # A's own logits do change
    for document in (1, 2):  # B's and C's do not
        rest = batch["document_ids"][0] == document
        assert torch.equal(before[rest], after[rest]), document
