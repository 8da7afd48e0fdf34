"""exp_manager's checkpoint and resume keys, turned into nxd-ckpt calls.

A checkpoint holds the model (or its fp32 master weights with use_master_weights_in_ckpt), the
optimizer state by parameter name (with the master weights), the LR scheduler, the step and consumed
samples, the sampler's stream, every rank's RNG states, and — in its completion marker — the resolved
config, the package versions, the layout and the Hugging Face mapping that `ckpt export-hf` applies.
"""

from __future__ import annotations

import json
import random
import warnings
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import nxd_ckpt  # its DCP and DTensor parts (nxd_ckpt.load_checkpoint ...) load when a run first uses them
import torch
from nxd_align import LoraFamily, base_key, is_adapter_key
from nxd_ckpt import (
    MARKER,
    CheckpointError,
    CheckpointInfo,
    CheckpointWarning,
    SavePolicy,
    is_checkpoint_dir,
    newest_usable,
    read_info,
    template_fields,
)
from nxd_config import NxdConfig
from nxd_config.schema.exp_manager import interval_seconds
from nxd_models import ModelConfigError, ModelFamily
from nxd_parallel import StagedModel, modules_of
from nxd_precision import LossScaler, PrecisionOptimizer
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from nxd_train.checks.resume import HF_SHAPE_KEYS
from nxd_train.logging.log_dir import CHECKPOINT_DIR

LOGGED = ("step", "consumed_samples", "epoch", "loss", "lr", "grad_norm", "val_loss")
"""Values a run logs, which monitor and the filename template may name."""
PACKAGES = (
    "nxd-config",
    "nxd-parallel",
    "nxd-precision",
    "nxd-models",
    "nxd-data",
    "nxd-align",
    "nxd-ckpt",
    "nxd-train",
    "torch",
)


def save_policy(cfg: NxdConfig) -> SavePolicy:
    params = cfg.exp_manager.checkpoint_callback_params
    return SavePolicy(
        every_n_train_steps=params.every_n_train_steps,
        save_at_steps=tuple(params.save_at_steps or ()),
        train_time_interval=interval_seconds(params.train_time_interval),
        save_top_k=params.save_top_k,
        monitor=params.monitor,
        mode=params.ranking,
        save_last=params.save_last,
        filename=params.filename or f"{cfg.exp_manager.name or cfg.name}--{{step}}-{{consumed_samples}}",
        enable_version_counter=params.enable_version_counter,
    )


def checkpoint_problems(cfg: NxdConfig) -> list[str]:
    """Checkpoint keys that name values this run never logs."""
    params, key = cfg.exp_manager.checkpoint_callback_params, "exp_manager.checkpoint_callback_params"
    if not cfg.exp_manager.create_checkpoint_callback:
        return []
    problems = []
    if params.monitor not in LOGGED:
        problems.append(f"{key}.monitor: expected one of {', '.join(LOGGED)}, found {params.monitor!r}")
    for name in template_fields(params.filename or ""):
        if name not in LOGGED:
            problems.append(f"{key}.filename: {{{name}}} is not a logged value; expected one of {', '.join(LOGGED)}")
    return problems


HEAD_RECORD = "head"
"""The completion marker's record of the model's output layer: causal_lm, or score (a reward model)."""


