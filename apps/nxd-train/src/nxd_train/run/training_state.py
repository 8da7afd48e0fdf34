"""What a checkpoint holds of a run and how it is put back: the training state (model, optimizer, scheduler,
sampler, RNG states), the weights alone, or LoRA adapters."""

from __future__ import annotations

import json
import random
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import nxd_ckpt  # its DCP and DTensor parts (nxd_ckpt.load_checkpoint ...) load when a run first uses them
import torch
from nxd_align import LoraFamily, base_key, is_adapter_key
from nxd_ckpt import CheckpointError, read_info
from nxd_models import ModelFamily
from nxd_parallel import StagedModel, modules_of
from nxd_precision import LossScaler, PrecisionOptimizer
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from nxd_train.run.checkpointing import OUTPUT_LAYER, PACKAGES, Resume, export_of, fresh_prefixes


def export_record(export: nxd_ckpt.HFExport | str) -> dict[str, Any]:
    """What the completion marker says about Hugging Face export: the mapping, or why there is none."""
    return {"hf_export": export.to_json()} if isinstance(export, nxd_ckpt.HFExport) else {"hf_export_problem": export}


def versions() -> dict[str, str]:
    found = {}
    for package in PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "unknown"
    return found


def rng_states() -> bytes:
    """This process's python, numpy, torch (and CUDA) generator states, as JSON (a checkpoint is read
    without unpickling anything: a state someone else saved must not run code)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    version, python_state, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    return json.dumps(
        {
            "python": [version, list(python_state), gauss],
            "numpy": [kind, keys.tolist(), position, has_gauss, cached],
            "torch": torch.get_rng_state().tolist(),
            "cuda": None if cuda is None else [state.tolist() for state in cuda],
        }
    ).encode()


def restore_rng_states(blob: bytes) -> bool:
    """Set this process's generators from `rng_states`' JSON; False (nothing set) for the pickled states
    earlier nxd versions wrote, which are never unpickled."""
    if not isinstance(blob, bytes):
        raise CheckpointError(f"the checkpoint's random states: expected nxd's JSON, found a {type(blob).__name__}")
    if not blob.startswith(b"{"):
        return False
    try:
        states = json.loads(blob)
        version, python_state, gauss = states["python"]
        kind, keys, position, has_gauss, cached = states["numpy"]
        generators = (
            torch.tensor(states["torch"], dtype=torch.uint8),
            None if states["cuda"] is None else [torch.tensor(s, dtype=torch.uint8) for s in states["cuda"]],
        )
        random.setstate((version, tuple(python_state), gauss))
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), position, has_gauss, cached))
        torch.set_rng_state(generators[0])
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError, OverflowError) as error:
        raise CheckpointError(
            f"the checkpoint's random states are not the JSON nxd writes ({type(error).__name__}: "
            f"{error}); a damaged or crafted checkpoint, or resume_rng: False to start from the "
            "seeded states"
        ) from None
    if generators[1] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(generators[1])
    return True


class TrainingState:
    """The DCP state of a run: built fresh for each save or load, so it always holds the live tensors.

    With LoRA (`lora`) the model part holds the adapters (the trained parameters) and, as `lora_base`
    says, the frozen base ("frozen") or the merged weights ("merged") under the base model's names."""

    def __init__(
        self,
        model: nn.Module | StagedModel,
        optimizer: PrecisionOptimizer,
        scheduler: LRScheduler,
        *,
        use_master_weights: bool,
        save_bf16: bool = False,
        lora: LoraFamily | None = None,
        lora_base: str | None = None,
        scaler: LossScaler | None = None,
    ):
        self.model, self.optimizer, self.scheduler, self.save_bf16 = model, optimizer, scheduler, save_bf16
        self.scaler = scaler
        self.lora, self.lora_base = lora, lora_base
        self.names = [name for name, p in model.named_parameters() if p.requires_grad]
        self.masters_as_model = use_master_weights and optimizer.persistent and optimizer.copies_needed

    def _weights(self, base: str | None) -> dict[str, torch.Tensor]:
        if self.lora is None:
            return self.model.state_dict()
        return self.lora.checkpoint_weights(self.model, base=base)

    def model_state(self, *, saving: bool = False, base: str | None = None) -> dict[str, torch.Tensor]:
        """The model's weights (its master weights with use_master_weights_in_ckpt): the live tensors, or
        bf16 copies of the floating-point ones when saving with save_bf16. A LoRA run saves its
        `lora_base`, and loads the base only from a checkpoint that holds it unmerged (`base` "frozen")."""
        weights = self._weights(self.lora_base if saving else base)
        if self.masters_as_model:
            weights.update(self.optimizer.masters(self.names))
        if saving and self.save_bf16:
            weights = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in weights.items()}
        return weights

    def state(
        self,
        *,
        progress: dict[str, int],
        sampler: dict[str, Any],
        rng: dict[str, bytes | None],
        saving: bool = False,
        base: str | None = None,
    ) -> dict:
        optimizer = self.optimizer.state_dict(self.names, masters=not self.masters_as_model)
        scheduler = self.scheduler.state_dict()
        state = {
            nxd_ckpt.MODEL_KEY: self.model_state(saving=saving, base=base),
            "optimizer": optimizer,
            "scheduler": scheduler,
            "progress": progress,
            "sampler": sampler,
            "rng": rng,
        }
        if self.scaler is not None:
            state["loss_scaler"] = self.scaler.state_dict()
        return state

    def load(
        self,
        path: Path,
        *,
        progress: dict[str, int],
        sampler: dict[str, Any],
        rng: dict[str, bytes | None],
        process_group: torch.distributed.ProcessGroup | None,
        optimizer: bool = True,
    ) -> None:
        """Everything from checkpoint `path`, in place; `progress`, `sampler` and `rng` receive the saved values.
        Without `optimizer` the optimizer state and the schedule's position are not read (resume_optimizer)."""
        self.optimizer.create_state()
        base = "frozen" if holds_frozen_base(path) else None
        state = self.state(progress=progress, sampler=sampler, rng=rng, base=base)
        if not optimizer:
            del state["optimizer"], state["scheduler"]
        nxd_ckpt.load_checkpoint(path, state, process_group=process_group)
        if optimizer:
            self._load_optimizer(path, state)
        if self.scaler is not None:
            self.scaler.load_state_dict(state["loss_scaler"])
        if self.masters_as_model:
            self.optimizer.sync_parameters()

    def _load_optimizer(self, path: Path, state: dict[str, Any]) -> None:
        try:
            self.optimizer.load_state_dict(state["optimizer"], self.names)
        except (ValueError, KeyError) as error:
            raise CheckpointError(f"{path}: the optimizer state does not fit this run's optimizer: {error}") from None
        self.scheduler.load_state_dict(state["scheduler"])


