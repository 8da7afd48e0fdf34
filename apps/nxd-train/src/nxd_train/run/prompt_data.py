"""Online RL's data: the prompts of data.train_dir (and val_dir) records, each sample one prompt whose group of
completions a step samples; the tokenizer stays with them (the rollouts decode completions and render rewards)."""

from __future__ import annotations

from pathlib import Path

from nxd_config.schema.alignment import GRPOConfig
from nxd_config.schema.data import DataConfig
from nxd_data import DataError, PromptDataset, TextTokenizer, document_prompts, prompt_dataset

from nxd_train.run.data_splits import DataSplits, record_splits
from nxd_train.run.tokenizers import configured_tokenizer


def prompt_splits(
    data: DataConfig, seq_length: int, cache_dir: Path, grpo: GRPOConfig, trust_remote_code: bool
) -> DataSplits:
    """The prompts of data.train_dir (and val_dir) records, or of data.data_prefix's documents with their
    data.label_prefixes (one prefix a split: GPT-NeoX's post-training files)."""
    tokenizer = configured_tokenizer(data, trust_remote_code)
    room = seq_length - grpo.max_new_tokens
    if data.train_dir is not None:
        splits = {
            split: prompt_dataset(
                location, key, split, tokenizer, room=room, field=grpo.prompt_field, limit=data.dev_choose_samples
            )
            for key, split, location in (
                ("data.train_dir", "train", data.train_dir),
                ("data.val_dir", "validation", data.val_dir),
            )
            if location is not None
        }
    else:
        splits = _document_splits(data, tokenizer, room)
    notes = tuple(
        f"{split} prompts: {len(dataset):,} (longest {max(dataset.lengths())} tokens), {grpo.num_generations} "
        f"completions of up to {grpo.max_new_tokens} token{'s' if grpo.max_new_tokens != 1 else ''} each"
        for split, dataset in splits.items()
    )
    return record_splits(
        splits["train"],
        splits.get("validation"),
        tokenizer,
        data.tokenizer.type,
        cache_dir,
        notes,
        test=splits.get("test"),
        rows_per_sample=grpo.num_generations,
        text_tokenizer=tokenizer,
    )


def _document_splits(data: DataConfig, tokenizer: TextTokenizer, room: int) -> dict[str, PromptDataset]:
    """Each split of data.data_prefix (a dict of splits, or one blend for training) as prompts of its documents."""
    by_split = hasattr(data.data_prefix, "model_dump")
    prefixes = data.data_prefix.model_dump() if by_split else {"train": data.data_prefix}
    labels = dict(data.label_prefixes or {})
    splits = {}
    for split, blend in prefixes.items():
        if blend is None:
            continue
        names = [item for item in ([blend] if isinstance(blend, str) else blend) if isinstance(item, str)]
        key = f"data.data_prefix.{split}" if by_split else "data.data_prefix"
        if len(names) != 1 or names[0] not in labels:
            raise DataError(
                f"{key}: expected one prefix with its label documents in data.label_prefixes for GRPO's prompts (a "
                f"blend's weights would not apply), found {', '.join(names) or 'none'}"
                + ("" if len(names) != 1 else " without labels")
            )
        splits[split] = document_prompts(
            names[0], labels[names[0]], key, split, tokenizer, room=room, limit=data.dev_choose_samples
        )
    return splits
