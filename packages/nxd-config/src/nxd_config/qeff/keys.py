"""Every key of QEfficient's fine-tuning config (`model`, `dataset`, `training`, `optimizers`, `scheduler`,
`callbacks`, and the `dpo` section of its DPO work), with QEfficient's default and what nxd does with it.

The list is the union of QEfficient's configuration reference and the dataclasses of its experimental
fine-tuning code (`QEfficient/finetune/experimental/core/config_manager.py`), so files written for either
load; where the two spell a key differently (`optimizer` / `optimizer_name`, `dtype` / `torch_dtype`) both
are read. Each key is **mapped** (translated onto nxd's keys, `consumer`), **notice** (accepted; set away
from QEfficient's default it gets a notice saying why it changes nothing here) or **refused** (accepted only
at QEfficient's default; otherwise an error that says why). The key table in docs/config-reference.md is
generated from these entries (`python -m nxd_config.qeff.table`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..neox.keys import KeyStatus

SECTIONS = ("model", "dataset", "training", "optimizers", "scheduler", "callbacks", "dpo")
OWN_SECTIONS = ("dataset", "training", "optimizers", "scheduler", "callbacks")
"""The sections that make a file QEfficient's (NxDT files have a `model` section too)."""


@dataclass(frozen=True)
class QeffKey:
    name: str
    """`section.key` (nested blocks dotted further: `model.peft_config.lora_r`)."""
    default: Any
    status: KeyStatus
    consumer: str
    note: str


M, N, R = KeyStatus.MAPPED, KeyStatus.NOTICE, KeyStatus.REFUSED
_UNUSED = "QEfficient's code does not read it either"
_LOADER = "a DataLoader setting; nxd's loader reads records in the training process (data.num_workers sets workers)"
_DDP = "nxd's data parallelism (FSDP2) has no such setting"

