"""The typed NxDT-dialect config: `NxdConfig` and its sections."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel

from ._base import OneLine, Section, Status, key, key_meta
from .alignment import AlignmentConfig
from .data import DataConfig
from .distributed import DistributedStrategyConfig
from .exp_manager import ExpManagerConfig, no_credentials
from .inference import EvalConfig, GenerateConfig, TuneConfig
from .model import ModelConfig
from .precision import PrecisionConfig
from .trainer import TrainerConfig

RUNTIME = "nxd-precision"
_NEURON_NOTE = "mapped to the Neuron runtime's environment on Neuron devices only"


class NxdConfig(Section):
    """A whole, validated nxd config. Immutable: derive a new one with `load_config` overrides."""

    name: OneLine = key("nxd", "Experiment name.", by="nxd-train")
    model_source: Literal["megatron", "hf"] = key(
        "megatron",
        "megatron: the Megatron-style model built from model keys; hf: a Hugging Face "
        "architecture from model.model_config.",
        by="nxd-models",
    )
    seed: int = key(
        1234,
        "Seed of every random number generator (per rank offsets derived); below 2**32 (numpy's).",
        by="nxd-train",
        ge=0,
        lt=2**32,
    )
    trainer: TrainerConfig = key(TrainerConfig(), "Loop length, logging, validation, clipping.")
    exp_manager: ExpManagerConfig = key(ExpManagerConfig(), "Log directory, checkpoints, resume.")
    distributed_strategy: DistributedStrategyConfig = key(DistributedStrategyConfig(), "Parallel layout.")
    data: DataConfig = key(DataConfig(), "Data, batch sizes and tokenizer.")
    model: ModelConfig = key(ModelConfig(), "Architecture, fusions, memory and optimizer.")
    precision: PrecisionConfig = key(PrecisionConfig(), "Dtype policy.")
    model_alignment_strategy: AlignmentConfig | None = key(
        None,
        "Fine-tuning method (sft, dpo, orpo, kto, reward_model) and LoRA. Older spelling: data.alignment_strategy.",
    )
    generate: GenerateConfig = key(
        GenerateConfig(),
        "What nxd-train generate samples.",
        status=Status.EXTENSION,
        note="GPT-NeoX's text generation keys (generate.py)",
    )
    eval: EvalConfig = key(
        EvalConfig(),
        "What nxd-train eval benchmarks.",
        status=Status.EXTENSION,
        note="GPT-NeoX's eval_tasks and eval_results_prefix (eval.py)",
    )
    tune: TuneConfig = key(
        TuneConfig(),
        "What nxd-train tune searches.",
        status=Status.EXTENSION,
        note="GPT-NeoX's DeepSpeed autotuning block",
    )
    compiler_flags: str | None = key(
        None, "Neuron compiler flags (NEURON_CC_FLAGS).", by=RUNTIME, status=Status.NEURON_ONLY, note=_NEURON_NOTE
    )
    compiler_cache_url: Annotated[str | None, AfterValidator(no_credentials)] = key(
        None, "Neuron compiled-artifact cache.", by=RUNTIME, status=Status.NEURON_ONLY, note=_NEURON_NOTE
    )
    aync_exec_max_inflight_requests: int | None = key(
        None,
        "Neuron runtime queue depth (the reference's spelling).",
        by=RUNTIME,
        status=Status.NEURON_ONLY,
        note=_NEURON_NOTE,
        ge=1,
    )
    bucket_size_collectives: int | None = key(
        None, "Neuron collectives bucket size in MB.", by=RUNTIME, status=Status.NEURON_ONLY, note=_NEURON_NOTE, ge=1
    )
    neuron_rt_exec_timeout: int | None = key(
        None,
        "Neuron runtime execution timeout in seconds.",
        by=RUNTIME,
        status=Status.NEURON_ONLY,
        note=_NEURON_NOTE,
        ge=1,
    )
    neuron_experimental_compress_rg: bool | None = key(
        None, "Neuron compressed replica groups.", by=RUNTIME, status=Status.NEURON_ONLY, note=_NEURON_NOTE
    )

    # ------------------------------------------------------------------ derived quantities

    @property
    def world_size(self) -> int:
        return self.trainer.devices * self.trainer.num_nodes

    @property
    def model_parallel_size(self) -> int:
        """tp * pp * cp: the processes that hold one replica of the model."""
        ds = self.distributed_strategy
        return ds.tensor_model_parallel_size * ds.pipeline_model_parallel_size * ds.context_parallel_size

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // self.model_parallel_size

    @property
    def global_batch_size(self) -> int:
        return self.data.global_batch_size or self.data.micro_batch_size * self.data_parallel_size

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.global_batch_size // (self.data.micro_batch_size * self.data_parallel_size)

    @property
    def seq_length(self) -> int | None:
        return self.data.seq_length or self.model.encoder_seq_length

    def set_keys_with_status(self, status: Status) -> list[str]:
        """Dotted keys the user wrote whose status is `status` (e.g. the Neuron-only ones)."""
        return [path for path, _, field_status in _walk_set(self, "") if field_status == status]


def _walk_set(model: BaseModel, prefix: str) -> Iterator[tuple[str, object, str]]:
    for name, field in type(model).model_fields.items():
        if name not in model.model_fields_set:
            continue
        value = getattr(model, name)
        path = f"{prefix}{field.alias or name}"
        yield path, value, str(key_meta(field).get("status", Status.HONOURED))
        if isinstance(value, BaseModel):
            yield from _walk_set(value, path + ".")


__all__ = ["NxdConfig", "Section", "Status"]
