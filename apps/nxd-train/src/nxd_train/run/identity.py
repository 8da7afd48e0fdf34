"""What changed between the run that wrote a checkpoint and the run continuing from it.

Settings that shape the saved state (the architecture, heads included; the tokenizer; the sequence
length; the data; the precision type; the optimizer) cannot change across a resume: the state would
load into another model, or the data position would point elsewhere. The hyperparameters a user may
change on purpose (the optimizer's lr, weight_decay, betas, eps ..., the schedule, clipping) take effect
from the first resumed step, said once. Everything is compared with what the checkpoint's marker recorded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from nxd_models import ModelFamily

IDENTITY = "identity"
"""The completion marker's record of what a resume must keep: architecture, tokenizer, data."""
STATE_KEYS = (
    "model_source",
    "precision.type",
    "model.optim.name",
    "model.encoder_seq_length",
    "data.seq_length",
)
"""Config keys whose change cannot continue a checkpoint (compared as written)."""
APPLIED_PREFIXES = ("model.optim.", "trainer.gradient_clip_val")
"""Config keys a resume applies from its first step (the optimizer's name excepted)."""
HF_SHAPE_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_local_experts",
    "num_experts_per_tok",
)
"""config.json values that shape a model, not always its tensors (heads split the same rows)."""
ARCHITECTURE = {
    "model": (
        "num_layers",
        "hidden_size",
        "ffn_hidden_size",
        "num_attention_heads",
        "num_kv_heads",
        "kv_channels",
        "normalization",
        "activation",
        "has_bias",
        "position_embedding_type",
        "position_embedding_offset",
        "rpe_num_buckets",
        "rpe_max_distance",
        "qk_layernorm",
        "rotary_percentage",
        "share_embeddings_and_output_weights",
        "transformer_block_type",
        "vocab_size",
        "moe",
        "num_unique_layers",
    ),
    "model.model_config": ("model_type", *HF_SHAPE_KEYS, "hidden_act", "vocab_size", "tie_word_embeddings"),
}
"""Per family (by where its architecture is set), the values that shape a model's state."""
DATA_KEYS = ("data_prefix", "train_dir", "val_dir", "pair_documents", "example_documents", "label_prefixes")
"""data keys naming files a run reads, whose contents a resume must find unchanged."""


def architecture(family: ModelFamily) -> dict[str, Any]:
    """The values of `family`'s spec that shape the model's state, under the names its config uses."""
    return {name: _plain(getattr(family.spec, name, None)) for name in ARCHITECTURE.get(family.source_key, ())}


def data_identity(data: Mapping[str, Any]) -> dict[str, str]:
    """For each data key naming files (the config's `data` section, as dumped), a digest of what is there:
    an indexed dataset's .idx whole and its .bin's size; other files by size and their first and last MiB;
    folders by their files' names and the same. Paths themselves do not count: moved data is the same."""
    found = {}
    for key in DATA_KEYS:
        paths = sorted(set(_strings(data.get(key))))
        if not paths:
            continue
        digest = hashlib.sha256()
        for path in paths:
            digest.update(_path_identity(path))
        found[f"data.{key}"] = digest.hexdigest()[:16]
    return found


def compare(
    saved_config: Mapping[str, Any],
    saved_identity: Mapping[str, Any],
    config: Mapping[str, Any],
    identity: Mapping[str, Any],
    source_key: str,
) -> tuple[list[str], list[str]]:
    """(what cannot continue, what will change): each `key: old -> new` (old the checkpoint's)."""
    old, new = _flat(saved_config), _flat(config)
    refused = [
        f"{key}: {old[key]!r} in the checkpoint, {new.get(key)!r} here"
        for key in STATE_KEYS
        if key in old and old[key] != new.get(key)
    ]
    saved_shape, shape = saved_identity.get("architecture") or {}, identity.get("architecture") or {}
    refused += [
        f"{source_key}{'.' if source_key == 'model' else ' '}{name}: {saved_shape[name]!r} in the "
        f"checkpoint, {shape.get(name)!r} here"
        for name in saved_shape
        if saved_shape[name] != shape.get(name)
    ]
    saved_tokenizer = saved_identity.get("tokenizer")
    if saved_tokenizer is not None and saved_tokenizer != identity.get("tokenizer"):
        refused.append(
            f"data.tokenizer: another tokenizer than the checkpoint's (its vocabulary, merges or "
            f"special ids differ: {saved_tokenizer} there, {identity.get('tokenizer')} here)"
        )
    saved_data, data = saved_identity.get("data") or {}, identity.get("data") or {}
    refused += [
        f"{key}: the files there are not those the checkpoint trained on (replaced or changed)"
        for key in saved_data
        if key in data and saved_data[key] != data[key]
    ]
    applied = [
        f"{key} {old[key]!r} -> {new.get(key)!r}"
        for key in sorted(old)
        if key.startswith(APPLIED_PREFIXES) and key not in STATE_KEYS and old[key] != new.get(key)
    ]
    return refused, applied


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{name}."))
        else:
            flat[name] = _plain(value)
    return flat


def _plain(value: Any) -> Any:
    """Lists for tuples (a marker's JSON has no tuples), and the same for nested values."""
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if hasattr(value, "__dataclass_fields__"):
        return {name: _plain(getattr(value, name)) for name in value.__dataclass_fields__}
    return value


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


SAMPLED = 2**20
"""Bytes read from each end of a large file (its size and ends stand for its contents)."""


def _path_identity(text: str) -> bytes:
    path = Path(text)
    index, binary = Path(f"{text}.idx"), Path(f"{text}.bin")
    if index.is_file():
        size = binary.stat().st_size if binary.is_file() else -1
        return hashlib.sha256(index.read_bytes()).digest() + str(size).encode()
    if path.is_file():
        return _file_identity(path)
    if path.is_dir():
        digest = hashlib.sha256()
        for file in sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")):
            digest.update(str(file.relative_to(path)).encode() + _file_identity(file))
        return digest.digest()
    return b"absent"


def _file_identity(path: Path) -> bytes:
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(SAMPLED)
        handle.seek(max(size - SAMPLED, len(head)))
        tail = handle.read(SAMPLED)
    return hashlib.sha256(str(size).encode() + head + tail).digest()
