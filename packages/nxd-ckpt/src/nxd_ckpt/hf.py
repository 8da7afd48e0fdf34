"""Hugging Face safetensors export and import, driven by a model's declared key mapping.

The mapping is data (`HFExport`): the config.json to write, our state-dict key -> the Hugging Face
key, the keys whose rows are the padded vocabulary, tied keys, and stacked keys (a tensor whose
slices along its first dimension are separate Hugging Face tensors: a Mixtral's experts). A
checkpoint records its mapping in the completion marker, so `export_hf` needs nothing but the
checkpoint.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from .errors import CheckpointError, CheckpointWarning, cause_of, gist
from .marker import read_info
from .safe_read import SafeKeysLoadPlanner, SafeReader, read_metadata

MODEL_KEY = "model"
"""The top-level key of the model's weights in a checkpoint's state."""
WEIGHTS_FILE = "model.safetensors"
ADAPTER_FILE, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"
"""peft's adapter folder."""
LORA_RECORD = "lora"
"""The completion marker's record of a LoRA run: `config` (adapter_config.json), `keys` (our adapter key
-> peft's), `merges` ([base weight, A, B] keys), `scaling` (alpha / r) and `base` ("frozen", "merged" or
None: how the checkpoint holds the base model)."""


@dataclass(frozen=True)
class HFExport:
    config: dict[str, Any]
    """config.json for transformers (with `architectures`)."""
    keys: dict[str, str]
    """Our model state-dict key -> the Hugging Face key."""
    vocab_size: int | None = None
    vocab_padded_keys: tuple[str, ...] = ()
    """Our keys whose first dimension is a padded vocabulary: the first `vocab_size` rows are exported."""
    tied: dict[str, str] = field(default_factory=dict)
    """Our key -> our key it shares storage with (not exported; filled from its source on import)."""
    tokenizer_files: dict[str, str] = field(default_factory=dict)
    """The run's tokenizer, copied beside the weights: file name in the export -> where it was read."""
    stacked: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Our key -> the Hugging Face keys of its slices along the first dimension, in order (stacked experts)."""
    interleaved: dict[str, tuple[tuple[str, ...], int]] = field(default_factory=dict)
    """Hugging Face key -> (our keys, rows per head): one tensor holding our tensors' rows head by head (the first
    head's rows of each of ours, then the second head's ...: GPT-NeoX's query_key_value)."""
    buffers: tuple[str, ...] = ()
    """Endings of Hugging Face keys that hold buffers, not weights: an import passes over them."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, mapping: Any) -> HFExport:
        """The export of a model's declared mapping: any object with these fields (nxd-models' HFMapping)."""
        return cls(
            mapping.config,
            mapping.keys,
            mapping.vocab_size,
            tuple(mapping.vocab_padded_keys),
            dict(mapping.tied),
            stacked={key: tuple(keys) for key, keys in mapping.stacked.items()},
            interleaved={key: (tuple(ours), rows) for key, (ours, rows) in mapping.interleaved.items()},
            buffers=tuple(mapping.buffers),
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HFExport:
        stacked = {key: tuple(keys) for key, keys in data.get("stacked", {}).items()}
        interleaved = {key: (tuple(ours), rows) for key, (ours, rows) in data.get("interleaved", {}).items()}
        return cls(
            **{
                **data,
                "vocab_padded_keys": tuple(data["vocab_padded_keys"]),
                "stacked": stacked,
                "interleaved": interleaved,
                "buffers": tuple(data.get("buffers", ())),
            }
        )

    @property
    def parts(self) -> dict[str, tuple[str, int, int]]:
        """Our key -> (the interleaved Hugging Face key holding it, its place among the parts, rows per head)."""
        return {
            ours: (theirs, index, rows)
            for theirs, (keys, rows) in self.interleaved.items()
            for index, ours in enumerate(keys)
        }


def interleave_heads(parts: list[torch.Tensor], rows: int) -> torch.Tensor:
    """One tensor of `parts` (each heads x rows along dimension 0) taken head by head: head 0's rows of each
    part in turn, then head 1's ... (GPT-NeoX's query_key_value of q, k and v)."""
    heads = parts[0].shape[0] // rows
    return torch.stack([part.reshape(heads, rows, *part.shape[1:]) for part in parts], dim=1).reshape(
        -1, *parts[0].shape[1:]
    )


def export_hf(checkpoint: Path, out: Path, *, dtype: torch.dtype | None = None, merged: bool = False) -> Path:
    """Write `out/model.safetensors` and `out/config.json` from a complete checkpoint, as transformers'
    AutoModelForCausalLM loads them, with the run's tokenizer files when it recorded them. A LoRA
    checkpoint exports its adapter as a peft adapter folder (`export_adapter`), or with `merged` the
    model with the adapter merged in (fp32). `out` appears whole or not at all. Every file is checked against
    its recorded digest first: an export never carries damaged weights."""
    info = read_info(Path(checkpoint)).verified(contents=True)
    lora = info.extra.get(LORA_RECORD)
    if lora is not None and not merged:
        return export_adapter(info.path, out, dtype=dtype)
    if "hf_export" not in info.extra:
        reason = info.extra.get("hf_export_problem", "it records no Hugging Face mapping")
        raise CheckpointError(f"{info.path}: cannot export to Hugging Face: {reason}")
    if merged and (lora is None or lora.get("base") is None):
        what = "is not a LoRA checkpoint" if lora is None else "holds the adapters without their base model"
        raise CheckpointError(
            f"{info.path}: --merged: the checkpoint {what}; expected one saved with "
            "model_alignment_strategy.peft.save_lora_base or merge_lora"
        )
    export = HFExport.from_json(info.extra["hf_export"])
    wanted = set(export.keys) | set(export.stacked) | set(export.parts)
    if lora is not None and lora["base"] == "frozen":
        wanted |= {key for merge in lora["merges"] for key in merge[1:]}
    loaded = _read_model(info.path, wanted)
    if lora is not None and lora["base"] == "frozen":
        for weight, a, b in lora["merges"]:
            loaded[weight] = loaded[weight].float() + lora["scaling"] * (loaded[b].float() @ loaded[a].float())
    tensors = {}
    for ours, theirs in export.keys.items():
        tensor = loaded[ours]
        if ours in export.vocab_padded_keys:
            tensor = tensor[: export.vocab_size]
        tensors[theirs] = _cast(tensor, dtype)
    for ours, theirs in export.stacked.items():
        for key, part in zip(theirs, loaded[ours].unbind(0), strict=True):
            tensors[key] = _cast(part.contiguous(), dtype)
    for theirs, (ours, rows) in export.interleaved.items():
        tensors[theirs] = _cast(interleave_heads([loaded[key] for key in ours], rows), dtype)
    config = dict(export.config)
    if dtype is not None:
        config["dtype"] = str(dtype).removeprefix("torch.")

    def write(staging: Path) -> None:
        save_file(tensors, staging / WEIGHTS_FILE, metadata={"format": "pt"})
        (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        _copy_tokenizer(export.tokenizer_files, staging)

    return _write_whole(Path(out), write)


def export_adapter(checkpoint: Path, out: Path, *, dtype: torch.dtype | None = None) -> Path:
    """A LoRA checkpoint's adapter as the folder peft's `PeftModel.from_pretrained` loads on the base
    model: adapter_model.safetensors (every shard gathered, under peft's names for the base model's
    Hugging Face layers) and adapter_config.json."""
    info = read_info(Path(checkpoint)).verified(contents=True)
    if (lora := info.extra.get(LORA_RECORD)) is None:
        raise CheckpointError(
            f"{info.path}: holds no LoRA adapter; expected a checkpoint of a run with model_alignment_strategy.peft"
        )

    def write(staging: Path) -> None:
        write_adapter_files(staging, lora, weights_from=info.path, dtype=dtype)

    return _write_whole(Path(out), write)


def write_adapter_files(
    directory: Path, lora: dict[str, Any], *, weights_from: Path | None = None, dtype: torch.dtype | None = None
) -> None:
    """adapter_config.json (from a LoRA record) into `directory`, and adapter_model.safetensors read from
    the DCP files in `weights_from` when given (a checkpoint, or one being finished)."""
    directory = Path(directory)
    if weights_from is not None:
        loaded = _read_model(Path(weights_from), set(lora["keys"]))
        tensors = {theirs: _cast(loaded[ours], dtype) for ours, theirs in lora["keys"].items()}
        save_file(tensors, directory / ADAPTER_FILE, metadata={"format": "pt"})
    (directory / ADAPTER_CONFIG).write_text(json.dumps(lora["config"], indent=2, sort_keys=True))


def _read_model(path: Path, keys: set[str]) -> dict[str, torch.Tensor]:
    """The whole tensors of model `keys` from the DCP files in `path`, read in this one process without
    any collective (so rank 0 alone may call it inside a distributed run), as DCP's own format tools do."""
    state: dict[str, Any] = {}
    read_metadata(path)  # refused here, by name, before DCP's reader tries the ranks' own metadata files
    planner = SafeKeysLoadPlanner(keys={f"{MODEL_KEY}.{key}" for key in keys}, source=path)
    try:
        _load_state_dict(state, storage_reader=SafeReader(path), no_dist=True, planner=planner)
    except (CheckpointException, Exception) as error:
        if (refused := cause_of(error)) is not None:
            raise refused from None
        raise CheckpointError(f"{path}: cannot be read: {gist(error)}") from None
    if MODEL_KEY not in state:
        raise CheckpointError(f"{path}: holds none of the model weights its marker records ({sorted(keys)[:3]}...)")
    return state[MODEL_KEY]