def holds_frozen_base(path: Path) -> bool:
    """Whether LoRA checkpoint `path` holds the base model unmerged (save_lora_base), so loading it
    restores the base too (merged weights are for export, never a base to train on)."""
    return read_info(path).extra.get(nxd_ckpt.LORA_RECORD, {}).get("base") == "frozen"


def load_weights(
    model: nn.Module | StagedModel,
    resume: Resume,
    family: ModelFamily,
    process_group: torch.distributed.ProcessGroup | None,
    lora: LoraFamily | None = None,
) -> None:
    """Only the model weights of `resume` (an nxd checkpoint, a Hugging Face directory read through the
    model's mapping, or a GPT-NeoX checkpoint read through its NeoX layout, each checked against the whole
    model's shapes) into `model`, whatever its layout (pipeline stages load their own parts). With `lora`
    they are the base model's weights, and the adapters keep their initial values; a reward model
    starting from a causal LM takes all but the output layer (its score head keeps its initial values)."""
    skip = fresh_prefixes(family, resume)
    if not (resume.hugging_face or resume.neox):
        weights = model.state_dict() if lora is None else lora.base_weights(model)
        weights = {key: value for key, value in weights.items() if not key.startswith(skip)}
        nxd_ckpt.load_checkpoint(resume.path, {nxd_ckpt.MODEL_KEY: weights}, process_group=process_group)
        return
    live = {
        base_key(key): value
        for module in modules_of(model)
        for key, value in module.state_dict().items()
        if not is_adapter_key(key) and not base_key(key).startswith(skip)
    }
    if OUTPUT_LAYER in skip:
        family = family.with_head("causal_lm")  # read through the base's own mapping, its output layer left
    if resume.neox:
        nxd_ckpt.load_neox_weights(resume.path, family.neox_layout(), family.parameter_shapes(), live)
        return
    export = export_of(family, reading=True)
    if not isinstance(export, nxd_ckpt.HFExport):
        raise CheckpointError(f"{resume.path}: cannot import Hugging Face weights: {export}")
    nxd_ckpt.load_hf_weights(resume.path, export, family.parameter_shapes(), live)  # each rank reads its own shards


def load_adapters(
    model: nn.Module | StagedModel, path: Path, lora: LoraFamily, process_group: torch.distributed.ProcessGroup | None
) -> None:
    """The adapters (and the base, when it was saved unmerged) of LoRA checkpoint `path` (load_lora_from_ckpt)."""
    if nxd_ckpt.LORA_RECORD not in read_info(path).extra:
        raise CheckpointError(
            f"model_alignment_strategy.peft.load_lora_from_ckpt: {path} is not a checkpoint of a "
            "LoRA run; expected one whose run had model_alignment_strategy.peft"
        )
    weights = lora.checkpoint_weights(model, base="frozen" if holds_frozen_base(path) else None)
    nxd_ckpt.load_checkpoint(path, {nxd_ckpt.MODEL_KEY: weights}, process_group=process_group)
