"""Online RL's data: the prompts of data.train_dir (and val_dir) records, each sample one prompt whose group of
completions a step samples; the tokenizer stays with them (the rollouts decode completions and render rewards)."""

from __future__ import annotations

from pathlib import Path

from nxd_config.schema.alignment import GRPOConfig
from nxd_config.schema.data import DataConfig
from nxd_data import prompt_dataset

from nxd_train.run.data_splits import DataSplits, record_splits
from nxd_train.run.tokenizers import configured_tokenizer


def prompt_splits(
    data: DataConfig, seq_length: int, cache_dir: Path, grpo: GRPOConfig, trust_remote_code: bool
) -> DataSplits:
    tokenizer = configured_tokenizer(data, trust_remote_code)
    room = seq_length - grpo.max_new_tokens
    splits = {
        key: prompt_dataset(
            location,
            key,
            split,
            tokenizer,
            room=room,
            field=grpo.prompt_field,
            limit=data.dev_choose_samples,
        )
        for key, split, location in (
            ("data.train_dir", "train", data.train_dir),
            ("data.val_dir", "validation", data.val_dir),
        )
        if location is not None
    }
    notes = tuple(
        f"{key}: {len(dataset):,} prompts (longest {max(dataset.lengths())} tokens), {grpo.num_generations} "
        f"completions of up to {grpo.max_new_tokens} token{'s' if grpo.max_new_tokens != 1 else ''} each a step"
        for key, dataset in splits.items()
    )
    return record_splits(
        splits,
        tokenizer,
        data.tokenizer.type,
        cache_dir,
        notes,
        rows_per_sample=grpo.num_generations,
        text_tokenizer=tokenizer,
    )
