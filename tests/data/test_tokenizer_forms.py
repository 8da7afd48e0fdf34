"""Every tokenizer form NxDT configs use, against the library that defines it: Megatron's
GPT2BPETokenizer from a GPT-2 vocab.json and merges.txt (ids as the tokenizers library's byte-level
BPE gives them from the same files), and a Llama 2 style directory holding only a SentencePiece
tokenizer.model (ids as sentencepiece itself gives them), a tokenizer.json (ids as transformers' own
tokenizer gives them); and the errors bad files get."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sentencepiece
from nxd_data import DataError, TokenizerSource, load_tokenizer
from tokenizers import ByteLevelBPETokenizer

from tests.conftest import TEXT

SAMPLE = "The quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs."


def test_gpt2_bpe_from_vocab_and_merges_gives_the_libraries_ids(gpt2_files):
    vocab, merges = gpt2_files
    ours = load_tokenizer(TokenizerSource("GPT2BPETokenizer", "megatron", vocab, merges))
    reference = ByteLevelBPETokenizer(vocab, merges)
    assert ours.encode([SAMPLE, TEXT[3]]) == [reference.encode(SAMPLE).ids, reference.encode(TEXT[3]).ids]
    assert ours.eod_id == reference.token_to_id("<|endoftext|>") and ours.begin_id == ours.eod_id
    assert ours.vocab_size == reference.get_vocab_size()
    assert set(ours.files) == {"vocab.json", "merges.txt"}


def test_a_tokenizer_json_gives_transformers_ids(tokenizer_file):
    from transformers import PreTrainedTokenizerFast

    ours = load_tokenizer(tokenizer_file)
    reference = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file))
    assert ours.encode([SAMPLE, TEXT[2]]) == [reference(SAMPLE)["input_ids"], reference(TEXT[2])["input_ids"]]
    assert ours.vocab_size == len(reference)


def test_a_sentencepiece_directory_gives_sentencepieces_ids(sentencepiece_dir):
    ours = load_tokenizer(sentencepiece_dir)
    reference = sentencepiece.SentencePieceProcessor(model_file=str(sentencepiece_dir / "tokenizer.model"))
    assert ours.encode([SAMPLE, TEXT[5]]) == [reference.encode(SAMPLE), reference.encode(TEXT[5])]
    assert (ours.eod_id, ours.begin_id) == (reference.eos_id(), reference.bos_id()) == (2, 1)
    assert set(ours.files) == {"tokenizer.model"}


def test_bad_tokenizer_files_are_one_clear_error(gpt2_files, tmp_path):
    vocab, merges = gpt2_files
    (tmp_path / "vocab.json").write_text("{not json")
    cases = [
        (TokenizerSource("GPT2BPETokenizer", "megatron", str(tmp_path / "vocab.json"), merges),
         "are not a GPT-2 vocabulary and merges"),
        (TokenizerSource("GPT2BPETokenizer", "megatron", vocab, None),
         "data.tokenizer.merge_file: expected the GPT-2 merges.txt of GPT2BPETokenizer, found none"),
        (TokenizerSource("BertWordPieceLowerCase", "megatron", vocab, merges),
         "data.tokenizer.type: expected one of GPT2BPETokenizer with library megatron, found 'BertWordPieceLowerCase'"),
        (TokenizerSource(str(tmp_path)), "expected a tokenizer.json file or a directory holding one (or a "
                                         "SentencePiece tokenizer.model), found a directory without tokenizer.json"),
    ]  # fmt: skip
    for source, message in cases:
        with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_tokenizer(source)
    (tmp_path / "spm").mkdir()
    (tmp_path / "spm" / "tokenizer.model").write_bytes(b"not a model")
    with pytest.raises(DataError, match=r"tokenizer.model is not a SentencePiece model transformers can load"):
        load_tokenizer(tmp_path / "spm")
    assert json.loads(Path(vocab).read_text())  # the good files were left as they were