def _cast(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return (tensor.to(dtype) if dtype and tensor.is_floating_point() else tensor).contiguous()


def _write_whole(out: Path, write: Callable[[Path], None]) -> Path:
    """Run `write` on a staging folder beside `out`, then rename it to `out` (new or empty)."""
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out}: expected a new or empty directory for the export, found a file")
    if out.exists() and any(out.iterdir()):
        raise CheckpointError(f"{out}: expected a new or empty directory for the export, found files in it")
    blocked = next((parent for parent in out.parents if parent.exists() and not parent.is_dir()), None)
    if blocked is not None:
        raise CheckpointError(f"{out}: expected a folder path for the export, found a file at {blocked}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = out.parent / f".{out.name}.{secrets.token_hex(6)}"
        staging.mkdir(0o777)  # less the umask, as the folder a user makes (mkdtemp's are 0700)
    except OSError as error:
        raise CheckpointError(f"{out}: cannot write the export there ({error.strerror or error})") from None
    try:
        write(staging)
        for file in staging.iterdir():  # safetensors writes its file 0600
            file.chmod(0o666 & ~_umask())
        if out.exists():
            out.rmdir()
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _umask() -> int:
    """This process's umask, read where the kernel shows it (setting it to read it would race other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _copy_tokenizer(files: dict[str, str], directory: Path) -> None:
    """The run's tokenizer files into the export; a notice for any that is gone since the run."""
    missing = []
    for name, source in files.items():
        if Path(source).is_file():
            shutil.copyfile(source, directory / name)
        else:
            missing.append(source)
    if missing:
        warnings.warn(
            f"the run's tokenizer is no longer at {', '.join(missing)}; the export holds no copy of it",
            CheckpointWarning,
            stacklevel=3,
        )