@dataclass(frozen=True)
class Resume:
    """Where a run starts from: a checkpoint to continue, or weights to start a new run from."""

    path: Path
    weights_only: bool
    hugging_face: bool = False
    """`path` is a Hugging Face model directory (safetensors + config.json), not an nxd checkpoint."""
    world_size: int | None = None
    """Processes of the run that saved it (their RNG states are restored only at the same number)."""
    neox: bool = False
    """`path` is a checkpoint GPT-NeoX wrote (its model weights are read; nothing else of it is)."""
    start_step: int = 0
    """The step a run continues at from these weights: a NeoX checkpoint's iteration, unless fine-tuning."""
    head: str = "causal_lm"
    """The output layer the weights hold: causal_lm, or score (a reward model's)."""

    @classmethod
    def of_checkpoint(cls, info: CheckpointInfo, weights_only: bool) -> Resume:
        """The nxd checkpoint `info` as a start, with what its marker records of the run."""
        return cls(
            info.path.resolve(),
            weights_only,
            world_size=info.extra.get("world_size"),
            head=info.extra.get(HEAD_RECORD, "causal_lm"),
        )

    @classmethod
    def of_hugging_face(cls, path: Path) -> Resume:
        """The Hugging Face model directory `path` as initial weights: a reward model's when config.json names a
        *ForSequenceClassification (a damaged config.json is named by the import)."""
        try:
            architectures = json.loads((path / "config.json").read_text()).get("architectures") or []
        except (OSError, ValueError, AttributeError):
            architectures = []
        score = any(str(name).endswith("ForSequenceClassification") for name in architectures)
        return cls(path.resolve(), True, hugging_face=True, head="score" if score else "causal_lm")


