"""KTO records: each example beside its KL sequence (its prompt with the completion of the nearest
earlier record of another prompt), labels on the completions, the label on both rows, conversations
through the chat template, and one clear error per kind of bad input."""

from __future__ import annotations

import pytest
from nxd_data import DataError, load_tokenizer
from nxd_data.kto import kto_dataset, mismatched

from tests.data.test_sft_data import encode, special, write_jsonl

IGNORED = -100
RECORDS = [
    {"prompt": "the quick fox", "completion": "fox quick the", "label": True},
    {"prompt": "the quick fox", "completion": "a dog", "label": False},
    {"prompt": "lazy dog", "completion": "dog lazy", "label": True},
]


def examples(tmp_path, tokenizer_dir, records, **kw):
    source = write_jsonl(tmp_path / "train.jsonl", records)
    return kto_dataset(
        str(source), "data.train_dir", "train", load_tokenizer(tokenizer_dir), 32, max_prompt_length=16, **kw
    )


def test_the_kl_completion_comes_from_the_nearest_earlier_record_of_another_prompt():
    assert mismatched([[1, 2], [1, 2], [3]], "data") == [2, 2, 1]  # record 1 skips record 0: the same prompt
    assert mismatched([[1], [2], [3], [4]], "data") == [3, 0, 1, 2]
    with pytest.raises(
        DataError,
        match="data.val_dir: KTO.s KL baseline .* expected at least two different prompts, found 1 in 3 records",
    ):
        mismatched([[1], [1], [1]], "data.val_dir")


def test_an_example_and_its_kl_sequence_are_one_sample(tmp_path, chat_tokenizer_dir):
    dataset = examples(tmp_path, chat_tokenizer_dir, RECORDS)
    bos, eos = special(chat_tokenizer_dir, "<s>"), special(chat_tokenizer_dir, "<|endoftext|>")
    sample = dataset[1]
    prompt = [bos, *encode(chat_tokenizer_dir, RECORDS[1]["prompt"])]
    for row, completion in enumerate((RECORDS[1]["completion"], RECORDS[2]["completion"])):
        response = [*encode(chat_tokenizer_dir, completion), eos]
        assert sample["input_ids"][row, : len(prompt) + len(response)].tolist() == prompt + response
        labels = sample["labels"][row]
        assert labels[labels != IGNORED].tolist() == response
    assert sample["kto_label"].tolist() == [0.0, 0.0] and dataset[0]["kto_label"].tolist() == [1.0, 1.0]
    assert dataset.desirable == 2 and len(dataset) == 3
    padding = dataset.padding()
    assert (padding["labels"] == IGNORED).all() and padding["kto_label"].tolist() == [0.0, 0.0]


def test_conversational_examples_render_with_the_chat_template(tmp_path, chat_tokenizer_dir):
    records = [
        {
            "prompt": [{"role": "user", "content": text}],
            "completion": [{"role": "assistant", "content": answer}],
            "label": label,
        }
        for text, answer, label in (("name a fox", "the fox", True), ("name a dog", "a cat", False))
    ]
    sample = examples(tmp_path, chat_tokenizer_dir, records)[0]
    tokenizer = load_tokenizer(chat_tokenizer_dir)
    completion = [*tokenizer.encode(["the fox<|im_end|>\n"])[0], special(chat_tokenizer_dir, "<|endoftext|>")]
    assert sample["labels"][0][sample["labels"][0] != IGNORED].tolist() == completion


def test_a_validation_split_may_hold_one_kind_the_training_split_may_not(tmp_path, chat_tokenizer_dir):
    one_kind = [record | {"label": True} for record in RECORDS]
    source = write_jsonl(tmp_path / "validation.jsonl", one_kind)
    tokenizer = load_tokenizer(chat_tokenizer_dir)
    assert (
        len(
            kto_dataset(str(source), "data.val_dir", "validation", tokenizer, 32, max_prompt_length=16, need_both=False)
        )
        == 3
    )
    with pytest.raises(DataError, match="found 3 desirable and 0 undesirable"):
        examples(tmp_path, chat_tokenizer_dir, one_kind)
