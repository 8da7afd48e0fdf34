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


def test_library_megatron_with_a_tokenizer_folder_reads_it_as_hugging_face(sentencepiece_dir):
    """NeMo hands a Megatron tokenizer name that is no Megatron class to AutoTokenizer (NxDT's Mixtral
    example writes library megatron with a tokenizer folder)."""
    ours = load_tokenizer(TokenizerSource(str(sentencepiece_dir), "megatron"))
    reference = load_tokenizer(sentencepiece_dir)
    assert ours.encode([SAMPLE]) == reference.encode([SAMPLE]) and ours.fingerprint == reference.fingerprint


def test_bad_tokenizer_files_are_one_clear_error(gpt2_files, tmp_path):
    vocab, merges = gpt2_files
    (tmp_path / "vocab.json").write_text("{not json")
    cases = [
        (
            TokenizerSource("GPT2BPETokenizer", "megatron", str(tmp_path / "vocab.json"), merges),
            "are not a GPT-2 vocabulary and merges",
        ),
        (
            TokenizerSource("GPT2BPETokenizer", "megatron", vocab, None),
            "data.tokenizer.merge_file: expected the GPT-2 merges.txt of GPT2BPETokenizer, found none",
        ),
        (
            TokenizerSource("BertWordPieceLowerCase", "megatron", vocab, merges),
            "data.tokenizer.type: expected one of GPT2BPETokenizer, CharLevelTokenizer, TiktokenTokenizer or a "
            "tokenizer.json file or a directory holding one (or a SentencePiece tokenizer.model), found no such file or "
            "directory: BertWordPieceLowerCase",
        ),
        (
            TokenizerSource(str(tmp_path)),
            "expected a tokenizer.json file or a directory holding one (or a "
            "SentencePiece tokenizer.model), found a directory without tokenizer.json",
        ),
    ]
    for source, message in cases:
        with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_tokenizer(source)
    (tmp_path / "spm").mkdir()
    (tmp_path / "spm" / "tokenizer.model").write_bytes(b"not a model")
    with pytest.raises(DataError, match=r"tokenizer.model is not a SentencePiece model transformers can load"):
        load_tokenizer(tmp_path / "spm")
    assert json.loads(Path(vocab).read_text())  # the good files were left as they were


def test_character_level_ids_are_the_texts_utf8_bytes(tmp_path):
    """GPT-NeoX's CharLevelTokenizer: ids are the bytes, 0 ends a document, 512 ids declared; its exported
    tokenizer.json gives transformers the same ids."""
    from transformers import PreTrainedTokenizerFast

    ours = load_tokenizer(TokenizerSource("CharLevelTokenizer", "megatron"))
    texts = [SAMPLE, "héllo wörld\n\t€ 😀 <|endoftext|>", ""]
    assert ours.encode(texts) == [list(text.encode("utf-8")) for text in texts]
    assert (ours.eod_id, ours.vocab_size, ours.files) == (0, 512, {})
    assert ours.tokenizer.decode(ours.encode(texts[1:2])[0]) == texts[1]
    exported = ours.export_files(tmp_path)
    assert ours.export_files(tmp_path) == exported and set(exported) == {"tokenizer.json"}
    reference = PreTrainedTokenizerFast(tokenizer_file=exported["tokenizer.json"])
    assert [reference(text)["input_ids"] for text in texts] == ours.encode(texts)