def is_hf_directory(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def resume_choice(cfg: NxdConfig, log_dir: Path | None) -> Resume | None:
    """The checkpoint the resume keys select, or None; a CheckpointError when the one asked for is
    missing, incomplete or damaged. `log_dir` is the directory resume_if_exists searches; a GPT-NeoX
    checkpoint there (its `latest`) is the start when it holds no nxd checkpoint yet. resume_from_checkpoint
    may name a run's log directory too (its newest complete checkpoint, as GPT-NeoX's load names a save
    folder), or a Trainer-style checkpoint-<step> folder nxd wrote; with resume_from_checkpoint_optional a
    folder holding no checkpoint starts a new run."""
    exp, weights_only = cfg.exp_manager, cfg.model.weight_init_only
    if exp.resume_from_checkpoint:
        path = Path(exp.resume_from_checkpoint)
        path = nxd_ckpt.nxd_checkpoint_of(path) or path  # a Trainer-style folder nxd wrote: its checkpoint
        if is_hf_directory(path):
            if not weights_only:
                raise CheckpointError(
                    f"exp_manager.resume_from_checkpoint: {path} is a Hugging Face model "
                    "(weights only); expected model.weight_init_only: True to start from it"
                )
            return Resume.of_hugging_face(path)
        optional = exp.resume_from_checkpoint_optional
        if optional and (not path.is_dir() or not any(path.iterdir())):
            return _new_run(path, "is empty" if path.is_dir() else "is missing")
        if (neox := _neox(path, weights_only)) is not None:
            return neox
        if not path.is_dir():
            raise CheckpointError(
                f"exp_manager.resume_from_checkpoint: expected an nxd checkpoint directory or a "
                f"Hugging Face model directory, found no directory at {path}"
            )
        if (path / CHECKPOINT_DIR).is_dir() and not read_info(path).complete:  # a run's log directory: its newest
            info, passed_over = newest_usable(path / CHECKPOINT_DIR)
            held = f"none usable: {'; '.join(passed_over)}" if passed_over else "no complete checkpoint"
            if info is None and optional:
                return _new_run(path, f"holds {held}")
            if info is None:
                raise CheckpointError(
                    f"exp_manager.resume_from_checkpoint: {path} is a run directory whose "
                    f"{CHECKPOINT_DIR} folder holds {held}"
                )
            _say_passed_over(passed_over, info)
        elif not is_checkpoint_dir(path):
            if optional:
                return _new_run(
                    path, "holds no checkpoint (no nxd completion marker, GPT-NeoX latest or checkpoints folder)"
                )
            found = (
                "an empty folder"
                if not any(path.iterdir())
                else (
                    "a log directory without a checkpoints folder"
                    if (path / "config.yaml").is_file()
                    else "a folder holding none of them"
                )
            )
            raise CheckpointError(
                f"exp_manager.resume_from_checkpoint: expected an nxd checkpoint (a folder with "
                f"{MARKER}), a run's log directory with a {CHECKPOINT_DIR} folder, a Hugging Face "
                f"model directory or a GPT-NeoX checkpoint, found {found} at {path}"
            )
        else:
            info = read_info(path).verified(contents=True)
    elif not exp.resume_if_exists:
        return None
    else:
        info, passed_over = newest_usable(log_dir / CHECKPOINT_DIR) if log_dir is not None else (None, [])
        if info is not None or exp.resume_ignore_no_checkpoint:  # else the refusal below names them
            _say_passed_over(passed_over, info)
        if info is None and log_dir is not None and (neox := _neox(log_dir, weights_only)) is not None:
            return neox
        if info is None:
            if exp.resume_ignore_no_checkpoint:
                return None
            where = log_dir / CHECKPOINT_DIR if log_dir is not None else "the log directory"
            found = (
                f"none usable: {'; '.join(passed_over)} (nxd-train ckpt verify {where} checks each)"
                if passed_over
                else "none"
            )
            raise CheckpointError(
                f"exp_manager.resume_if_exists: expected a complete, undamaged checkpoint in "
                f"{where}, found {found}; set exp_manager.resume_ignore_no_checkpoint: True (on the "
                "command line +exp_manager.resume_ignore_no_checkpoint=True where the file lacks "
                "the key) to start a new run instead"
            )
    return Resume.of_checkpoint(info, weights_only)


def _say_passed_over(passed_over: list[str], info: CheckpointInfo | None) -> None:
    """The newer checkpoints passed over, as latest_checkpoint says them."""
    fallback = f"using {info.path.name}" if info is not None else "no complete checkpoint remains"
    for reason in passed_over:
        warnings.warn(f"skipping a checkpoint: {reason}; {fallback}", CheckpointWarning, stacklevel=3)


def _new_run(path: Path, why: str) -> None:
    """No checkpoint to start from at `path` (resume_from_checkpoint_optional): a new run, said once."""
    warnings.warn(
        f"exp_manager.resume_from_checkpoint: {path} {why}; starting a new run (resume_from_checkpoint_optional)",
        CheckpointWarning,
        stacklevel=3,
    )


def _neox(path: Path, weights_only: bool) -> Resume | None:
    """The GPT-NeoX checkpoint at `path` as a start: its weights, and unless only they are asked for
    (finetune), the step after its iteration; None when `path` holds none."""
    found = nxd_ckpt.find_neox_checkpoint(path)
    if found is None:
        return None
    start = 0 if weights_only else nxd_ckpt.neox_iteration(found)
    return Resume(found.folder.resolve(), True, neox=True, start_step=start)


def export_of(
    family: ModelFamily,
    tokenizer_files: dict[str, str] | None = None,
    pad_id: int | None = None,
    *,
    reading: bool = False,
) -> nxd_ckpt.HFExport | str:
    """The model's Hugging Face mapping (with the tokenizer files an export copies and, for a reward
    model, the id its rows are padded with), or why it has none. A soft prompt has no Hugging Face counterpart:
    `reading` weights it starts fresh; an export would drop it, so there is none."""
    if not reading and getattr(family.spec, "soft_prompt_tokens", 0):
        return (
            "no Hugging Face architecture holds a soft prompt (model.soft_prompt): an export would leave out what "
            "the run trained"
        )
    try:
        return replace(nxd_ckpt.HFExport.of(family.hf_mapping(pad_id)), tokenizer_files=dict(tokenizer_files or {}))
    except ModelConfigError as error:
        return str(error)


OUTPUT_LAYER = "lm_head."
"""The prefix of the output layer's weights (both families' name, a score head's too)."""


def head_problem(family: ModelFamily, start: Resume | None) -> str | None:
    """Why the weights at `start` cannot be this run's: a reward model's as a causal LM's base, or a
    causal LM's checkpoint continued as a reward model (a new reward model starts from a causal LM's
    weights with model.weight_init_only)."""
    if start is None:
        return None
    found = start.head
    if found == family.head:
        return None
    if found == "score":
        return (
            f"{start.path}: holds a reward model (its output layer is a score head); expected a causal LM's "
            f"weights as the start of causal LM training (model_alignment_strategy.reward_model trains reward "
            f"models)"
        )
    if not start.weights_only:
        return (
            f"{start.path}: holds a causal LM, which a reward model cannot continue; expected "
            f"model.weight_init_only: True to start the reward model from its weights (the score head then "
            f"starts from its initialisation)"
        )
    return None


SOFT_PROMPT = "model.soft_prompt."
"""The prefix of a soft prompt's weights."""


def fresh_prefixes(family: ModelFamily, start: Resume) -> tuple[str, ...]:
    """The weights a start of `family` from `start` leaves at their initial values: a reward model's score head
    when it starts from a causal LM's weights, and a soft prompt the weights do not hold (prompt tuning starts a
    model's weights with a new prompt; a prompt-tuned checkpoint holds its own)."""
    fresh = () if loads_output_layer(family, start) else (OUTPUT_LAYER,)
    if getattr(family.spec, "soft_prompt_tokens", 0) and (
        start.hugging_face or start.neox or not any(SOFT_PROMPT in key for key in nxd_ckpt.saved_keys(start.path))
    ):
        fresh += (SOFT_PROMPT,)
    return fresh


def start_new_soft_prompt(model: nn.Module | StagedModel, family: ModelFamily, start: Resume | None) -> None:
    """A soft prompt the start weights do not hold (or a run from scratch's) takes init_string's embedding rows of
    the weights the model now holds; every rank calls it."""
    if start is not None and SOFT_PROMPT not in fresh_prefixes(family, start):
        return
    for module in modules_of(model):
        if hasattr(module, "start_soft_prompt"):
            module.start_soft_prompt()


def loads_output_layer(family: ModelFamily, start: Resume) -> bool:
    """Whether the weights at `start` hold this model's output layer: not when a reward model starts
    from a causal LM (its score head keeps its initial values)."""
    return not (family.head == "score" and start.head == "causal_lm")


def initial_weights_problems(family: ModelFamily, initial: Resume | None) -> list[str]:
    """Why a Hugging Face directory or GPT-NeoX checkpoint of initial weights cannot load into `family`'s
    model (its names and shapes only are read), before launch."""
    if initial is None or not (initial.hugging_face or initial.neox):
        return []
    if not loads_output_layer(family, initial):
        family = family.with_head("causal_lm")  # the base's own output layer is read past
    if initial.neox:
        try:
            nxd_ckpt.check_neox_weights(initial.path, family.neox_layout(), family.parameter_shapes())
        except (CheckpointError, ModelConfigError) as error:
            return [
                f"{initial.path}: cannot read this GPT-NeoX checkpoint: {error}"
                if isinstance(error, ModelConfigError)
                else str(error)
            ]
        return []
    export = export_of(family, reading=True)
    if not isinstance(export, nxd_ckpt.HFExport):
        return [f"{initial.path}: cannot import Hugging Face weights: {export}"]
    if differ := _config_differences(initial.path / "config.json", export.config):
        return [
            f"{initial.path / 'config.json'}: describes another architecture than this run's "
            f"({'; '.join(differ)}); expected the same, since weights of one shape can hold other heads"
        ]
    try:
        nxd_ckpt.check_hf_weights(initial.path, export, family.parameter_shapes())
    except CheckpointError as error:
        return [str(error)]
    return []


def _config_differences(path: Path, ours: dict[str, Any]) -> list[str]:
    """`key: theirs there, ours here` for each architecture value both config.json files state."""
    try:
        theirs = json.loads(path.read_text())
    except (OSError, ValueError):
        return []  # a missing or damaged config.json is named by the import itself
    return [
        f"{key}: {theirs[key]} there, {ours[key]} here"
        for key in HF_SHAPE_KEYS
        if isinstance(theirs, dict)
        and theirs.get(key) is not None
        and ours.get(key) is not None
        and theirs[key] != ours[key]
    ]


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
