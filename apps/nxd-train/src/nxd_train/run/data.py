"""The dataset factory: what `data.*` asks for, as train / validation / test datasets (nxd-data).

Fine-tuning reads SFT records (`model_alignment_strategy.sft`), preference pairs (`dpo`, `orpo`,
`reward_model`) or KTO examples (`kto`) from `train_dir` / `val_dir`, or pairs and KTO examples as
pre-tokenised documents (`pair_documents`, `example_documents`: GPT-NeoX's post-training files).
Pretraining has three sources, in this order: Megatron indexed data (`data_prefix`), Hugging Face data
(`train_dir`, `val_dir`), or — when a run names neither — the built-in corpus, preprocessed once into
an indexed dataset in the cache and then read exactly like `data_prefix` data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock
from nxd_config.schema.alignment import DPOConfig, GRPOConfig, KTOConfig, ORPOConfig, RewardModelConfig, SFTConfig
from nxd_config.schema.data import DataConfig
from nxd_data import (
    DataError,
    DocumentFiles,
    ExampleDocuments,
    HubDataset,
    IndexedDatasetWriter,
    MegatronDataBuilder,
    PairDocuments,
    RecordForm,
    SampleFormat,
    TextTokenizer,
    formatted_splits,
    hf_pretraining_dataset,
    kto_dataset,
    load_tokenizer,
    preference_dataset,
    sft_dataset,
    token_dtype,
)

from nxd_train.run.corpus import Corpus, builtin_tokenizer, names_data, stdlib_corpus
from nxd_train.run.data_splits import DataSplits, record_splits
from nxd_train.run.prompt_data import prompt_splits
from nxd_train.run.tokenizers import configured_tokenizer


def _builtin_prefix(corpus: Corpus, tokenizer: TextTokenizer, cache_dir: Path) -> str:
    """The built-in corpus as an indexed dataset (one document per source file, each ended by the
    end-of-document token), written once per corpus and tokenizer."""
    prefix = cache_dir / f"stdlib-{corpus.key}-{tokenizer.fingerprint}"
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{prefix}.lock"):
        if not Path(f"{prefix}.idx").exists():
            with IndexedDatasetWriter(prefix, token_dtype(tokenizer.vocab_size)) as writer:
                for ids in tokenizer.encode(corpus.documents):
                    writer.add_document(ids + [tokenizer.eod_id])
    return str(prefix)


@dataclass(frozen=True)
class ModelVocabulary:
    """What pre-tokenised data needs of a tokenizer, read from the model's config.json instead."""

    size: int
    eod_id: int
    source: str
    """The file it was read from (named in the log and in errors)."""