R50K_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@pytest.fixture
def tiktoken_encoding(gpt2_files, tmp_path, monkeypatch) -> str:
    """A tiktoken encoding registered as tiktoken's plugins register theirs (a tiktoken_ext module): the
    byte-level BPE of gpt2_files as ranks (bytes first, then each merge), <|endoftext|> after a gap of ids."""
    import tiktoken.registry
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
    ranks = {bytes([byte]): byte for byte in range(256)}
    for line in Path(gpt2_files[1]).read_text().splitlines()[1:]:
        merged = bytes(to_byte[char] for char in line.replace(" ", ""))
        ranks.setdefault(merged, len(ranks))
    plugin = tmp_path / "tiktoken_ext"
    plugin.mkdir()
    ranks_file = tmp_path / "ranks.json"
    ranks_file.write_text(json.dumps([[list(piece), rank] for piece, rank in ranks.items()]))
    (plugin / "nxd_test_encodings.py").write_text(
        "import json\n"
        "def tiny():\n"
        f"    ranks = {{bytes(piece): rank for piece, rank in json.load(open({str(ranks_file)!r}))}}\n"
        f"    return dict(name='nxd_tiny', pat_str={R50K_PATTERN!r}, mergeable_ranks=ranks,\n"
        f"                special_tokens={{'<|endoftext|>': {len(ranks) + 7}}})\n"
        "ENCODING_CONSTRUCTORS = {'nxd_tiny': tiny}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(tiktoken.registry, "ENCODING_CONSTRUCTORS", None)  # tiktoken looks for plugins again
    return "nxd_tiny"


def test_a_tiktoken_encoding_gives_tiktokens_ids(tiktoken_encoding):
    import tiktoken

    reference = tiktoken.get_encoding(tiktoken_encoding)
    ours = load_tokenizer(TokenizerSource("TiktokenTokenizer", "megatron", tiktoken_encoding))
    texts = [SAMPLE, TEXT[1], "héllo wörld\n\n  €1234 😀<|endoftext|>the end", "don't  stop\r\n"]
    assert ours.encode(texts) == reference.encode_batch(texts, allowed_special="all")
    assert (ours.eod_id, ours.vocab_size) == (reference.eot_token, reference.n_vocab)
    assert ours.files == {}


def test_tiktoken_says_when_an_encoding_cannot_load(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # empty: nothing cached, and no network here
    with pytest.raises(
        DataError,
        match=r"vocab_file: tiktoken could not load encoding 'cl100k_base': .* offline only "
        r"from tiktoken's cache \(TIKTOKEN_CACHE_DIR",
    ):
        load_tokenizer(TokenizerSource("TiktokenTokenizer", "megatron", "cl100k_base"))
    with pytest.raises(DataError, match=r"vocab_file: Unknown encoding nxd_nothing"):
        load_tokenizer(TokenizerSource("TiktokenTokenizer", "megatron", "nxd_nothing"))
    with pytest.raises(DataError, match=r"vocab_file: expected a tiktoken encoding name .* found None"):
        load_tokenizer(TokenizerSource("TiktokenTokenizer", "megatron"))


def test_a_tokenizer_folder_with_its_own_code_runs_it_only_when_trusted(sentencepiece_dir, tmp_path, monkeypatch):
    """transformers would ask "run the custom code? [y/N]" on a terminal; nxd refuses by name instead, and
    with model.trust_remote_code the folder's class is what loads."""
    import shutil

    import transformers.dynamic_module_utils as dynamic

    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    folder, marker = tmp_path / "custom", tmp_path / "ran"
    shutil.copytree(sentencepiece_dir, folder)
    (folder / "custom.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from transformers import LlamaTokenizer\n\n\n"
        "class CustomTokenizer(LlamaTokenizer):\n    pass\n"
    )
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {"tokenizer_class": "CustomTokenizer", "auto_map": {"AutoTokenizer": ["custom.CustomTokenizer", None]}}
        )
    )
    with pytest.raises(
        DataError,
        match=r"tokenizer_config.json names the folder's own Python code \(auto_map: "
        r"\['custom.CustomTokenizer', None\]\); nxd runs a folder's code only when a "
        r"run's config trusts it \(model.trust_remote_code: True\)",
    ):
        load_tokenizer(TokenizerSource(str(folder)))
    assert not marker.exists()
    trusted = load_tokenizer(TokenizerSource(str(folder), trust_remote_code=True))
    assert marker.exists() and trusted.vocab_size == load_tokenizer(sentencepiece_dir).vocab_size


