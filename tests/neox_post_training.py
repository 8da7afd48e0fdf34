"""GPT-NeoX post-training data as its `tools/datasets/preprocess_data_with_chat_template.py` writes it,
for tests: its `build_chat` rules (the turns' tokens from transformers' chat template; labels -100 on
what is not trained; `--only-last`, `--for-rm`, `--reward-key` with `--binary-reward`), written as int32
indexed documents `{prefix}_{key}_document`, `{prefix}_{key}_label_document` and
`{prefix}_{key}_reward_document`, and the folders the post-training configs name (a converted model to
fine-tune with its tokenizer)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
from nxd_data import IndexedDatasetWriter
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from tests.training_runs import preference_records

IGNORE = -100


def _ids(tokenizer, chat: list[dict], generation_prompt: bool = False) -> list[int]:
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def build_chat(tokenizer, chat: list[dict], *, only_last: bool = False, for_rm: bool = False) -> tuple[list, list]:
    """NeoX's build_chat (apply_mask on, generation role assistant)."""
    if for_rm:
        tokens = _ids(tokenizer, chat)
        return tokens + [tokenizer.eos_token_id] * 2, [IGNORE] * (len(tokens) + 1) + [tokenizer.eos_token_id]
    tokens, mask = [], []
    for index, turn in enumerate(chat):
        follows = index < len(chat) - 1 and chat[index + 1]["role"] == "assistant"
        new = _ids(tokenizer, chat[: index + 1], generation_prompt=follows)[len(tokens) :]
        tokens += new
        trained = turn["role"] == "assistant" and not (only_last and index != len(chat) - 1)
        mask += new if trained else [IGNORE] * len(new)
    mask.append(tokenizer.eos_token_id if mask[-1] != IGNORE else IGNORE)
    tokens.append(tokenizer.eos_token_id)
    return tokens, mask


def write(prefix: Path, key: str, rows: list[tuple[list, list, list | None]]) -> None:
    """`rows` (tokens, labels, reward or None) as NeoX's int32 files of `key`."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    kinds = ["", "_label"] + (["_reward"] if rows[0][2] is not None else [])
    for position, kind in enumerate(kinds):
        with IndexedDatasetWriter(f"{prefix}_{key}{kind}_document", np.int32) as writer:
            for row in rows:
                writer.add_document(row[position])


def conversations(count: int, seed: int) -> list[dict]:
    """Preference records (the chosen response sorts the prompt's words) as NeoX's chat data."""
    records = []
    for record in preference_records(count, seed):
        user = {"role": "user", "content": record["prompt"]}
        records.append(
            {
                "chosen": [user, {"role": "assistant", "content": record["chosen"]}],
                "rejected": [user, {"role": "assistant", "content": record["rejected"]}],
            }
        )
    return records


def write_post_training_data(root: Path, tokenizer_dir: Path, count: int = 48) -> None:
    """The data folders of NeoX's four post-training configs, under `root`, as its README's commands
    write them: sft (messages), pairwise DPO (--only-last) and RM (--for-rm), KTO (--reward-key reward
    --binary-reward: half the examples desirable)."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    for split, seed in (("train", 0), ("test", 1), ("val", 0)):
        records = conversations(count if split != "test" else count // 4, seed)
        for key in ("chosen", "rejected"):
            write(
                root / "data" / "pairwise" / f"llama3_dpo_{split}",
                key,
                [(*build_chat(tokenizer, r[key], only_last=True), None) for r in records],
            )
            write(
                root / "data" / "pairwise" / f"llama3_rm_{split}",
                key,
                [(*build_chat(tokenizer, r[key], for_rm=True), None) for r in records],
            )
        write(
            root / "data" / "sft" / f"llama3_{split}",
            "messages",
            [(*build_chat(tokenizer, r["chosen"]), None) for r in records],
        )
        examples = []
        for index, record in enumerate(records):
            desirable = index % 2 == 0
            chat = record["chosen" if desirable else "rejected"]
            examples.append((*build_chat(tokenizer, chat), [1 if desirable else -1]))
        write(root / "data" / "kto" / f"llama3_{split}", "messages", examples)


def converted_model(
    root: Path,
    tokenizer_dir: Path,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 176,
) -> Path:
    """What the configs load: `checkpoints/neox_converted/llama3-8b-instruct`, here a small seeded Llama
    as transformers saves it, with the tokenizer under `tokenizer/`."""
    folder = root / "checkpoints" / "neox_converted" / "llama3-8b-instruct"
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    shutil.copytree(tokenizer_dir, folder / "tokenizer")
    return folder


def kto_documents_job(directory: Path, tokenizer_dir: Path, *, beta: float = 0.5) -> list[str]:
    """Overrides that turn the tiny config into a KTO run on NeoX KTO documents written to `directory`
    (data.example_documents, GPT-NeoX's KL estimate)."""
    write_post_training_data(directory, tokenizer_dir, count=64)
    keys = []
    for split, name in (("train", "train"), ("validation", "val")):
        prefix = directory / "data" / "kto" / f"llama3_{name}_messages"
        keys += [
            f"+data.example_documents.{split}.documents={prefix}_document",
            f"+data.example_documents.{split}.labels={prefix}_label_document",
            f"+data.example_documents.{split}.rewards={prefix}_reward_document",
        ]
    return [
        f"+model_alignment_strategy.kto.beta={beta}",
        "+model_alignment_strategy.kto.kl_estimate=batch_halves",
        *keys,
        f"+data.tokenizer.type={tokenizer_dir}",
    ]


NEOX_FLOAT32_CODE = 6
"""GPT-NeoX's indexed-dataset code for float32 (megatron/data/indexed_dataset.py; Megatron-LM's is 7)."""
DTYPE_CODE_OFFSET = 9 + 8
"""Where the dtype code sits in an .idx header: after the 9-byte magic and the 8-byte version."""


def write_neox_reference(prefix: str | Path, rows: list[list[float]], seq_length: int, documents: int) -> None:
    """A file as NeoX's precompute_logits writes it: `documents` documents (its count rounded up, the
    data wrapping round), each seq_length float32 log-probs (value j: token j + 1's), 0 past the data's
    values, under NeoX's float32 code."""
    with IndexedDatasetWriter(prefix, np.float32) as writer:
        for index in range(documents):
            values = np.zeros(seq_length, dtype=np.float32)
            row = rows[index % len(rows)][:seq_length]
            values[: len(row)] = row
            writer.add_document(values)
    with open(f"{prefix}.idx", "r+b") as index_file:
        index_file.seek(DTYPE_CODE_OFFSET)
        index_file.write(bytes([NEOX_FLOAT32_CODE]))
