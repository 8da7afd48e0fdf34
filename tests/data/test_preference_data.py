"""Preference records: tokens and labels against the tokenizer used directly, both sequences of a pair
in one sample, truncation of the prompt (keep_start / keep_end) and then the responses, conversations
rendered with the chat template, and one clear error per kind of bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from nxd_data import DataError, load_tokenizer
from nxd_data.preference import preference_dataset

from tests.data.test_sft_data import encode, special, write_jsonl

IGNORED = -100
PAIR = {"prompt": "the quick brown fox", "chosen": "jumps over the lazy dog", "rejected": "sleeps"}


def pairs(tmp_path: Path, tokenizer_dir: Path, records: list, seq_length: int = 32, **kw):
    source = write_jsonl(tmp_path / "train.jsonl", records)
    return preference_dataset(
        str(source),
        "data.train_dir",
        "train",
        load_tokenizer(tokenizer_dir),
        seq_length,
        max_prompt_length=kw.pop("max_prompt_length", 16),
        **kw,
    )


def test_a_pair_is_one_sample_with_both_sequences_and_labels_on_the_responses(tmp_path, chat_tokenizer_dir):
    sample = pairs(tmp_path, chat_tokenizer_dir, [PAIR])[0]
    bos, eos = special(chat_tokenizer_dir, "<s>"), special(chat_tokenizer_dir, "<|endoftext|>")
    prompt = [bos, *encode(chat_tokenizer_dir, PAIR["prompt"])]
    for row, name in enumerate(("chosen", "rejected")):
        response = [*encode(chat_tokenizer_dir, PAIR[name]), eos]
        tokens = prompt + response
        assert sample["input_ids"][row, : len(tokens)].tolist() == tokens
        assert sample["input_ids"][row, len(tokens) :].eq(eos).all()  # padded with EOS, never learned
        labels = sample["labels"][row].tolist()
        assert labels[: len(prompt) - 1] == [IGNORED] * (len(prompt) - 1)
        assert labels[len(prompt) - 1 : len(tokens) - 1] == response
        assert set(labels[len(tokens) - 1 :]) == {IGNORED}
    assert sample["input_ids"].shape == sample["position_ids"].shape == (2, 32)


@pytest.mark.parametrize("mode", ["keep_start", "keep_end"])
def test_a_long_prompt_is_cut_to_max_prompt_length_then_responses_to_the_room_left(tmp_path, chat_tokenizer_dir, mode):
    words = " ".join(f"word{i}" for i in range(40))
    record = {"prompt": words, "chosen": words, "rejected": "no"}
    dataset = pairs(tmp_path, chat_tokenizer_dir, [record], seq_length=24, max_prompt_length=8, truncation_mode=mode)
    prompt_ids = [special(chat_tokenizer_dir, "<s>"), *encode(chat_tokenizer_dir, words)]
    kept = prompt_ids[:8] if mode == "keep_start" else [prompt_ids[0], *prompt_ids[-7:]]
    sample = dataset[0]
    assert sample["input_ids"][0, :8].tolist() == kept and sample["input_ids"][1, :8].tolist() == kept
    assert sample["input_ids"][0, 8:].tolist() == encode(chat_tokenizer_dir, words)[:16]  # 24 - 8: its start
    assert (sample["labels"][0] != IGNORED).sum() == 16 and dataset.truncated == 1
    short = pairs(tmp_path, chat_tokenizer_dir, [PAIR], seq_length=24, max_prompt_length=8, truncation_mode=mode)
    assert short.truncated == 0  # fits: nothing is cut


def test_conversations_render_with_the_chat_template(tmp_path, chat_tokenizer_dir):
    record = {
        "prompt": [{"role": "user", "content": "name a fox"}],
        "chosen": [{"role": "assistant", "content": "the quick brown fox"}],
        "rejected": [{"role": "assistant", "content": "a dog"}],
    }
    sample = pairs(tmp_path, chat_tokenizer_dir, [record], seq_length=48)[0]
    prompt = "<s><|im_start|>user\nname a fox<|im_end|>\n<|im_start|>assistant\n"
    tokenizer = load_tokenizer(chat_tokenizer_dir)
    prompt_ids = tokenizer.encode([prompt])[0]
    chosen_ids = [
        *tokenizer.encode(["the quick brown fox<|im_end|>\n"])[0],
        special(chat_tokenizer_dir, "<|endoftext|>"),
    ]
    assert sample["input_ids"][0, : len(prompt_ids) + len(chosen_ids)].tolist() == prompt_ids + chosen_ids
    assert sample["labels"][0][sample["labels"][0] != IGNORED].tolist() == chosen_ids


def test_padding_pairs_add_nothing(tmp_path, chat_tokenizer_dir):
    dataset = pairs(tmp_path, chat_tokenizer_dir, [PAIR])
    assert torch.all(dataset.padding()["labels"] == IGNORED)


@pytest.mark.parametrize(
    "record, expected",
    [
        ({"prompt": "a", "chosen": "b"}, "line 1: expected prompt, chosen and rejected, found no rejected"),
        (
            {"prompt": "a", "chosen": "b", "rejected": "  "},
            "line 1: rejected: expected a response, found an empty string",
        ),
        (
            {"prompt": "a", "chosen": ["b"], "rejected": "c"},
            "expected prompt, chosen and rejected all strings or all "
            "message lists, found prompt str, chosen list, rejected str",
        ),
        (
            {
                "prompt": [{"role": "user", "content": "a"}],
                "chosen": [{"role": "assistant", "content": ""}],
                "rejected": [{"role": "assistant", "content": "c"}],
            },
            "chosen: expected an assistant message with content",
        ),
    ],
)
def test_a_bad_record_is_one_message_naming_file_and_line(tmp_path, chat_tokenizer_dir, record, expected):
    with pytest.raises(DataError) as error:
        pairs(tmp_path, chat_tokenizer_dir, [record])
    assert str(error.value).startswith(f"data.train_dir: {tmp_path / 'train.jsonl'} ") and expected in str(error.value)


def test_max_prompt_length_must_leave_room_for_a_response(tmp_path, chat_tokenizer_dir):
    with pytest.raises(DataError, match=r"max_prompt_length: expected at least 1 and below data.seq_length \(32\)"):
        pairs(tmp_path, chat_tokenizer_dir, [PAIR], max_prompt_length=32)


def test_collated_pairs_put_each_chosen_row_beside_its_rejected_row(tmp_path, chat_tokenizer_dir):
    from nxd_data import collate_pairs

    other = {"prompt": "pack my box", "chosen": "with five dozen liquor jugs", "rejected": "no"}
    dataset = pairs(tmp_path, chat_tokenizer_dir, [PAIR, other])
    batch = collate_pairs([dataset[0], dataset[1]])
    assert batch["input_ids"].shape == (4, 32)
    for number in range(2):
        for row in range(2):
            assert torch.equal(batch["input_ids"][2 * number + row], dataset[number]["input_ids"][row])


def test_collated_pairs_can_drop_their_trailing_padding(tmp_path, chat_tokenizer_dir):
    from nxd_data import collate_pairs

    dataset = pairs(
        tmp_path, chat_tokenizer_dir, [PAIR, {"prompt": "a", "chosen": "b", "rejected": "c"}], seq_length=64
    )
    whole = collate_pairs([dataset[0], dataset[1]])
    longest = max(int((row != IGNORED).nonzero().max()) + 2 for row in whole["labels"])
    trimmed = collate_pairs([dataset[0], dataset[1]], trim_to=8)
    assert trimmed["input_ids"].shape == (4, -(-longest // 8) * 8) and longest < 64
    for key in whole:  # the same batch, without columns that hold only padding
        assert torch.equal(trimmed[key], whole[key][:, : trimmed[key].shape[1]])
    assert (whole["labels"][:, trimmed["labels"].shape[1] :] == IGNORED).all()