MISTRAL_STYLE = {
    "model_type": "bpe",
    "normalization_rule_name": "identity",
    "remove_extra_whitespaces": False,
    "byte_fallback": True,
    "split_digits": True,
    "allow_whitespace_only_pieces": True,
    "unk_id": 0,
    "bos_id": 1,
    "eos_id": 2,
    "pad_id": -1,
}
"""Llama's and Mistral's SentencePiece settings (their tokenizer.model's trainer and normaliser specs)."""
SPM_FORMS = {
    "mistral_style_bpe": MISTRAL_STYLE,
    "default_unigram": {"model_type": "unigram"},
    "default_bpe_with_a_symbol": {"model_type": "bpe", "user_defined_symbols": ["<tool>"], "byte_fallback": True},
    "unigram_without_dummy_prefix": {"model_type": "unigram", "add_dummy_prefix": False},
    "bpe_with_endoftext": {"model_type": "bpe", "control_symbols": ["<|endoftext|>"]},
}
"""sentencepiece's defaults normalise with NFKC and drop extra whitespace; Llama's settings keep every character."""


def _spm_texts() -> list[str]:
    import random

    rng = random.Random(0)
    edge = [
        "",
        " ",
        "   ",
        " leading",
        "trailing  ",
        "double  space",
        "tab\tand\nnewline",
        "ＡＢＣ ﬁ ½ full width",
        "héllo wörld 漢字 🚀",
        "12345 6.78",
        "<s> and </s> inline",
        "x <tool> y<tool>z",
        "<|endoftext|> end",
    ]
    words = [*SAMPLE.split(), *" ".join(TEXT).split()]
    return [
        *edge,
        *(" ".join(rng.choice(words) for _ in range(rng.randint(1, 30))) for _ in range(200)),
        *("".join(rng.choice("ab c\t\n1äZ漢 <>") for _ in range(40)) for _ in range(200)),
    ]


@pytest.mark.parametrize("form", SPM_FORMS)
def test_a_sentencepiece_model_file_of_any_name_gives_sentencepieces_ids(tmp_path, form):
    """GPT-NeoX's SPMTokenizer and NeMo's library sentencepiece read a model file with sentencepiece itself: the
    same ids for 413 texts (whitespace runs, tabs, NFKC forms, bytes outside the vocabulary, control pieces written
    as text, user-defined symbols), whatever the file is called."""
    import random

    rng = random.Random(1)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyzäöü") for _ in range(rng.randint(2, 8))) for _ in range(300)]
    lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(2000)]
    text = tmp_path / "text.txt"
    text.write_text("\n".join(TEXT * 3 + [SAMPLE, "héllo wörld 12345 ünïcode ＡＢＣ"] * 5 + lines))
    sentencepiece.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(tmp_path / "mistral"),
        vocab_size=600,
        hard_vocab_limit=False,
        minloglevel=2,
        **SPM_FORMS[form],
    )
    model = tmp_path / "mistral.model"
    reference = sentencepiece.SentencePieceProcessor(model_file=str(model))
    texts = _spm_texts()
    for ours in (load_tokenizer(str(model)), load_tokenizer(TokenizerSource(str(model), "sentencepiece"))):
        assert ours.encode(texts) == [reference.encode(text) for text in texts]
        endoftext = reference.piece_to_id("<|endoftext|>")
        expected_eod = endoftext if reference.id_to_piece(endoftext) == "<|endoftext|>" else reference.eos_id()
        assert ours.eod_id == expected_eod and ours.vocab_size == reference.get_piece_size()
        assert ours.files == {"tokenizer.model": str(model.resolve())}


def test_a_file_that_is_no_sentencepiece_model_is_one_clear_error(tmp_path):
    (tmp_path / "broken.model").write_bytes(b"\x00\x01not a model")
    with pytest.raises(DataError, match=r"data.tokenizer.type: .*broken.model is not a SentencePiece model"):
        load_tokenizer(tmp_path / "broken.model")
    with pytest.raises(
        DataError,
        match=r"data.tokenizer.model: expected a SentencePiece model file, found no such "
        r"file: .*absent.model",
    ):
        load_tokenizer(TokenizerSource(str(tmp_path / "absent.model"), "sentencepiece"), "data.tokenizer.model")
