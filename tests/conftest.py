"""Shared test options (slower tests run only with --runslow), the in-process training fixture and a
small tokenizer trained on local text (no download)."""

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "pack my box with five dozen liquor jugs",
    "how vexingly quick daft zebras jump",
    "sphinx of black quartz, judge my vow",
] * 20


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def train_here(tmp_path):
    """Train the tiny config in this process with overrides; each call logs to a fresh directory."""
    from tests.training_runs import train_in_process  # the training stack loads only for tests that train

    runs = iter(range(1000))
    return lambda *overrides: train_in_process(tmp_path / f"run{next(runs)}", *overrides)


@pytest.fixture(scope="session")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE of 300 tokens (with <|endoftext|>) trained on TEXT, saved as tokenizer.json."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TEXT, trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


CHATML = (
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A ChatML template (the shape Qwen and many others use), written here rather than downloaded."""


@pytest.fixture(scope="session")
def chat_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer directory for fine-tuning: a byte-level BPE trained on TEXT with <s> (BOS),
    <|endoftext|> (EOS) and ChatML's turn markers, and a tokenizer_config.json naming them and the
    chat template."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<s>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TEXT, trainer)
    directory = tmp_path_factory.mktemp("chat_tokenizer")
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "<|endoftext|>", "chat_template": CHATML}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="session")
def gpt2_files(tmp_path_factory) -> tuple[str, str]:
    """vocab.json and merges.txt of a byte-level BPE trained on TEXT, with GPT-2's <|endoftext|>."""
    from tokenizers import ByteLevelBPETokenizer

    trained = ByteLevelBPETokenizer()
    trained.train_from_iterator(TEXT, vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False)
    directory = tmp_path_factory.mktemp("gpt2")
    vocab, merges = trained.save_model(str(directory))
    return vocab, merges


@pytest.fixture(scope="session")
def sentencepiece_dir(tmp_path_factory) -> Path:
    """A directory with only tokenizer.model (Llama 2's form): a SentencePiece BPE trained on TEXT with
    Llama's settings (ids unk 0, <s> 1, </s> 2; byte fallback; digits split)."""
    import sentencepiece

    directory = tmp_path_factory.mktemp("spm")
    (directory / "text.txt").write_text("\n".join(TEXT * 3))
    sentencepiece.SentencePieceTrainer.train(
        input=str(directory / "text.txt"),
        model_prefix=str(directory / "tokenizer"),
        vocab_size=400,
        model_type="bpe",
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        byte_fallback=True,
        split_digits=True,
        minloglevel=2,
    )
    (directory / "text.txt").unlink()
    (directory / "tokenizer.vocab").unlink()
    return directory