# fmt: off
_ENTRIES: tuple[tuple[str, Any, KeyStatus, str, str], ...] = (
    # ----------------------------------------------------------------------------- model
    ("model.model_type", "hf", M, "model_source", "hf only: a Hugging Face model (custom registered classes refused)"),
    ("model.auto_class_name", "AutoModelForCausalLM", M, "model_alignment_strategy",
     "AutoModelForCausalLM; AutoModelForSequenceClassification trains a reward model on preference records"),
    ("model.model_name", "HuggingFaceTB/SmolLM-135M", M,
     "model.model_config, exp_manager.resume_from_checkpoint, data.tokenizer.type",
     "a local folder, or a hub id fetched through huggingface_hub's cache (HF_HUB_OFFLINE honoured)"),
    ("model.tokenizer_name", None, M, "data.tokenizer.type", "falls back to model_name"),
    ("model.load_in_4bit", False, M, "", "true (QLoRA) needs bitsandbytes on a CUDA device; refused elsewhere"),
    ("model.use_cache", False, N, "", "the key/value cache serves generation; training never reads it"),
    ("model.attn_implementation", "sdpa", M, "",
     "sdpa and eager compute the same attention, which nxd runs through torch's SDPA; other kernels get a notice"),
    ("model.device_map", None, N, "",
     "nxd places the model itself: pipeline stages are distributed_strategy.pipeline_model_parallel_size "
     "(training.pp_degree)"),
    ("model.use_peft", True, M, "model_alignment_strategy.peft", "false: every weight trains"),
    ("model.peft_config.lora_r", 8, M, "model_alignment_strategy.peft.lora_rank", ""),
    ("model.peft_config.lora_alpha", 16, M, "model_alignment_strategy.peft.lora_alpha", ""),
    ("model.peft_config.lora_dropout", 0.1, M, "model_alignment_strategy.peft.lora_dropout", ""),
    ("model.peft_config.target_modules", ["q_proj", "v_proj"], M, "model_alignment_strategy.peft.target_modules",
     "transformers' module names"),
    ("model.peft_config.bias", "none", M, "model_alignment_strategy.peft.lora_bias", "none, all or lora_only"),
    ("model.peft_config.task_type", "CAUSAL_LM", M, "", "CAUSAL_LM (SEQ_CLS with a sequence classifier)"),
    ("model.peft_config.peft_type", "LORA", M, "", "LORA only; IA3 and others refused"),
    # ----------------------------------------------------------------------------- dataset
    ("dataset.tokenizer_name", None, M, "data.tokenizer.type", "falls back to model.model_name"),
    ("dataset.dataset_type", "sft_dataset", M, "data.dataset.kind",
     "sft_dataset: prompt and completion; seq_completion: the same, or one text learned whole when there is no "
     "completion; dpo_dataset: preference pairs"),
    ("dataset.dataset_name", "yahma/alpaca-cleaned", M, "data.dataset.path",
     "a hub id (through datasets' cache) or a local folder laid out like a hub dataset repository"),
    ("dataset.json_file_path", None, M, "data.dataset.path", "a json / jsonl file; wins over dataset_name"),
    ("dataset.config_name", "default", M, "data.dataset.name", "the dataset's configuration"),
    ("dataset.dataset_subset", "default", M, "data.dataset.name", "config_name's older spelling"),
    ("dataset.train_split", "train", M, "data.dataset.train_split", ""),
    ("dataset.test_split", "test", M, "data.dataset.validation_split", "evaluated on; missing: split_ratio decides"),
    ("dataset.split_ratio", 0.8, M, "data.dataset.split_ratio",
     "the training share of the train split when the test split is missing"),
    ("dataset.dataset_num_samples", -1, M, "data.dataset.num_samples", "-1: every row"),
    ("dataset.data_seed", 42, M, "data.dataset.seed", "shuffles the rows and seeds the split"),
    ("dataset.seed", None, M, "data.dataset.seed", "data_seed's spelling in QEfficient's example config"),
    ("dataset.remove_samples_with_empty_columns", True, M, "data.dataset.drop_empty",
     "drops rows whose template columns are empty (with a function: rows it formats to nothing)"),
    ("dataset.dataset_disc_style", None, M, "data.dataset.category", "keeps the rows of this category"),
    ("dataset.prompt_template", None, M, "data.dataset.prompt_template",
     "a format string over columns; {'col'} reads as {col} with a notice"),
    ("dataset.completion_template", None, M, "data.dataset.completion_template", ""),
    ("dataset.prompt_func", None, M, "data.dataset.prompt_func",
     "module:function or path/file.py:function; QEfficient's alpaca function is nxd_data.formatters:alpaca_prompt"),
    ("dataset.completion_func", None, M, "data.dataset.completion_func", ""),
    ("dataset.prompt_column", "prompt", M, "data.dataset.prompt_column", "dpo_dataset"),
    ("dataset.chosen_column", "chosen", M, "data.dataset.chosen_column", "dpo_dataset"),
    ("dataset.rejected_column", "rejected", M, "data.dataset.rejected_column", "dpo_dataset"),
    ("dataset.max_seq_length", 512, M, "data.seq_length, model.encoder_seq_length",
     "records are cut to it (QEfficient's code ignores it)"),
    ("dataset.input_columns", ["text"], N, "", f"the templates choose the columns; {_UNUSED}"),
    ("dataset.target_column", None, N, "", f"classification targets; {_UNUSED}"),
    ("dataset.train_batch_size", 1, N, "", f"training.per_device_train_batch_size sets the batch; {_UNUSED}"),
    ("dataset.eval_batch_size", 1, N, "", f"validation runs in training's micro-batches; {_UNUSED}"),
    ("dataset.num_workers", 4, N, "", f"dataloader_num_workers sets workers; {_UNUSED}"),
    ("dataset.collate_fn", "dynamic_padding", N, "",
     "nxd pads each micro-batch to its longest record, as dynamic padding does (training.packing packs rows)"),
    ("dataset.group_by_length", True, M, "data.group_by_length",
     "records drawn grouped by length, as transformers groups them (not with training.packing)"),
    ("dataset.length_column_name", "input_ids", N, "", "nxd groups by the records' token counts"),
    ("dataset.dataloader_num_workers", 1, M, "data.num_workers", ""),
    ("dataset.dataloader_pin_memory", True, N, "", _LOADER),
    ("dataset.dataloader_persistent_workers", True, N, "", _LOADER),
    ("dataset.dataloader_prefetch_factor", 1, N, "", _LOADER),
    ("dataset.dataloader_drop_last", False, N, "", "nxd's sampler never feeds a partial global batch"),
    # ----------------------------------------------------------------------------- training
    ("training.type", "sft", M, "model_alignment_strategy",
     "sft (loss on the completion), base (loss on every token), dpo"),
    ("training.output_dir", "./training_results", M, "exp_manager.explicit_log_dir", ""),
    ("training.overwrite_output_dir", False, M, "exp_manager.require_empty_log_dir",
     "false: a new run refuses a non-empty output_dir; true: it writes beside what is there (nothing is deleted)"),
    ("training.log_file_name", None, N, "", "nxd writes its text log per rank in output_dir"),
    ("training.seed", 42, M, "seed", ""),
    ("training.do_eval", True, M, "trainer.limit_val_batches", "false: no validation"),
    ("training.eval_strategy", "epoch", M, "trainer.val_check_interval, trainer.check_val_every_n_epoch",
     "no, steps or epoch"),
    ("training.eval_steps", 100, M, "trainer.val_check_interval", "with eval_strategy steps"),
    ("training.per_device_train_batch_size", 1, M, "data.micro_batch_size", ""),
    ("training.per_device_eval_batch_size", 1, N, "", "validation runs in training's micro-batches"),
    ("training.gradient_accumulation_steps", 1, M, "data.global_batch_size",
     "global batch = per-device batch x accumulation x data-parallel processes"),
    ("training.num_train_epochs", 1, M, "trainer.max_epochs", ""),
    ("training.max_steps", -1, M, "trainer.max_steps", "above 0: wins over num_train_epochs"),
    ("training.torch_dtype", "fp16", M, "precision.type",
     "fp16: loss-scaled fp16; bf16: bf16 weights with fp32 master weights; fp32"),
    ("training.dtype", None, M, "precision.type", "torch_dtype's spelling in QEfficient's reference"),
    ("training.device", "qaic", N, "", "nxd trains on the device this machine has (CUDA when there is one)"),
    ("training.use_cpu", False, N, "", "nxd trains on CUDA when this machine has it, else on the CPU"),
    ("training.log_level", "info", N, "", "nxd logs steps, validations and checkpoints"),
    ("training.log_on_each_node", True, N, "", "nxd writes a text log per rank"),
    ("training.logging_strategy", "steps", M, "trainer.log_every_n_steps", "steps; no and epoch get a notice"),
    ("training.logging_steps", 10, M, "trainer.log_every_n_steps", ""),
    ("training.save_strategy", "epoch", M, "exp_manager.checkpoint_callback_params",
     "no, steps (every save_steps) or epoch (each epoch's end)"),
    ("training.save_steps", 100, M, "exp_manager.checkpoint_callback_params.every_n_train_steps", ""),
    ("training.save_total_limit", 5, M, "exp_manager.checkpoint_callback_params.save_top_k", "the newest N kept"),
    ("training.metric_for_best_model", "eval_loss", M, "exp_manager.early_stopping_callback_params.monitor",
     "eval_loss (nxd's val_loss) only"),
    ("training.include_num_input_tokens_seen", True, N, "", "nxd logs consumed_samples and tokens per second"),
    ("training.average_tokens_across_devices", True, M, "",
     "true only: nxd divides by the global batch's token count"),
    ("training.fsdp_config", None, R, "", "set distributed_strategy.zero1 (FSDP2 sharding) through nxd's own keys"),
    ("training.deepspeed_config", None, R, "", "nxd does not run DeepSpeed: distributed_strategy.zero1 shards the "
     "optimizer state"),
    ("training.accelerator_config", None, R, "", "an Accelerate setting; nxd launches its processes itself"),
    ("training.ddp_config.ddp_backend", None, N, "", "gloo on CPU, nccl on CUDA (qccl is QAIC's)"),
    ("training.ddp_config.ddp_find_unused_parameters", False, N, "", _DDP),
    ("training.ddp_config.ddp_bucket_cap_mb", 25, N, "", _DDP),
    ("training.ddp_config.ddp_broadcast_buffers", True, N, "", _DDP),
    ("training.ddp_config.ddp_timeout", 1800, M, "distributed_strategy.collective_timeout", ""),
    ("training.restore_callback_states_from_checkpoint", None, N, "", "nxd restores the whole run state on resume"),
    ("training.gradient_checkpointing", False, M, "model.activations_checkpoint_granularity", "full recompute"),
    ("training.gradient_checkpointing_kwargs.preserve_rng_state", True, N, "",
     "nxd's recompute always replays the random state"),
    ("training.gradient_checkpointing_kwargs.use_reentrant", False, N, "", "nxd recomputes without reentrancy"),
    ("training.torch_compile", False, M, "model.fusions.torch_compile", "compiles each decoder layer"),
    ("training.resume_from_checkpoint", None, M, "exp_manager.resume_from_checkpoint",
     "an nxd checkpoint of the run (output_dir/checkpoints/...), resumed exactly"),
    ("training.report_to", "tensorboard", M, "exp_manager.create_tensorboard_logger, create_wandb_logger",
     "tensorboard, wandb (a notice where wandb is not installed), none (trackio gets a notice)"),
    ("training.disable_tqdm", None, N, "", "nxd shows a progress bar on a terminal and plain lines otherwise"),
    ("training.completion_only_loss", None, M, "data.dataset.loss_on_prompt",
     "null or true: the loss covers the completion and EOS; false: every token"),
    ("training.packing", False, M, "model_alignment_strategy.sft.packing",
     "TRL's SFTConfig key: records packed into max_seq_length rows, each attending to itself"),
    ("training.pp_degree", 1, M, "distributed_strategy.pipeline_model_parallel_size", ""),
    ("training.tp_degree", 1, M, "distributed_strategy.tensor_model_parallel_size", ""),
    ("training.ddp_degree", None, M, "", "the data-parallel size: checked against the launched processes"),
    # ----------------------------------------------------------------------------- optimizers, scheduler
    ("optimizers.optimizer_name", "adamw", M, "model.optim.name", "adamw, adam or sgd, in any case"),
    ("optimizers.optimizer", None, M, "model.optim.name", "optimizer_name's spelling in QEfficient's reference"),
    ("optimizers.lr", 5e-5, M, "model.optim.lr", ""),
    ("optimizers.weight_decay", 0.01, M, "model.optim.weight_decay",
     "applied as written (QEfficient's Trainer overrides it with 0)"),
    ("scheduler.scheduler_name", "cosine", M, "model.optim.sched.type", "transformers' schedule names"),
    ("scheduler.scheduler", None, M, "model.optim.sched.type", "scheduler_name's spelling in QEfficient's reference"),
    ("scheduler.warmup_steps", 100, M, "model.optim.sched.warmup_steps", "a step count, or a ratio below 1"),
    ("scheduler.warmup_ratio", 0.1, M, "model.optim.sched.warmup_ratio", "used when warmup_steps is 0"),
    # ----------------------------------------------------------------------------- callbacks
    ("callbacks.early_stopping", None, M, "exp_manager.create_early_stopping_callback", ""),
    ("callbacks.early_stopping.early_stopping_patience", 1, M, "exp_manager.early_stopping_callback_params.patience",
     ""),
    ("callbacks.early_stopping.early_stopping_threshold", 0.0, M,
     "exp_manager.early_stopping_callback_params.min_delta", ""),
    ("callbacks.tensorboard", None, M, "exp_manager.create_tensorboard_logger", ""),
    ("callbacks.json_logger", None, M, "exp_manager.json_log_file", "output_dir/training_logs.jsonl"),
    ("callbacks.json_logger.log_path", None, M, "exp_manager.json_log_file", "a file name in output_dir"),
    ("callbacks.printer", None, N, "", "nxd prints every log line when its output is not a terminal"),
    ("callbacks.enhanced_progressbar", None, N, "", "nxd shows a progress bar with loss and ETA on a terminal"),
    ("callbacks.default_flow", None, N, "", "nxd's loop logs, validates and saves as the training keys say"),
    ("callbacks.train_logger", None, N, "", "nxd writes a text log per rank in output_dir"),
    ("callbacks.qaic_profiler_callback", None, N, "", "profiles QAIC cards; there is none here"),
    ("callbacks.qaic_op_by_op_verifier_callback", None, N, "", "verifies QAIC operations; there is none here"),
    # ----------------------------------------------------------------------------- dpo (DPO work)
    ("dpo.beta", 0.1, M, "model_alignment_strategy.dpo.kl_beta", ""),
    ("dpo.loss_type", ["sigmoid"], M, "model_alignment_strategy.dpo.loss_type", "one of sigmoid, ipo, hinge, robust"),
    ("dpo.label_smoothing", 0.0, M, "model_alignment_strategy.dpo.label_smoothing", ""),
    ("dpo.max_length", 2048, M, "data.seq_length", "prompt and response together"),
    ("dpo.max_prompt_length", None, M, "model_alignment_strategy.dpo.max_prompt_length",
     "null: half of max_length"),
    ("dpo.truncation_mode", "keep_end", M, "model_alignment_strategy.dpo.truncation_mode", ""),
    ("dpo.disable_dropout", True, N, "", "nxd's fine-tuning runs the model without dropout (LoRA's own aside)"),
    ("dpo.precompute_ref_log_probs", False, M, "model_alignment_strategy.dpo.precompute_ref_log_probs", ""),
    ("dpo.sync_ref_model", False, R, "", "nxd's reference is the initial model (TR-DPO's syncing is not built)"),
    ("dpo.ref_model_sync_steps", 512, N, "", "used only with sync_ref_model"),
    ("dpo.reference_model_name", None, R, "", "nxd's reference is the model being trained, before training"),
)
# fmt: on

CALLBACK_ALIASES = {
    "JSONLoggerCallback": "json_logger",
    "Printer": "printer",
    "QAICProfilerCallback": "qaic_profiler_callback",
    "QAICOpByOpVerifierCallback": "qaic_op_by_op_verifier_callback",
}
"""Callback names as QEfficient's reference writes them -> the names its code registers."""

QEFF_KEYS: dict[str, QeffKey] = {
    name: QeffKey(name, default, status, consumer, note) for name, default, status, consumer, note in _ENTRIES
}
