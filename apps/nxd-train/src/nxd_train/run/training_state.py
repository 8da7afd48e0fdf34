"""What a checkpoint holds of a run and how it is put back: the training state (model, optimizer, scheduler,
sampler, RNG states), the weights alone, or LoRA adapters."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import nxd_ckpt  # its DCP and DTensor parts (nxd_ckpt.load_checkpoint ...) load when a run first uses them
import torch
from nxd_align import LoraFamily
from nxd_ckpt import CheckpointError
from nxd_parallel import StagedModel
from nxd_precision import LossScaler, PrecisionOptimizer
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from nxd_train.run.initial_weights import holds_frozen_base


def rng_states(extra: dict[str, Any] | None = None) -> bytes:
    """This process's python, numpy, torch (and CUDA) generator states, as JSON (a checkpoint is read
    without unpickling anything: a state someone else saved must not run code); with `extra`, the run's own
    streams beside them (online RL's sampling stream), which `saved_extra` reads back."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    version, python_state, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    return json.dumps(
        {
            "python": [version, list(python_state), gauss],
            "numpy": [kind, keys.tolist(), position, has_gauss, cached],
            "torch": torch.get_rng_state().tolist(),
            "cuda": None if cuda is None else [state.tolist() for state in cuda],
            **({} if extra is None else {"extra": extra}),
        }
    ).encode()


def saved_extra(blob: bytes) -> dict[str, Any] | None:
    """The `extra` states `rng_states` saved in `blob` (None without: a run that had none, or an earlier nxd)."""
    if not isinstance(blob, bytes) or not blob.startswith(b"{"):
        return None
    try:
        extra = json.loads(blob).get("extra")
    except ValueError:
        return None
    return extra if isinstance(extra, dict) else None


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
