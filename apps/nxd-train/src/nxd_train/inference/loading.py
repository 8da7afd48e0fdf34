"""A trained run stood up for inference (`nxd-train generate`, `nxd-train eval`): the run's newest complete
checkpoint (a LoRA run's adapters on the base it started from), or without one the weights
`exp_manager.resume_from_checkpoint` names (an nxd checkpoint, a Hugging Face or GPT-NeoX folder), loaded into
the config's model at its tensor-parallel layout, on as many processes as that layout has. The other parallel
dimensions serve training only, so the weights are gathered out of them (said once); the tokenizer is the
run's own.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from lightning_fabric import Fabric
from nxd_ckpt import newest_usable
from nxd_config import NxdConfig
from nxd_data import TextTokenizer
from nxd_models import ModelFamily
from nxd_models.decoding import decoding_cache, decoding_logits, prepare_for_decoding
from nxd_parallel import ParallelDims
from torch import nn

from nxd_train.checks.preflight import plan_run
from nxd_train.logging.log_dir import CHECKPOINT_DIR, optional_path, resumable_log_dir
from nxd_train.run.checkpointing import Resume
from nxd_train.run.initial_weights import load_adapters, load_weights, start_new_soft_prompt
from nxd_train.run.plan import RunPlan
from nxd_train.run.state import forward_autocast
from nxd_train.run.tokenizers import run_tokenizer


class InferenceError(Exception):
    """A run that cannot be loaded or evaluated (no checkpoint, lm-eval stopped); the message says what to do."""


@dataclass
class LoadedRun:
    """A trained model ready to score and sample, and what inference needs of its run."""

    plan: RunPlan
    fabric: Fabric
    model: nn.Module
    tokenizer: TextTokenizer
    weights: Path
    """The checkpoint or folder the weights came from."""
    passed_over: tuple[str, ...] = ()
    """What is wrong with each newer checkpoint of the run that was passed over for `weights`."""

    @property
    def family(self) -> ModelFamily:
        return self.plan.family

    @property
    def context(self) -> int:
        """Positions the model was trained on: no prompt and continuation goes beyond them."""
        return self.plan.seq_length

    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer has (the output layer's padding rows beyond them are never chosen)."""
        return self.plan.data.vocab_size

    @property
    def first(self) -> bool:
        """The process that writes outputs and talks to the user."""
        return self.fabric.global_rank == 0

    def logits(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache: object | None) -> torch.Tensor:
        """Logits of tokens continuing `cache` (None: a whole prefix from position 0), without gradients."""
        with torch.no_grad(), forward_autocast(self.fabric, self.plan.policy)():
            return decoding_logits(
                self.model, input_ids.to(self.fabric.device), position_ids.to(self.fabric.device), cache
            )

    def new_cache(self) -> object:
        return decoding_cache(self.model)


def inference_config(cfg: NxdConfig) -> NxdConfig:
    """`cfg` as inference reads it: its start weights only (resume_from_checkpoint's, for the run's newest
    checkpoint to go on), at the tensor-parallel layout alone (one replica, no pipeline or context split, no
    sharded optimizer), writing no checkpoint."""
    exp, ds, data = cfg.exp_manager, cfg.distributed_strategy, cfg.data
    tp = ds.tensor_model_parallel_size
    eager = cfg.model.fusions.model_copy(update={"torch_compile": False})  # a cache's growing keys would recompile
    update = {
        "exp_manager": exp.model_copy(
            update={"resume_if_exists": False, "create_checkpoint_callback": False, "require_empty_log_dir": False}
        ),
        "model": cfg.model.model_copy(
            update={"weight_init_only": True, "activations_checkpoint_granularity": None, "fusions": eager}
        ),
        "trainer": cfg.trainer.model_copy(update={"devices": tp, "num_nodes": 1}),
        "distributed_strategy": ds.model_copy(
            update={
                "pipeline_model_parallel_size": 1,
                "context_parallel_size": 1,
                "virtual_pipeline_model_parallel_size": 1,
                "expert_model_parallel_size": 1,
                "zero1": False,
                "sequence_parallel": False,
            }
        ),
        "data": data.model_copy(update={"global_batch_size": data.micro_batch_size}),
    }
    return cfg.model_copy(update=update)