def build_datasets(
    data: DataConfig,
    seq_length: int,
    cache_dir: Path,
    *,
    train_samples: int | None,
    seed: int,
    sft: SFTConfig | None = None,
    preference: DPOConfig | ORPOConfig | KTOConfig | RewardModelConfig | None = None,
    grpo: GRPOConfig | None = None,
    vocabulary: ModelVocabulary | None = None,
    trust_remote_code: bool = False,
) -> DataSplits:
    """The run's datasets (SFT records when `sft` is given, preference pairs with `preference`, prompts with `grpo`);
    `train_samples` None means one epoch of the training data. Pre-tokenised Hugging Face data with
    no tokenizer takes its vocabulary and end-of-document id from `vocabulary` (the model's). A tokenizer
    folder's own code runs only with `trust_remote_code`. DataError names the key and file of any problem."""
    if data.dataset is not None:
        data = _with_dataset_records(data, cache_dir)
    if grpo is not None:
        return prompt_splits(data, seq_length, cache_dir, grpo, trust_remote_code)
    if sft is not None:
        return _sft_splits(data, seq_length, cache_dir, sft.packing, trust_remote_code)
    if preference is not None:
        if data.pair_documents is not None or data.example_documents is not None:
            return _document_splits(data, seq_length, preference, trust_remote_code)
        return _preference_splits(data, seq_length, preference, trust_remote_code)
    own_data = names_data(data)
    corpus = None if own_data else stdlib_corpus()  # read once: its digest names the cached files
    hf_data = data.train_dir is not None and (data.use_sft_style_data_module or not data.is_set("data_prefix"))
    if data.tokenizer is not None:
        tokenizer, name = configured_tokenizer(data, trust_remote_code), data.tokenizer.type
    elif hf_data and vocabulary is not None:
        return _pre_tokenised_splits(data, seq_length, vocabulary, cache_dir / "hf-data")
    elif own_data:
        key = "data_prefix" if data.is_set("data_prefix") else "train_dir"
        also = " or, for pre-tokenised data, a Hugging Face model (model.model_config)" if hf_data else ""
        raise DataError(
            f"data.tokenizer: expected a tokenizer with data.{key} (it gives the vocabulary size and the "
            f"end-of-document id){also}, found none"
        )
    else:
        tokenizer = load_tokenizer(builtin_tokenizer(corpus, cache_dir))
        name = f"the built-in corpus (Python's standard library), its BPE of {tokenizer.vocab_size} tokens"
    format = _sample_format(data, seq_length, tokenizer.eod_id, tokenizer.vocab_size)
    if hf_data:
        hf_cache = cache_dir / "hf-data"
        train = hf_pretraining_dataset(
            data.train_dir, "data.train_dir", "train", format, tokenizer, hf_cache, data.dev_choose_samples
        )
        validation = None
        if data.val_dir is not None:
            validation = hf_pretraining_dataset(
                data.val_dir, "data.val_dir", "validation", format, tokenizer, hf_cache, data.dev_choose_samples
            )
        return DataSplits(
            train,
            validation,
            None,
            format.padding(),
            tokenizer.vocab_size,
            name,
            shuffled=False,
            tokenizer_files=tokenizer.export_files(cache_dir / "tokenizers"),
            tokenizer_fingerprint=tokenizer.fingerprint,
        )
    if data.is_set("data_prefix"):
        prefix, index_dir = _plain(data.data_prefix), data.index_mapping_dir
    else:
        prefix, index_dir = _builtin_prefix(corpus, tokenizer, cache_dir), str(cache_dir / "index-cache")
    builder = MegatronDataBuilder(
        format,
        seed,
        Path(index_dir) if index_dir else None,
        warmup=not data.skip_warmup,
        documents_alpha=data.blend_by_documents,
        labels=_labels(data, prefix),
        packing=data.pack_impl,
        allow_chopped=data.allow_chopped,
        impl=data.data_impl,
    )
    splits = builder.build(prefix, data.splits_string, [train_samples, None, None])
    if splits["train"] is None:
        raise DataError(f"data.splits_string: {data.splits_string!r} leaves no documents for training")
    files = tokenizer.export_files(cache_dir / "tokenizers")
    return DataSplits(
        splits["train"],
        splits["validation"],
        splits["test"],
        format.padding(),
        tokenizer.vocab_size,
        name,
        shuffled=True,
        tokenizer_files=files,
        tokenizer_fingerprint=tokenizer.fingerprint,
    )


def _with_dataset_records(data: DataConfig, cache_dir: Path) -> DataConfig:
    """`data` reading the records made from data.dataset's columns as its train_dir / val_dir."""
    spec = data.dataset
    source = HubDataset(
        spec.path,
        spec.name,
        spec.train_split,
        spec.validation_split,
        spec.split_ratio,
        spec.seed,
        spec.num_samples,
        spec.drop_empty,
        spec.category,
    )
    form = RecordForm(
        spec.kind,
        spec.prompt_template,
        spec.completion_template,
        spec.prompt_func,
        spec.completion_func,
        spec.loss_on_prompt,
        spec.prompt_column,
        spec.chosen_column,
        spec.rejected_column,
    )
    files = formatted_splits(source, form, cache_dir / "dataset-records", "data.dataset")
    return data.model_copy(
        update={
            "train_dir": str(files["train"]),
            "val_dir": str(files.get("validation")) if "validation" in files else None,
        }
    )


def _labels(data: DataConfig, prefix: Any) -> dict[str, str]:
    """data.label_prefixes, each key one of data_prefix's prefixes (else a DataError naming it)."""
    labels = dict(data.label_prefixes or {})
    blends = prefix.values() if isinstance(prefix, dict) else [prefix]
    known = {
        item
        for blend in blends
        if blend is not None
        for item in ([blend] if isinstance(blend, str) else blend)
        if isinstance(item, str)
    }
    if unknown := sorted(set(labels) - known):
        raise DataError(
            f"data.label_prefixes: {unknown[0]!r} is not a prefix of data.data_prefix; expected labels "
            f"for the data prefixes ({', '.join(sorted(known))})"
        )
    return labels


