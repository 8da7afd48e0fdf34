"""Problems of a run's keys and sizes that a look at the config (and its log folder) finds: what this release
leaves out, the optimizer's and torch.compile's limits, an earlier run in the folder, and a sample index or a
model too large to build."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from nxd_align import LoraFamily
from nxd_config import NxdConfig
from nxd_models import GPTConfig, ModelFamily

from nxd_train.checks.data_keys import unavailable_data_keys
from nxd_train.logging.log_dir import LOCK_FILE, changed_keys, earlier_config, earlier_records
from nxd_train.run.model_specs import training_method


def not_in_this_release(cfg: NxdConfig) -> list[str]:
    found = []
    if (alignment := cfg.model_alignment_strategy) is not None:
        if alignment.method is None and alignment.peft is None:
            found.append(
                "model_alignment_strategy: expected a method (sft, dpo, orpo, kto, reward_model, grpo) or peft, "
                "found an empty section; remove it to pretrain"
            )
        if alignment.reward_model is not None and alignment.peft is not None:
            found.append(
                "model_alignment_strategy.peft: not available with reward_model (the score head trains beside "
                "the adapters, which LoRA checkpoints do not hold yet); expected no peft block"
            )
        if (peft := alignment.peft) is not None and peft.save_lora_base and peft.merge_lora:
            found.append(
                "model_alignment_strategy.peft: save_lora_base and merge_lora both write the base weights "
                "of a checkpoint; expected at most one of them True"
            )
    method = training_method(cfg)
    documents = method == "grpo" and cfg.data.train_dir is None and bool(cfg.data.label_prefixes)  # prompt documents
    return found + compile_problems(cfg) + unavailable_data_keys(cfg.data, method is not None, documents)


def compile_problems(cfg: NxdConfig) -> list[str]:
    """The layouts compiled decoder blocks cannot take yet, by name: torch.compile over tensor-parallel
    blocks fails inside DTensor's backward (with recomputation or with a transformers model) or drops
    the embedding's gradient (a transformers model entering sequence parallelism)."""
    tp = cfg.distributed_strategy.tensor_model_parallel_size
    if not cfg.model.fusions.torch_compile or tp == 1:
        return []
    return [
        f"model.fusions.torch_compile: not available with tensor parallelism (distributed_strategy."
        f"tensor_model_parallel_size: {tp}); expected one of them off"
    ]


def optimizer_problems(cfg: NxdConfig) -> list[str]:
    optim = cfg.model.optim
    found = []
    if optim.name == "adafactor" and optim.relative_step and optim.sched is not None:
        found.append(
            "model.optim.sched: adafactor with relative_step computes its own learning rate; "
            f"expected no sched, found {optim.sched.name}"
        )
    return found


SAMPLE_INDEX_BYTES = 20
"""Bytes per training sample of Megatron's indices (shuffle entry, sample start, and documents)."""


MAX_PARAMETERS = 10**13


MAX_LAYERS = 4096


def earlier_run_problems(folder: Path, cfg: NxdConfig) -> list[str]:
    """An earlier run's records in the explicit log directory of a run that does not resume it: refused, naming
    the keys that changed (a new run there would write over its config.yaml, metrics.csv and checkpoints)."""
    if not (records := earlier_records(folder)):
        return []
    if (previous := earlier_config(folder)) is not None:
        changes = list(itertools.islice(changed_keys(previous, cfg.model_dump(mode="json", by_alias=True)), 6))
        more = "; and more" if len(changes) > 5 else ""
        what = f"keys changed since: {'; '.join(changes[:5])}{more}" if changes else "the same config"
    else:
        what = "no config.yaml to compare"
    return [
        f"exp_manager.explicit_log_dir: {folder} holds an earlier run's {', '.join(records)} ({what}); this run "
        "does not resume it and would write over them: expected a new folder. Name another "
        "exp_manager.explicit_log_dir, continue that run (exp_manager.resume_if_exists=True), or write "
        "exp_manager.require_empty_log_dir=False to write over its records"
    ]


def files_in(folder: Path) -> str:
    """What `folder` holds, in a few words ('' when it is missing or empty; the run lock file counts for
    nothing)."""
    if not folder.is_dir():
        return ""
    names = sorted(p.name for p in folder.iterdir() if p.name != LOCK_FILE)
    if not names:
        return ""
    more = ", ..." if len(names) > 3 else ""
    return f"{len(names)} entr{'y' if len(names) == 1 else 'ies'} ({', '.join(names[:3])}{more})"


def sample_index_problem(cfg: NxdConfig, train_samples: int) -> str | None:
    """Why the Megatron sample index of `train_samples` samples cannot be built on this machine (more
    than half its memory), before anything is built; None for other data or when it fits."""
    if cfg.data.train_dir is not None or cfg.model_alignment_strategy is not None:
        return None  # records and Hugging Face data are read as they are, epoch after epoch
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    needed = train_samples * SAMPLE_INDEX_BYTES
    if needed <= memory // 2:
        return None
    return (
        f"trainer.max_steps: {cfg.trainer.max_steps:,} steps x data.global_batch_size {cfg.global_batch_size:,} = "
        f"{train_samples:,} samples; their index takes about {needed / 2**30:,.0f} GiB, expected at most half of "
        f"this machine's {memory / 2**30:,.0f} GiB memory (fewer steps or a smaller global batch)"
    )


def model_size_problem(cfg: NxdConfig, family: ModelFamily | LoraFamily) -> str | None:
    """Why the model is beyond what nxd builds (counted from its sizes, before any module exists)."""
    spec = getattr(family, "base", family).spec
    if isinstance(spec, GPTConfig):
        layers, hidden, ffn, vocab = spec.num_layers, spec.hidden_size, spec.ffn_size, spec.padded_vocab_size
        attention = hidden * spec.head_dim * (2 * spec.num_attention_heads + 2 * spec.kv_heads)
        source = "model"
    else:
        layers, hidden, vocab = spec.num_hidden_layers, spec.hidden_size, spec.vocab_size
        ffn, attention, source = spec.intermediate_size, 4 * spec.hidden_size**2, "model.model_config"
    if layers > MAX_LAYERS:
        return (
            f"model.num_layers: expected at most {MAX_LAYERS} decoder layers (the largest published models have "
            f"under 200; building more takes minutes before the first step), found {layers:,}"
        )
    parameters = 2 * vocab * hidden + layers * (attention + 3 * hidden * ffn)
    if parameters > MAX_PARAMETERS:
        return (
            f"{source}: hidden_size {hidden:,}, {layers:,} layers, ffn {ffn:,} and vocabulary {vocab:,} make about "
            f"{parameters:.1e} parameters; expected at most {MAX_PARAMETERS:.0e} (a hundred times the largest "
            "published models)"
        )
    return None
