"""The data keys nxd cannot act on for this run (a pretraining key in a fine-tuning run, a tokenizer key of
another library, two data sources), and pretraining keys set without the data they describe."""

from __future__ import annotations

from nxd_config.schema.data import DataConfig

from nxd_train.run.corpus import names_data

PRETRAINING_FLAGS = ("reset_position_ids", "reset_attention_mask", "eod_mask_loss", "no_seqlen_plus_one_input_tokens")
"""Megatron data flags that shape pretraining samples; SFT records set their own masks and positions."""

DATA_COMPANIONS = ("tokenizer", "val_dir", "label_prefixes", "index_mapping_dir")
"""Keys that describe a run's own data: with no data source beside them, the run has forgotten its data (the built-in
corpus is for configs that name none)."""


def data_left_out(data: DataConfig, fine_tuning: bool = False) -> list[str]:
    """One message per key describing pretraining data when the config names no data source (it forgot its data;
    nxd trains on the built-in corpus only when a config names no data at all)."""
    if fine_tuning or names_data(data):
        return []
    return [
        f"data.{name}: set without data to train on; expected data.data_prefix (Megatron indexed data) or "
        "data.train_dir (Hugging Face data) beside it, found neither (nxd trains on its built-in corpus only "
        "when a config names no data at all)"
        for name in DATA_COMPANIONS
        if getattr(data, name) is not None and data.is_set(name)
    ]


def unavailable_data_keys(data: DataConfig, fine_tuning: bool = False, documents: bool = False) -> list[str]:
    """One message per data key whose value nxd cannot act on (never a silent no-op); `documents`: a fine-tuning run
    that reads pre-tokenised documents with their label documents (online RL's prompts) rather than records."""
    messages = []
    if fine_tuning and not documents:
        messages += [
            f"data.{name}: applies to pretraining data (Megatron indexed datasets); fine-tuning reads "
            f"data.train_dir; expected it unset, found {getattr(data, name)!r}"
            for name in ("data_prefix", "splits_string", "index_mapping_dir")
            if data.is_set(name) and getattr(data, name) is not None
        ]
        messages += [
            f"data.{name}: applies to pretraining samples; fine-tuning records carry their own masks and "
            "positions (packing keeps each record apart); expected False, found True"
            for name in PRETRAINING_FLAGS
            if getattr(data, name)
        ]
        if data.tokenizer is None:
            messages.append(
                "data.tokenizer: expected the tokenizer of the model being fine-tuned (a tokenizer.json "
                "file or a directory holding one), found none"
            )
    if (t := data.tokenizer) is not None:
        if t.library == "sentencepiece":
            if t.model is None:
                messages.append(
                    "data.tokenizer.model: expected the SentencePiece model file of library sentencepiece, found none"
                )
            if t.type is not None:
                messages.append(
                    f"data.tokenizer.type: library sentencepiece reads data.tokenizer.model; expected "
                    f"type unset, found {t.type!r}"
                )
        elif t.type is None:
            messages.append(
                "data.tokenizer.type: expected a tokenizer.json file, a tokenizer directory or (library "
                "megatron) GPT2BPETokenizer, CharLevelTokenizer or TiktokenTokenizer, found "
                "null"
            )
        foreign = [] if t.library == "sentencepiece" else [("model", t.model, "library sentencepiece")]
        if t.sentencepiece_legacy:
            messages.append(
                "data.tokenizer.sentencepiece_legacy: expected False: nxd adds no special tokens to a "
                "SentencePiece model (legacy mode's purpose), found True"
            )
        if t.library != "megatron":
            foreign += [(name, getattr(t, name), "library megatron") for name in ("vocab_file", "merge_file")]
        elif t.type in ("CharLevelTokenizer", "TiktokenTokenizer"):
            foreign.append(("merge_file", t.merge_file, "GPT2BPETokenizer"))
            if t.type == "CharLevelTokenizer":
                foreign.append(("vocab_file", t.vocab_file, "GPT2BPETokenizer and TiktokenTokenizer"))
        messages += [
            f"data.tokenizer.{name}: applies to {library}, which this tokenizer is not; expected it unset, "
            f"found {value!r}"
            for name, value, library in foreign
            if value is not None
        ]
    if (
        data.is_set("data_prefix")
        and data.train_dir is not None
        and not (data.use_sft_style_data_module or fine_tuning)
    ):
        messages.append(
            "data.train_dir: expected one data source, found data_prefix as well (set "
            "use_sft_style_data_module: True to read train_dir)"
        )
    if data.use_sft_style_data_module and data.train_dir is None:
        messages.append("data.use_sft_style_data_module: expected data.train_dir to read, found none")
    return messages
