"""The weights a run starts from: the sharded model seeded, or loaded from weights alone (an nxd checkpoint, a
Hugging Face or GPT-NeoX folder: weight_init_only, a LoRA base), which of them start fresh (a reward model's score
head, a new soft prompt), and why a folder of initial weights cannot load into this model (asked before launch)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nxd_ckpt
import torch
from nxd_align import LoraFamily, base_key, is_adapter_key
from nxd_ckpt import CheckpointError, read_info
from nxd_models import ModelConfigError, ModelFamily, set_aux_loss_weights
from nxd_parallel import GatheredStages, ParallelMesh, StagedModel, build_parallel_model, modules_of
from nxd_precision import prepare_parameters
from torch import nn

from nxd_train.run.checkpointing import Resume, export_of
from nxd_train.run.identity import HF_SHAPE_KEYS
from nxd_train.run.plan import RunPlan

if TYPE_CHECKING:
    from lightning_fabric import Fabric

    from nxd_train.logging.monitor import Monitor

Group = torch.distributed.ProcessGroup | None


def initial_model(
    plan: RunPlan,
    fabric: Fabric,
    mesh: ParallelMesh,
    resume: Resume | None,
    group: Group,
    monitor: Monitor,
    accumulation: int,
) -> nn.Module | StagedModel:
    """The sharded model with its initial weights: seeded, or loaded where the run starts from weights alone (those
    are not drawn first); a soft prompt the weights do not hold starts from its init string."""
    starts_loaded = resume is not None and resume.weights_only and plan.lora is None  # no random values to draw
    kept = fresh_prefixes(plan.family, resume) if starts_loaded else ()  # initialised, not loaded
    loaded = [name for name in plan.family.parameter_shapes() if not name.startswith(kept)] if starts_loaded else ()
    model = sharded_model(plan, fabric, mesh, loaded)
    set_aux_loss_weights(modules_of(model), accumulation)
    if resume is not None and resume.weights_only:
        _load_initial_weights(plan, model, resume, group, monitor)
    if resume is None or resume.weights_only:
        start_new_soft_prompt(model, plan.family, resume)
    return model


def sharded_model(
    plan: RunPlan, fabric: Fabric, mesh: ParallelMesh, loaded: Sequence[str] = ()
) -> nn.Module | StagedModel:
    """The plan's model built in its layout over `mesh`, seeded, its parameters in the plan's precision; the names in
    `loaded` are left for a checkpoint to fill (not drawn)."""
    return build_parallel_model(
        plan.family,
        plan.layout,
        mesh,
        fabric.device,
        seed=plan.launch.seed,
        use_cpu_initialization=plan.launch.use_cpu_initialization,
        prepare=partial(prepare_parameters, policy=plan.policy),
        loaded=loaded,
    )


def gathered_stages(plan: RunPlan, fabric: Fabric, mesh: ParallelMesh) -> GatheredStages:
    """The whole model beside this rank's pipeline stages, built as `sharded_model` builds them (refreshed from the
    stages before each use)."""
    return GatheredStages(
        plan.family,
        plan.layout,
        mesh,
        fabric.device,
        seed=plan.launch.seed,
        prepare=partial(prepare_parameters, policy=plan.policy),
    )


def _load_initial_weights(
    plan: RunPlan, model: nn.Module | StagedModel, resume: Resume, group: Group, monitor: Monitor
) -> None:
    """The initial weights from an nxd checkpoint or a Hugging Face directory (weight_init_only)."""
    started = time.perf_counter()
    lora = plan.lora
    if lora is not None and plan.adapters.from_checkpoint:
        load_base(plan, lora, model, resume.path, group)
        load_adapters(model, resume.path, lora, group)
    else:
        load_weights(model, resume, plan.family, group, lora)
    monitor.info(f"initial weights from {resume.path}{load_time(started, plan)}")


def load_time(started: float, plan: RunPlan) -> str:
    return f" in {time.perf_counter() - started:.2f} s" if plan.checkpoints.time_loads else ""


def load_base(plan: RunPlan, lora: LoraFamily, model: nn.Module | StagedModel, checkpoint: Path, group: Group) -> None:
    """The base weights under the adapters of LoRA checkpoint `checkpoint`, when it does not hold them
    unmerged: from the plan's base source; none is needed when the run that saved it started from
    the seeded initialisation (which this run repeats)."""
    if holds_frozen_base(checkpoint):
        return
    if (source := plan.adapters.base_source) is None:
        saved_config = read_info(checkpoint).extra.get("config", {})
        if saved_config.get("exp_manager", {}).get("resume_from_checkpoint") is None:
            return
        raise CheckpointError(
            f"{checkpoint}: holds LoRA adapters without their base model (saved without "
            "save_lora_base); expected the base in exp_manager.resume_from_checkpoint (continuing "
            "a run) or in model.model_config as a Hugging Face directory (load_lora_from_ckpt)"
        )
    load_weights(model, source, plan.family, group, lora)


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