def _sample_format(data: DataConfig, seq_length: int, eod_id: int, vocab_size: int | None = None) -> SampleFormat:
    return SampleFormat(
        seq_length=seq_length,
        eod_id=eod_id,
        plus_one=not data.no_seqlen_plus_one_input_tokens,
        eod_mask_loss=data.eod_mask_loss,
        reset_position_ids=data.reset_position_ids,
        reset_attention_mask=data.reset_attention_mask,
        vocab_size=vocab_size,
    )


def _pre_tokenised_splits(
    data: DataConfig, seq_length: int, vocabulary: ModelVocabulary, cache_dir: Path
) -> DataSplits:
    """Hugging Face rows of token ids with no tokenizer (NxDT's HF recipes): ids checked against the
    model's vocabulary, end-of-document id from its config.json."""
    format = _sample_format(data, seq_length, vocabulary.eod_id)
    splits = {}
    for key, split, location in (
        ("data.train_dir", "train", data.train_dir),
        ("data.val_dir", "validation", data.val_dir),
    ):
        if location is not None:
            splits[split] = hf_pretraining_dataset(
                location, key, split, format, None, cache_dir, data.dev_choose_samples, vocab_size=vocabulary.size
            )
    name = f"pre-tokenised ids (vocabulary {vocabulary.size}, end of document {vocabulary.eod_id}: {vocabulary.source})"
    return DataSplits(
        splits["train"], splits.get("validation"), None, format.padding(), vocabulary.size, name, shuffled=False
    )


def _sft_splits(
    data: DataConfig, seq_length: int, cache_dir: Path, packing: bool, trust_remote_code: bool
) -> DataSplits:
    """SFT records of train_dir (and val_dir), padded or packed into rows of seq_length."""
    tokenizer = configured_tokenizer(data, trust_remote_code)
    splits = {}
    for key, split, location in (
        ("data.train_dir", "train", data.train_dir),
        ("data.val_dir", "validation", data.val_dir),
    ):
        if location is not None:
            splits[key] = sft_dataset(
                location,
                key,
                split,
                tokenizer,
                seq_length,
                packing=packing,
                cache_dir=cache_dir / "sft",
                limit=data.dev_choose_samples,
            )
    notes = tuple(dataset.summary(key) for key, dataset in splits.items())
    return record_splits(
        splits["data.train_dir"],
        splits.get("data.val_dir"),
        tokenizer,
        data.tokenizer.type,
        cache_dir,
        notes,
        padded_rows=not packing,
    )


def _preference_splits(
    data: DataConfig,
    seq_length: int,
    preference: DPOConfig | ORPOConfig | KTOConfig | RewardModelConfig,
    trust_remote_code: bool,
) -> DataSplits:
    """Preference pairs (DPO, ORPO, reward models, which also read where each row's score is and the
    pair's margin) or KTO examples of train_dir (and val_dir), one sample each, of two sequences (a
    pair; an example and its KL sequence)."""
    tokenizer = configured_tokenizer(data, trust_remote_code)
    kto = isinstance(preference, KTOConfig)
    splits, notes = {}, []
    for key, split, location in (
        ("data.train_dir", "train", data.train_dir),
        ("data.val_dir", "validation", data.val_dir),
    ):
        if location is None:
            continue
        cut = {
            "max_prompt_length": preference.max_prompt_length,
            "truncation_mode": preference.truncation_mode,
            "limit": data.dev_choose_samples,
        }
        if kto:
            dataset = kto_dataset(location, key, split, tokenizer, seq_length, need_both=split == "train", **cut)
            notes.append(
                f"{key}: {len(dataset)} KTO examples, {dataset.desirable} desirable and "
                f"{len(dataset) - dataset.desirable} undesirable ({dataset.truncated} truncated to "
                f"seq_length {seq_length})"
            )
        else:
            dataset = preference_dataset(
                location, key, split, tokenizer, seq_length, scores=isinstance(preference, RewardModelConfig), **cut
            )
            notes.append(
                f"{key}: {len(dataset)} preference pairs ({dataset.truncated} truncated to seq_length {seq_length})"
            )
        splits[key] = dataset
    train = splits["data.train_dir"]
    return DataSplits(
        train,
        splits.get("data.val_dir"),
        None,
        train.padding(),
        tokenizer.vocab_size,
        data.tokenizer.type,
        shuffled=False,
        notes=tuple(notes),
        tokenizer_files=tokenizer.files,
        tokenizer_fingerprint=tokenizer.fingerprint,
        rows_per_sample=2,
        trained_rows_per_sample=1 if kto else None,
        pad_id=tokenizer.eod_id,
        packed_pairs=isinstance(preference, RewardModelConfig) and preference.packing,
    )


