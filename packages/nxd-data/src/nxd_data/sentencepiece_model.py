"""A SentencePiece model file (any name: GPT-NeoX's SPMTokenizer `vocab_file`, NeMo's `library: sentencepiece` with
`model`) as a `tokenizers` tokenizer that gives sentencepiece's own ids.

transformers' conversion serves Hugging Face folders (a Llama tokenizer.model beside its tokenizer_config.json) and
follows their conventions, which differ from sentencepiece's for a leading space, for Unigram models and for any
normaliser but Llama's. GPT-NeoX and NeMo tokenize with sentencepiece itself, so a model file is rebuilt here from
its own specification (the ModelProto): the normaliser's character map, whitespace rules and dummy prefix, then the
model (Unigram by score; BPE with merges ranked by the merged piece's score, as sentencepiece merges). Control and
unused pieces are never produced from text, and user-defined symbols are cut out as sentencepiece cuts them.
"""

from __future__ import annotations

import re
from pathlib import Path

from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import BPE, Unigram

from .errors import DataError

UNIGRAM, BPE_MODEL = 1, 2
"""TrainerSpec.model_type values of the models nxd reads (sentencepiece's word and char models are not used by
language models)."""
CONTROL, USER_DEFINED, UNUSED = 3, 4, 5
"""ModelProto.SentencePiece.type values."""
END_OF_DOCUMENT = "<|endoftext|>"
"""GPT-NeoX's SPMTokenizer ends documents with this piece; a model without it ends them with its eos piece (NeMo's
rule; GPT-NeoX would take the unknown piece's id there)."""


def is_sentencepiece_model(path: Path) -> bool:
    """Whether `path` is a file named as a SentencePiece model (`.model`)."""
    return path.is_file() and path.suffix == ".model"


def read_sentencepiece_model(path: Path, where: str) -> tuple[Tokenizer, int, int | None]:
    """The tokenizer of the model file `path`, its end-of-document id and its beginning-of-sequence id (None when
    the model has none); a DataError naming `where` and the file when it is no SentencePiece model."""
    proto = _model_proto(path, where)
    spec, rules = proto.trainer_spec, proto.normalizer_spec
    hide = spec.model_type == UNIGRAM and rules.escape_whitespaces  # a Unigram lattice would match control pieces
    pieces = [
        (piece.piece + " " if hide and piece.type in (CONTROL, UNUSED) else piece.piece, piece.score)
        for piece in proto.pieces
    ]  # normalised text holds no space: it is escaped
    if spec.model_type == UNIGRAM:
        model = Unigram(pieces, unk_id=spec.unk_id, byte_fallback=spec.byte_fallback)
    elif spec.model_type == BPE_MODEL:
        model = BPE(
            *_bpe_vocab_and_merges(pieces),
            unk_token=spec.unk_piece,
            fuse_unk=True,
            byte_fallback=spec.byte_fallback,
            ignore_merges=True,
        )
    else:
        raise DataError(
            f"{where}: {path} is a SentencePiece {('word', 'char')[spec.model_type == 4]} model; nxd "
            "reads Unigram and BPE models (those language models use)"
        )
    if spec.treat_whitespace_as_suffix:
        raise DataError(
            f"{where}: {path} treats whitespace as a suffix (treat_whitespace_as_suffix); nxd reads "
            "SentencePiece models whose pieces start at a space, as language models' do"
        )
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Sequence(_normalizer(rules))
    user = sorted((piece.piece for piece in proto.pieces if piece.type == USER_DEFINED), key=len, reverse=True)
    if user:
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("|".join(map(re.escape, user))), behavior="isolated")
    ids = {piece.piece: index for index, piece in enumerate(proto.pieces)}
    eod = ids.get(END_OF_DOCUMENT, spec.eos_id)
    if eod < 0:
        raise DataError(
            f"{where}: {path} has no end-of-document piece (expected {END_OF_DOCUMENT} or an eos piece, "
            "found eos_id -1)"
        )
    return tokenizer, eod, spec.bos_id if spec.bos_id >= 0 else None


def _model_proto(path: Path, where: str):  # -> sentencepiece_model_pb2.ModelProto
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError as error:
        raise DataError(
            f"{where}: reading the SentencePiece model {path} needs sentencepiece and protobuf (the "
            f"`converters` extra of nxd-data: pip install 'nxd-data[converters]'); {error}"
        ) from None
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except Exception as error:  # protobuf's DecodeError, or a runtime's own type
        raise DataError(f"{where}: {path} is not a SentencePiece model ({type(error).__name__}: {error})") from None
    if not proto.pieces:
        raise DataError(f"{where}: {path} is not a SentencePiece model (it holds no pieces)")
    return proto


def _bpe_vocab_and_merges(pieces: list[tuple[str, float]]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Every split of a piece into two pieces is a merge, ranked by the merged piece's score (sentencepiece's BPE
    merges the best-scoring pair first; ties go to the lower id)."""
    vocab = {piece: index for index, (piece, _) in enumerate(pieces)}
    ranked = [
        (-score, index, (piece[:cut], piece[cut:]))
        for index, (piece, score) in enumerate(pieces)
        for cut in range(1, len(piece))
        if piece[:cut] in vocab and piece[cut:] in vocab
    ]
    return vocab, [merge for *_, merge in sorted(ranked)]


def _normalizer(rules) -> list[normalizers.Normalizer]:
    """sentencepiece's normaliser: the character map, extra whitespace removed, the dummy prefix, spaces escaped
    (an empty text stays empty: the prefix is added only to text)."""
    steps: list[normalizers.Normalizer] = []
    if rules.precompiled_charsmap:
        steps.append(normalizers.Precompiled(rules.precompiled_charsmap))
    if rules.remove_extra_whitespaces:
        steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Replace(Regex("^ | $"), "")]
    if rules.add_dummy_prefix:
        steps.append(normalizers.Prepend(" "))
    if rules.escape_whitespaces:
        steps.append(normalizers.Replace(" ", "\u2581"))
    return steps