def layout_note(cfg: NxdConfig) -> str | None:
    """What inference leaves out of the config's layout, in one line (None: nothing)."""
    ds = cfg.distributed_strategy
    dropped = [
        f"{name} {size}"
        for name, size in (
            ("pipeline", ds.pipeline_model_parallel_size),
            ("context", ds.context_parallel_size),
            ("expert", ds.expert_model_parallel_size),
            ("data", cfg.data_parallel_size),
        )
        if size > 1
    ]
    if not dropped:
        return None
    return (
        f"inference runs at tensor parallel {ds.tensor_model_parallel_size} on "
        f"{ds.tensor_model_parallel_size} process(es): the weights are gathered out of the training layout's "
        f"{', '.join(dropped)} (those split training's work, not one forward's)"
    )


def load_run(cfg: NxdConfig, cache_dir: Path) -> LoadedRun:
    """Launch the layout's processes and load the run's weights into its model; PreflightError for a config that
    would not run, InferenceError when there are no weights to load."""
    from nxd_train.run.initial_weights import sharded_model
    from nxd_train.run.setup import launch_processes

    plan = plan_run(inference_config(cfg), cache_dir)
    exp = cfg.exp_manager
    folder = resumable_log_dir(optional_path(exp.explicit_log_dir), optional_path(exp.exp_dir), exp.name or cfg.name)
    newest, passed_over = newest_usable(folder / CHECKPOINT_DIR)
    start, lora = plan.resume, plan.lora
    if newest is None and start is None and passed_over:
        raise InferenceError(
            f"no usable checkpoint to load under {folder}: {'; '.join(passed_over)} (nxd-train ckpt "
            f"verify {folder / CHECKPOINT_DIR} checks each); expected a complete, undamaged "
            "checkpoint, or weights named by exp_manager.resume_from_checkpoint"
        )
    if newest is None and start is None:
        raise InferenceError(
            f"no checkpoint to load: expected a complete checkpoint of the run under {folder} (train "
            "it with exp_manager.create_checkpoint_callback: True) or weights named by "
            "exp_manager.resume_from_checkpoint"
        )
    fabric = launch_processes(plan)
    mesh = ParallelDims(fabric.world_size, tp=plan.launch.parallel.tp).build_mesh(fabric.device.type)
    model = sharded_model(plan, fabric, mesh)
    adapters = newest.path if newest is not None else start.path if lora and plan.adapters.from_checkpoint else None
    if lora is not None and adapters is not None:  # the base the run started from, then the checkpoint's adapters
        base = plan.adapters.base_source or (None if plan.adapters.from_checkpoint else start)
        if base is not None:  # else the seeded initial base, as the run that saved it had (or the base it holds)
            load_weights(model, base, plan.family, None, lora)
        load_adapters(model, adapters, lora, None)
    else:  # the newest checkpoint, or the start weights alone (a LoRA run's adapters as initialised: the base's)
        source = Resume.of_checkpoint(newest, weights_only=True) if newest is not None else start
        load_weights(model, source, plan.family, None, lora)
        start_new_soft_prompt(model, plan.family, source)
    prepare_for_decoding(model)
    tokenizer = run_tokenizer(cfg.data, cache_dir, cfg.model.trust_remote_code)
    return LoadedRun(
        plan, fabric, model, tokenizer, newest.path if newest is not None else start.path, tuple(passed_over)
    )


def say(run: LoadedRun, line: str) -> None:
    """A line for the user from the first process."""
    if run.first:
        print(line, file=sys.stderr, flush=True)