def _document_splits(
    data: DataConfig,
    seq_length: int,
    preference: DPOConfig | ORPOConfig | KTOConfig | RewardModelConfig,
    trust_remote_code: bool,
) -> DataSplits:
    """Pairs (data.pair_documents) or KTO examples (data.example_documents) from pre-tokenised indexed
    documents, one document a row."""
    tokenizer = configured_tokenizer(data, trust_remote_code)
    kto, scores = data.example_documents is not None, isinstance(preference, RewardModelConfig)
    sections = data.example_documents if kto else data.pair_documents
    name = "example_documents" if kto else "pair_documents"
    shared = {
        "seq_length": seq_length,
        "pad_id": tokenizer.eod_id,
        "allow_chopped": data.allow_chopped,
        "vocab_size": tokenizer.vocab_size,
    }
    splits, notes, impl = {}, [], data.data_impl
    for split in ("train", "validation", "test"):
        if (files := getattr(sections, split)) is None:
            continue
        where = f"data.{name}.{split}"
        if kto:
            dataset = ExampleDocuments(
                DocumentFiles(files.documents, files.labels, files.reference, where, impl),
                files.rewards,
                rewards_where=f"{where}.rewards",
                **shared,
            )
            if split == "train" and not (dataset.desirable and dataset.undesirable):
                raise DataError(
                    f"{where}.rewards: KTO learns from both kinds of example; expected desirable (reward "
                    f"above 0) and undesirable (below 0) documents, found {dataset.desirable} desirable "
                    f"and {dataset.undesirable} undesirable"
                )
            neutral = len(dataset) - dataset.desirable - dataset.undesirable
            notes.append(
                f"{where}: {len(dataset)} KTO examples, {dataset.desirable} desirable, {dataset.undesirable} "
                f"undesirable" + (f", {neutral} with reward 0 (no loss)" if neutral else "")
            )
        else:
            dataset = PairDocuments(
                DocumentFiles(files.chosen, files.chosen_labels, files.chosen_reference, where, impl),
                DocumentFiles(files.rejected, files.rejected_labels, files.rejected_reference, where, impl),
                scores=scores,
                **shared,
            )
            notes.append(f"{where}: {len(dataset)} preference pairs")
        long = "" if data.allow_chopped else "longer than seq_length + 1 tokens or "
        kind = "examples" if kto else "pairs"
        notes[-1] += (
            f" ({dataset.left_out} {kind} left out: {long}nothing to train on; {dataset.truncated} "
            f"documents cut to seq_length + 1 tokens)"
        )
        splits[split] = dataset
    train = splits["train"]
    if scores:
        notes.append(
            f"data.{name}: the score is read at each row's last labelled position (GPT-NeoX's --for-rm: the "
            "first of the two appended end-of-document tokens); the exported classifier names no "
            "pad_token_id, so transformers reads its last token: score a conversation followed by one "
            "end-of-document token"
        )
    return DataSplits(
        train,
        splits.get("validation"),
        splits.get("test"),
        train.padding(),
        tokenizer.vocab_size,
        data.tokenizer.type,
        shuffled=False,
        notes=tuple(notes),
        tokenizer_files=tokenizer.files,
        tokenizer_fingerprint=tokenizer.fingerprint,
        rows_per_sample=1 if kto else 2,
        pad_id=None if scores else tokenizer.eod_id,
        reference_in_data=train.carries_reference,
        packed_pairs=scores and preference.packing,
    )


def _plain(value):
    """A config value as plain str / list / dict (the schema keeps lists frozen and sections as models)."""
    if hasattr(value, "model_dump"):
        return {split: _plain(blend) for split, blend in value.model_dump().items()}
    return value if value is None or isinstance(value, str) else list(value)
