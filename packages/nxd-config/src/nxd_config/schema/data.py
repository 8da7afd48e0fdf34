"""`data`: batch sizes, Megatron indexed-dataset keys, Hugging Face and alignment data, tokenizer."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator

from ._base import Section, Status, frozen_list, key

DATA = "nxd-data"
APP = "nxd-train"


def _check_blend(value: Any) -> Any:
    """A blend is one prefix, a list of prefixes, or alternating [weight, prefix, ...] pairs."""
    if isinstance(value, str):
        return value
    items = list(value)
    if not items:
        raise ValueError("expected at least one data prefix, found an empty list")
    if all(isinstance(item, str) for item in items):
        return value
    if len(items) % 2:
        raise ValueError(f"expected [weight, prefix, weight, prefix, ...] pairs, found {len(items)} items")
    for index in range(0, len(items), 2):
        weight, prefix = items[index], items[index + 1]
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight < 0:
            raise ValueError(f"expected a weight >= 0 at position {index}, found {weight!r}")
        if not isinstance(prefix, str):
            raise ValueError(f"expected a path prefix at position {index + 1}, found {prefix!r}")
    if sum(items[0::2]) <= 0:
        raise ValueError("expected at least one positive weight, found all weights 0")
    return value


Blend = Annotated[str | frozen_list(float | str), AfterValidator(_check_blend)]


class DataPrefixSplits(Section):
    train: Blend | None = key(None, "Blend for the training split.", by=DATA)
    validation: Blend | None = key(None, "Blend for the validation split.", by=DATA)
    test: Blend | None = key(None, "Blend for the test split.", by=DATA)


_NEOX_POST = "GPT-NeoX's post-training data (preprocess_data_with_chat_template.py)"


class PairDocumentFiles(Section):
    chosen: str = key(..., "Prefix of the chosen responses' token documents (the prompt and the response).", by=DATA)
    rejected: str = key(
        ..., "Prefix of the rejected responses' token documents, document i pairing chosen's i.", by=DATA
    )
    chosen_labels: str | None = key(
        None,
        "Prefix of the chosen documents' labels (one per token, -100 where nothing is trained); null trains "
        "every next token.",
        by=DATA,
    )
    rejected_labels: str | None = key(None, "Prefix of the rejected documents' labels.", by=DATA)
    chosen_reference: str | None = key(
        None,
        "Prefix of the chosen documents' precomputed reference log-probs (float32, one per token: the "
        "reference model's log-prob of the next token); with rejected_reference, no reference model runs.",
        by=DATA,
    )
    rejected_reference: str | None = key(None, "Prefix of the rejected documents' reference log-probs.", by=DATA)


class PairDocumentSplits(Section):
    train: PairDocumentFiles | None = key(None, "Training pairs.", by=DATA)
    validation: PairDocumentFiles | None = key(None, "Validation pairs.", by=DATA)
    test: PairDocumentFiles | None = key(None, "Test pairs (evaluated after training).", by=DATA)


class ExampleDocumentFiles(Section):
    documents: str = key(..., "Prefix of the examples' token documents (prompt and completion).", by=DATA)
    labels: str | None = key(
        None,
        "Prefix of their labels (one per token, -100 where nothing is trained); null trains every next token.",
        by=DATA,
    )
    rewards: str = key(
        ...,
        "Prefix of one reward per document: above 0 desirable, below undesirable (GPT-NeoX's --binary-reward "
        "writes 1 and -1); its size scales beta, and within 0.001 of 0 the example adds nothing to the loss.",
        by=DATA,
    )
    reference: str | None = key(
        None,
        "Prefix of the documents' precomputed reference log-probs (float32, one per token); no reference model runs.",
        by=DATA,
    )


class ExampleDocumentSplits(Section):
    train: ExampleDocumentFiles | None = key(None, "Training examples.", by=DATA)
    validation: ExampleDocumentFiles | None = key(None, "Validation examples.", by=DATA)
    test: ExampleDocumentFiles | None = key(None, "Test examples (evaluated after training).", by=DATA)


def _splits_to_str(value: Any) -> Any:
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def _check_splits(value: str) -> str:
    parts = [part.strip() for part in value.replace("/", ",").split(",")]
    try:
        numbers = [float(part) for part in parts]
    except ValueError:
        raise ValueError(f"expected comma-separated numbers such as '980,10,10', found {value!r}") from None
    if len(numbers) > 3 or any(number < 0 for number in numbers) or sum(numbers) <= 0:
        raise ValueError(
            f"expected up to three non-negative numbers (train,validation,test) with a positive sum, found {value!r}"
        )
    return value


class TokenizerConfig(Section):
    library: Literal["huggingface", "megatron", "sentencepiece"] = key(
        "huggingface",
        "Tokenizer family: a Hugging Face tokenizer, Megatron's GPT2BPETokenizer from vocab/merge "
        "files, or a SentencePiece model.",
        by=DATA,
        status=Status.LIMITED,
        note="huggingface (tokenizer.json, a directory with a SentencePiece tokenizer.model, or a SentencePiece "
        "model file of any name), megatron (GPT2BPETokenizer from vocab_file and merge_file, CharLevelTokenizer, "
        "TiktokenTokenizer with vocab_file a tiktoken encoding name; any other type is read as a Hugging Face "
        "tokenizer, as NeMo hands it to AutoTokenizer) and sentencepiece (the model file `model` names, giving "
        "sentencepiece's own ids)",
    )
    type: str | None = key(
        None, "Hugging Face tokenizer directory or file, or the Megatron tokenizer class name.", by=DATA
    )
    model: str | None = key(None, "SentencePiece model file (library sentencepiece).", by=DATA)
    vocab_file: str | None = key(
        None,
        "Vocabulary file (GPT-2 BPE vocab.json) of library megatron; for TiktokenTokenizer, the tiktoken "
        "encoding's name (such as cl100k_base).",
        by=DATA,
    )
    merge_file: str | None = key(None, "BPE merges file (GPT-2 merges.txt) of library megatron.", by=DATA)
    delimiter: str | None = key(
        None,
        "Column delimiter of NeMo's tabular tokenizer.",
        by=DATA,
        status=Status.LIMITED,
        note="only null: the tabular tokenizer is not supported",
    )
    sentencepiece_legacy: bool = key(
        False,
        "SentencePiece legacy mode (allows adding special tokens).",
        by=DATA,
        status=Status.LIMITED,
        note="only false: nxd adds no special tokens to a SentencePiece model",
    )
    use_fast: bool = key(
        True,
        "Prefer the Rust (fast) Hugging Face tokenizer.",
        by=DATA,
        status=Status.LIMITED,
        note="False gets a notice: nxd always reads the Rust tokenizer, which gives the same ids",
    )


_NXD = {
    "by": DATA,
    "status": Status.EXTENSION,
    "note": "QEfficient's dataset section (Hugging Face datasets by their columns)",
}


class HubDatasetConfig(Section):
    """Fine-tuning records made from the columns of a Hugging Face dataset (nxd-data's hub_records)."""

    path: str = key(
        ...,
        "A Hugging Face hub dataset id (read through datasets and its cache), a local folder laid "
        "out like a hub dataset repository, or a json / jsonl / csv / parquet file.",
        **_NXD,
    )
    name: str | None = key(None, "The dataset's configuration (load_dataset's name).", **_NXD)
    train_split: str = key("train", "The split trained on.", **_NXD)
    validation_split: str | None = key(None, "The split validated on (null: none, or split_ratio's share).", **_NXD)
    split_ratio: float | None = key(
        None,
        "When the validation split is missing: the share of the training split kept for training, the rest "
        "validating (split with the seed).",
        gt=0.0,
        lt=1.0,
        **_NXD,
    )
    seed: int | None = key(None, "Shuffle the rows with this seed first (null keeps the dataset's order).", **_NXD)
    num_samples: int | None = key(None, "Use only the first N rows of each split (after shuffling).", ge=1, **_NXD)
    drop_empty: bool = key(
        False, "Drop rows whose columns the templates read are empty or null, and rows formatted to nothing.", **_NXD
    )
    category: str | None = key(None, "Keep only the rows whose category column equals this.", **_NXD)
    kind: Literal["completion", "text", "preference"] = key(
        "completion",
        "completion: a prompt and a completion per row; text: one text per row (prompt_*), learned "
        "whole; preference: prompt, chosen and rejected columns.",
        **_NXD,
    )
    prompt_template: str | None = key(None, "The prompt as a format string over the row's columns.", **_NXD)
    completion_template: str | None = key(None, "The completion as a format string over the columns.", **_NXD)
    prompt_func: str | None = key(
        None,
        "The prompt as module:function or path/file.py:function, called with the row (the built-in Alpaca "
        "prompt: nxd_data.formatters:alpaca_prompt).",
        **_NXD,
    )
    completion_func: str | None = key(None, "The completion as module:function or path/file.py:function.", **_NXD)
    loss_on_prompt: bool = key(False, "Learn the prompt's tokens too (false: the completion and EOS only).", **_NXD)
    prompt_column: str = key("prompt", "kind preference: the prompt's column.", **_NXD)
    chosen_column: str = key("chosen", "kind preference: the chosen response's column.", **_NXD)
    rejected_column: str = key("rejected", "kind preference: the rejected response's column.", **_NXD)


class CurriculumConfig(Section):
    """DeepSpeed's sequence-length curriculum (curriculum_learning with curriculum_type seqlen)."""

    enabled: bool = key(
        False,
        "Train the first steps on the first tokens of each sample only (the rest of each "
        "sample is dropped, the data position advances as usual), the length growing as schedule "
        "says; logged as curriculum_seqlen. Validation reads whole samples.",
        by=APP,
        status=Status.EXTENSION,
        note="from DeepSpeed's curriculum_learning",
    )
    schedule: Literal["fixed_linear", "fixed_root", "fixed_discrete"] = key(
        "fixed_linear",
        "fixed_linear: from min_length to max_length over total_steps; fixed_root: the same along "
        "(step / total_steps) ** (1 / root_degree); fixed_discrete: lengths[i] until a step past max_steps[i].",
        by=DATA,
        status=Status.EXTENSION,
        note="DeepSpeed's schedule_type",
    )
    min_length: int = key(
        8,
        "The first length (fixed_discrete: lengths[0]).",
        by=DATA,
        ge=1,
        status=Status.EXTENSION,
        note="DeepSpeed's min_difficulty",
    )
    max_length: int | None = key(
        None,
        "The last length; null: data.seq_length.",
        by=DATA,
        ge=1,
        status=Status.EXTENSION,
        note="DeepSpeed's max_difficulty",
    )
    total_steps: int = key(
        1,
        "Optimizer steps from min_length to max_length (fixed_linear, fixed_root).",
        by=DATA,
        ge=1,
        status=Status.EXTENSION,
        note="DeepSpeed's total_curriculum_step",
    )
    length_step: int = key(
        8,
        "Lengths are rounded down to multiples of it (fixed_linear, fixed_root).",
        by=DATA,
        ge=1,
        status=Status.EXTENSION,
        note="DeepSpeed's difficulty_step",
    )
    root_degree: int = key(
        1,
        "fixed_root's degree (2: square root).",
        by=DATA,
        ge=1,
        status=Status.EXTENSION,
        note="DeepSpeed's root_degree",
    )
    lengths: frozen_list(int) = key(
        (),
        "fixed_discrete: the lengths in order.",
        by=DATA,
        status=Status.EXTENSION,
        note="DeepSpeed's schedule_config.difficulty",
    )
    max_steps: frozen_list(int) = key(
        (),
        "fixed_discrete: the last step of each length but the last (one fewer than lengths).",
        by=DATA,
        status=Status.EXTENSION,
        note="DeepSpeed's schedule_config.max_step",
    )


class DataConfig(Section):
    # --- common to every data module
    micro_batch_size: int = key(1, "Samples per forward/backward pass on one data-parallel rank.", by=APP, ge=1)
    global_batch_size: int | None = key(
        None,
        "Samples per optimizer step over all ranks; sets gradient accumulation. Null means "
        "micro_batch_size * data-parallel size (no accumulation).",
        by=APP,
        ge=1,
    )
    seq_length: int | None = key(
        None,
        "Tokens per sample; for DPO/ORPO prompt + response. Null uses model.encoder_seq_length.",
        by=DATA,
        ge=1,
    )
    num_workers: int = key(0, "DataLoader worker processes per rank.", by=DATA, ge=0)
    curriculum: CurriculumConfig = key(
        CurriculumConfig(),
        "Sequence-length warm-up.",
        by=APP,
        status=Status.EXTENSION,
        note="from DeepSpeed's curriculum_learning",
    )
    tokenizer: TokenizerConfig | None = key(None, "Tokenizer used to read or prepare text data.", by=DATA)
    # --- Megatron indexed datasets
    data_prefix: Blend | DataPrefixSplits | None = key(
        None,
        "Indexed dataset prefix(es): a path, [w1, p1, w2, p2, ...] blended by weight, a list of paths "
        "(blended by token count), or {train, validation, test}.",
        by=DATA,
    )
    label_prefixes: dict[str, str] | None = key(
        None,
        "Data prefix -> the prefix of its label file: an indexed dataset of the same documents holding each "
        "token's label, read in place of the shifted tokens (a negative label, -100, is not trained on).",
        by=DATA,
        status=Status.EXTENSION,
        note="GPT-NeoX's train/valid/test_label_data_paths",
    )
    pair_documents: PairDocumentSplits | None = key(
        None,
        "DPO, ORPO or reward-model pairs as pre-tokenised indexed documents, per split: chosen and rejected token "
        "files (document i of each is a pair), optional label and reference log-prob files. One document a row "
        "(pack_impl: unpacked); longer than seq_length + 1 tokens: cut, or with allow_chopped false left out. A "
        "reward model reads its score at each row's last trained position.",
        by=DATA,
        status=Status.EXTENSION,
        note=_NEOX_POST + ": pos/neg_*_data_paths and their label paths",
    )
    example_documents: ExampleDocumentSplits | None = key(
        None,
        "KTO examples as pre-tokenised indexed documents, per split: a token file, a reward file (one value per "
        "document), optional label and reference log-prob files; one document a row, as pair_documents.",
        by=DATA,
        status=Status.EXTENSION,
        note=_NEOX_POST + ": *_data_paths, *_label_data_paths, *_reward_data_paths",
    )
    blend_by_documents: float | None = key(
        None,
        "Weight the prefixes of each data_prefix blend by their document counts n (N in all) instead of the listed "
        "weights: p = (n/N)^alpha normalised, times 1 - n/N, normalised again; this is alpha.",
        by=DATA,
        status=Status.EXTENSION,
        ge=0.0,
        note="GPT-NeoX's weight_by_num_documents with weighted_sampler_alpha",
    )
    pack_impl: Literal["packed", "pack_until_overflow", "unpacked"] = key(
        "packed",
        "How samples are cut from data_prefix's documents: packed, one stream cut every seq_length tokens across "
        "documents; pack_until_overflow, shuffled whole documents joined while they fit, the one that would "
        "overflow starting the next sample; unpacked, one document a sample. Short samples are padded with labels "
        "not trained on.",
        by=DATA,
        status=Status.EXTENSION,
        note="GPT-NeoX's pack_impl",
    )
    allow_chopped: bool = key(
        True,
        "With pack_impl pack_until_overflow or unpacked, a document longer than seq_length + 1 tokens is cut to "
        "them; false: it is left out.",
        by=DATA,
        status=Status.EXTENSION,
        note="GPT-NeoX's allow_chopped",
    )
    index_mapping_dir: str | None = key(
        None, "Where the sample/shuffle index files are cached; null: an index-cache folder next to the data.", by=DATA
    )
    data_impl: Literal["mmap", "cached", "infer"] = key(
        "mmap",
        "Indexed dataset format: mmap, the memory-mapped format Megatron-LM and GPT-NeoX write (magic MMIDIDX); "
        "cached, the older indexed format (magic TNTIDX) as GPT-NeoX's IndexedCachedDataset reads it; infer, "
        "either, by each file's magic. A file of the other format is an error naming it.",
        by=DATA,
    )
    splits_string: Annotated[str, BeforeValidator(_splits_to_str), AfterValidator(_check_splits)] = key(
        "980,10,10", "Train,validation,test proportions of a single-blend dataset.", by=DATA
    )
    skip_warmup: bool = key(True, "Skip paging the memory-mapped index in before training.", by=DATA)
    dataloader_type: Literal["single", "cyclic"] = key(
        "single",
        "single: one pass in order of the shuffle index (Hugging Face and SFT data: one seeded shuffle, the same "
        "every epoch); cyclic: reshuffle each epoch.",
        by=DATA,
    )
    reset_position_ids: bool = key(False, "Restart position ids after each end-of-document token.", by=DATA)
    reset_attention_mask: bool = key(False, "Stop attention across end-of-document tokens.", by=DATA)
    eod_mask_loss: bool = key(False, "Exclude end-of-document tokens from the loss.", by=DATA)
    validation_drop_last: bool = key(True, "Drop the last partial validation batch.", by=DATA)
    no_seqlen_plus_one_input_tokens: bool = key(
        False, "Read seq_length tokens per sample (last label masked) instead of seq_length + 1.", by=DATA
    )
    pad_samples_to_global_batch_size: bool = key(
        False,
        "Pad the last partial validation/test global batch (validation_drop_last: False) to full size with "
        "samples that add nothing to the loss, so every micro-batch has the same shape.",
        by=DATA,
    )
    # --- Hugging Face and alignment data
    train_dir: str | None = key(
        None,
        "Training data: a datasets.save_to_disk folder, or a jsonl, arrow or parquet file (text or input_ids "
        "rows to pretrain on; input/output or messages records to fine-tune on, where jsonl may be .gz or .zst).",
        by=DATA,
    )
    val_dir: str | None = key(None, "Validation data, in the same forms as train_dir.", by=DATA)
    dev_choose_samples: int | None = key(
        None, "Use only the first N records of the data; null uses all.", by=DATA, ge=1
    )
    group_by_length: bool = key(
        False,
        "Draw fine-tuning records grouped by length (megabatches of up to 50 global batches in the shuffled "
        "order, each sorted longest first), so a micro-batch pads little; padded records only.",
        by=DATA,
        status=Status.EXTENSION,
        note="transformers' group_by_length",
    )
    dataset: HubDatasetConfig | None = key(
        None,
        "Fine-tuning records from a Hugging Face dataset's columns, for training and validation (instead of "
        "train_dir / val_dir).",
        by=DATA,
        status=Status.EXTENSION,
        note="QEfficient's dataset section (Hugging Face datasets by their columns)",
    )
    use_sft_style_data_module: bool = key(
        False, "Read train_dir/val_dir (Hugging Face style) even when data_prefix is set.", by=DATA
    )
