"""Every GPT-NeoX argument, with NeoX's default and what nxd does with it.

The list is the union of NeoX's argument reference (the `NeoXArgs*` classes) and the arguments of its
current source, so files written for either load. Each key is

- **mapped**: translated onto nxd's engine (`consumer` names the nxd keys it becomes; the translator
  refuses by name the values nxd cannot honour, as the note says);
- **notice**: accepted; when a file sets it to something other than NeoX's default, a notice says why it
  changes nothing here;
- **refused**: accepted only at NeoX's default; any other value is an error that says why and what
  would lift it.

The key table in docs/config-reference.md is generated from these entries (`python -m nxd_config.neox.table`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class KeyStatus(StrEnum):
    MAPPED = "mapped"
    NOTICE = "notice"
    REFUSED = "refused"


@dataclass(frozen=True)
class NeoXKey:
    name: str
    group: str
    default: Any
    status: KeyStatus
    consumer: str
    """The nxd keys (or package) the value reaches; empty for keys that reach nothing."""
    note: str


M, N, R = KeyStatus.MAPPED, KeyStatus.NOTICE, KeyStatus.REFUSED

_KERNEL = "a CUDA kernel choice with the same arithmetic; nxd runs torch's own kernels"
_LAUNCHER = (
    "a setting of DeepSpeed's launcher that nxd's launches do not need (`nxd-train launch` writes an sbatch "
    "script or each host's torchrun command)"
)
_DERIVED = "NeoX derives it while it runs (a value written in a file is overwritten); nxd derives its own"
_COMET = "with use_comet (a notice without it)"
_MAMBA_SCAN = (
    "a kernel choice of mamba-ssm for mamba layers; nxd scans with mamba-ssm's fused selective-scan kernel "
    "wherever mamba-ssm is installed on CUDA (whatever this key), and with its PyTorch scan (the same "
    "arithmetic) elsewhere"
)
_MAMBA_KERNEL = (
    "a kernel choice of causal-conv1d / mamba-ssm for mamba layers; nxd's torch convolution and "
    "projections compute the same"
)
_TE_KERNEL = (
    "Transformer Engine's kernel for a layer nxd's own layers compute with the same arithmetic (its fp8 "
    "is the te_fp8_* keys')"
)
_TE_FUSED = (
    "Transformer Engine's fused module in place of NeoX's own layers; nxd computes NeoX's own layers as the "
    "file describes them (TE's module fixes its epsilon and biases and skips NeoX's position and "
    "query/key options)"
)
_TE_DELAYED = (
    "Transformer Engine's delayed scaling (an amax history); torchao's float8 scales each cast from "
    "its operand's current amax, as history 1 with most_recent does: other values are noticed"
)
_RL = (
    "a generation server's (train_impl reinforce with dataset_impl online); nxd samples the completions itself from "
    "the policy, so no data or weight server is used"
)
_REINFORCE = "with train_impl reinforce (model_alignment_strategy.grpo); otherwise a notice"
_FP16 = (
    "NeoX's own copy of a loss scaling setting, not what it hands DeepSpeed: the fp16 block's loss_scale, "
    "loss_scale_window, hysteresis and min_loss_scale set nxd's loss scaling"
)
_PAIRS = (
    "with train_impl dpo or rm: one prefix a split (document i pairs with the other side's i); labels: -100 "
    "where nothing is trained"
)
_DS_TOOL = "a DeepSpeed tool that nxd does not run"

# fmt: off
_ENTRIES: tuple[tuple[str, str, Any, KeyStatus, str, str], ...] = (
    # ----------------------------------------------------------------------------- LR scheduler
    ("lr_decay_style", "LR scheduler", "linear", M, "model.optim.sched.decay_style",
     "NeoX's AnnealingLR formulas (constant, linear, cosine, exponential) as the nxd schedule NeoXAnnealing"),
    ("lr_decay_iters", "LR scheduler", None, M, "model.optim.sched.max_steps",
     "the decay horizon; null: lr_decay_fraction x train_iters, else train_iters"),
    ("lr_decay_fraction", "LR scheduler", None, M, "model.optim.sched.max_steps", "floor(train_iters x fraction)"),
    ("min_lr", "LR scheduler", 0.0, M, "model.optim.sched.min_lr", "a floor after warmup, as NeoX applies it"),
    ("warmup", "LR scheduler", 0.01, M, "model.optim.sched.warmup_ratio",
     "warmup steps are this fraction of the decay horizon"),
    ("override_lr_scheduler", "LR scheduler", False, M, "exp_manager.resume_schedule",
     "config: on resume the schedule is this file's (without it or use_checkpoint_lr_scheduler, as in NeoX, a "
     "resume whose schedule differs from the checkpoint's is refused: same)"),
    ("use_checkpoint_lr_scheduler", "LR scheduler", False, M, "exp_manager.resume_schedule",
     "checkpoint: on resume the learning rate and schedule are the ones the checkpoint recorded"),
    # ----------------------------------------------------------------------------- logging
    ("use_wandb", "Logging", None, M, "exp_manager.create_wandb_logger",
     "true: log to Weights & Biases (nxd-train[wandb]; WANDB_MODE=offline writes the run to disk); null and false: "
     "off (NeoX's null turns it on where an API key is found)"),
    ("wandb_group", "Logging", None, M, "exp_manager.wandb_logger_kwargs.group", ""),
    ("wandb_team", "Logging", None, M, "exp_manager.wandb_logger_kwargs.entity", ""),
    ("wandb_project", "Logging", "neox", M, "exp_manager.wandb_logger_kwargs.project", ""),
    ("wandb_host", "Logging", "https://api.wandb.ai", M, "exp_manager.wandb_logger_kwargs.host", ""),
    ("wandb_init_all_ranks", "Logging", False, N, "",
     "nxd logs the job's global values once, from rank 0; a run per rank would repeat them"),
    ("wandb_run_name", "Logging", None, M, "exp_manager.wandb_logger_kwargs.name", ""),
    ("git_hash", "Logging", None, N, "", "NeoX records its source version; nxd records its versions in checkpoints"),
    ("log_dir", "Logging", None, M, "exp_manager.explicit_log_dir",
     "the run directory when save is not set (nxd keeps text logs, metrics and checkpoints in one directory)"),
    ("tensorboard_dir", "Logging", None, M, "exp_manager.create_tensorboard_logger",
     "turns TensorBoard events on; they are written in the run directory"),
    ("use_comet", "Logging", None, M, "exp_manager.create_comet_logger",
     "true: log to Comet (nxd-train[comet]; without an API key an offline experiment in the run directory's comet "
     "folder, for `comet upload`)"),
    ("comet_workspace", "Logging", None, M, "exp_manager.comet_logger_kwargs.workspace", _COMET),
    ("comet_project", "Logging", None, M, "exp_manager.comet_logger_kwargs.project", _COMET),
    ("comet_experiment_name", "Logging", None, M, "exp_manager.comet_logger_kwargs.name", _COMET),
    ("comet_tags", "Logging", None, M, "exp_manager.comet_logger_kwargs.tags", _COMET),
    ("comet_others", "Logging", None, M, "exp_manager.comet_logger_kwargs.others", _COMET),
    ("comet_experiment", "Logging", None, N, "", "NeoX's handle on the started experiment, not a setting"),
    ("log_interval", "Logging", 100, M, "trainer.log_every_n_steps", ""),
    ("log_grad_pct_zeros", "Logging", False, M, "exp_manager.log_gradient_zeros",
     "pct_grad_zeros/<parameter>, over the whole parameter whatever the layout (NeoX: each rank's own part)"),
    ("log_param_norm", "Logging", False, M, "exp_manager.log_parameter_norm", ""),
    ("log_grad_norm", "Logging", False, M, "exp_manager.log_gradient_norm", ""),
    ("log_optimizer_states", "Logging", False, M, "exp_manager.log_optimizer_states",
     "optimizer_state_norms/<parameter>_<state>: NeoX names a parameter by its index in the optimizer, which changes "
     "with the layout; nxd by its name"),
    ("log_gradient_noise_scale", "Logging", False, M, "exp_manager.gradient_noise_scale.enabled",
     "train/noise_scale by NeoX's estimator, from global gradient norms: every layout, ZeRO included (which NeoX "
     "refuses), gives what one process does"),
    ("gradient_noise_scale_n_batches", "Logging", 5, M, "exp_manager.gradient_noise_scale.n_batches", ""),
    ("gradient_noise_scale_cpu_offload", "Logging", False, M, "exp_manager.gradient_noise_scale.cpu_offload", ""),
    ("memory_profiling", "Logging", False, M, "exp_manager.profiler.memory",
     "a CUDA memory snapshot with allocation stacks per rank (torch.cuda.memory) over the profiled steps; on other "
     "devices the profiler's memory timeline"),
    ("memory_profiling_path", "Logging", None, M, "exp_manager.profiler.memory_dir",
     "null: the log directory's profiler folder (NeoX requires a path)"),
    ("profile", "Logging", False, M, "exp_manager.profiler.enabled",
     "torch.profiler's trace of each rank over the profiled steps, in the log directory's profiler folder "
     "(NeoX writes it in tensorboard_dir); on CUDA the same steps are nsys's capture range (cudaProfilerStart / "
     "Stop), as NeoX's nsys command line expects"),
    ("profile_step_start", "Logging", 10, M, "exp_manager.profiler.start_step",
     "NeoX's iteration counts from 0: nxd's start_step is this + 1 (the same step)"),
    ("profile_step_stop", "Logging", 12, M, "exp_manager.profiler.stop_step",
     "the last iteration profiled, included, as NeoX's nsys range: nxd's stop_step is this + 1"),
    ("peak_theoretical_tflops", "Logging", None, N, "",
     "nxd reports MFU against a matmul ceiling it measures on the device"),
    # ----------------------------------------------------------------------------- model
    ("precision", "Model", None, M, "precision.type",
     "fp32 (also when no precision is set); bfloat16: mixed_precision (bf16 compute, fp32 master weights and "
     "gradient reduction); fp16: fp16 with fp32 master weights and DeepSpeed's loss scaling (the fp16 block)"),
    ("num_layers", "Model", None, M, "model.num_layers", ""),
    ("hidden_size", "Model", None, M, "model.hidden_size", ""),
    ("intermediate_size", "Model", None, M, "model.ffn_hidden_size",
     "NeoX's MLP width rule: the first linear's width (for gated activations 2/3 of it, split into up and gate), "
     "rounded to mlp_multiple_of; mismatched widths are refused"),
    ("mlp_multiple_of", "Model", 1, M, "model.ffn_hidden_size", "see intermediate_size"),
    ("expansion_factor", "Model", None, M, "model.ffn_hidden_size", "width = expansion_factor x hidden_size"),
    ("num_attention_heads", "Model", None, M, "model.num_attention_heads", ""),
    ("num_kv_heads", "Model", None, M, "model.num_kv_heads", ""),
    ("seq_length", "Model", None, M, "model.encoder_seq_length", ""),
    ("sliding_window_width", "Model", None, M, "model.sliding_window_size",
     "NeoX's window w lets a token see keys i - w ... i, which is nxd's (and Mistral's) window of w + 1"),
    ("max_position_embeddings", "Model", None, M, "model.max_position_embeddings", ""),
    ("norm", "Model", "layernorm", M, "model.normalization",
     "layernorm, rmsnorm, scalenorm, non_parametric_layernorm; te_layernorm and te_rmsnorm (Transformer Engine's "
     "kernels) become layernorm and rmsnorm, with a notice"),
    ("layernorm_fusion", "Model", False, N, "", _KERNEL),
    ("rmsnorm_fusion", "Model", False, N, "", _KERNEL),
    ("use_qk_layernorm", "Model", False, M, "model.qk_layernorm",
     "one norm of the queries and keys over (heads, head_dim), as NeoX builds it on one rank (a notice under model "
     "parallelism, where NeoX's layernorm covers each rank's heads apart); refused with te_* norms and with fewer "
     "key/value heads"),
    ("layernorm_epsilon", "Model", 1e-05, M, "model.layernorm_epsilon", "with norm: layernorm"),
    ("rms_norm_epsilon", "Model", 1e-08, M, "model.layernorm_epsilon", "with norm: rmsnorm"),
    ("scalenorm_epsilon", "Model", 1e-08, M, "model.layernorm_epsilon", "with norm: scalenorm"),
    ("pos_emb", "Model", "learned", M, "model.position_embedding_type",
     "learned, rotary, sinusoidal, alibi, rpe (T5's relative buckets, one table for every layer), none"),
    ("rpe_num_buckets", "Model", 32, M, "model.rpe_num_buckets", "with pos_emb: rpe; otherwise a notice"),
    ("rpe_max_distance", "Model", 128, M, "model.rpe_max_distance", "with pos_emb: rpe; otherwise a notice"),
    ("opt_pos_emb_offset", "Model", 0, M, "model.position_embedding_offset",
     "added to the position ids of learned positions, as NeoX's embedding does in a forward without a cache; with "
     "other positions a notice (NeoX's sinusoids ignore the ids)"),
    ("no_weight_tying", "Model", False, M, "model.share_embeddings_and_output_weights", ""),
    ("attention_config", "Model", None, M, "model.attention_layers, model.fusions.flash_attention",
     "expanded as NeoX expands it; global and flash layers are dense causal attention; local, sparse_fixed, "
     "sparse_variable, bigbird and bslongformer layers attend by DeepSpeed's block layouts (not with alibi, which "
     "NeoX's sparse layers skip); gmlp and amlp layers are gMLP blocks as NeoX's GMLPBlock computes them (no "
     "residual, 4 x hidden wide, an ungated activation; whole on every tensor-parallel rank, no sequence or context "
     "parallelism); mamba layers are NeoX's ParallelMambaResidualLayer (whole on every tensor-parallel rank, no "
     "sequence or context parallelism); rwkv layers are NeoX's RWKV-6 RWKVResidualLayer (the same)"),
    ("sparsity_config", "Model", None, M, "model.sparse_attention",
     "each entry NeoX reads becomes model.sparse_attention's; mode, attention and horizontal_global_attention are "
     "noticed (NeoX overrides them); random blocks are drawn with the run's seed"),
    ("num_unique_layers", "Model", None, M, "model.num_unique_layers",
     "Megatron's parameter sharing: the layers run the unique ones' weights in param_sharing_style's order, with "
     "one pipeline stage (NeoX's reference: only with pipe_parallel_size 0; nxd also takes 1, one stage)"),
    ("param_sharing_style", "Model", "grouped", M, "model.param_sharing_style",
     "grouped [1, 2, 1, 2] or spaced [1, 1, 2, 2], as the reference orders them"),
    ("make_vocab_size_divisible_by", "Model", 128, M, "model.make_vocab_size_divisible_by",
     "padded to a multiple of it times the tensor-parallel size, as NeoX pads"),
    ("activation", "Model", "gelu", M, "model.activation",
     "gelu (exact; the tanh form with bias_gelu_fusion), relu, silu, swish (silu), mish, softsign, and the gated "
     "geglu, reglu, swiglu, bilinear, glu (act(gate) x up)"),
    ("mlp_type", "Model", "regular", M, "model.activation",
     "older GPT-NeoX (removed since): regular or llama (a bias-free gated MLP), read as NeoX read it"),
    ("use_flashattn_swiglu", "Model", False, N, "", _KERNEL),
    ("scaled_upper_triang_masked_softmax_fusion", "Model", False, N, "", _KERNEL),
    ("scaled_masked_softmax_fusion", "Model", False, N, "", _KERNEL),
    ("bias_gelu_fusion", "Model", False, M, "model.activation",
     "NeoX's fused bias-gelu computes gelu's tanh approximation, so gelu becomes approx-gelu"),
    ("bias_dropout_fusion", "Model", False, N, "", _KERNEL),
    ("rope_fusion", "Model", False, N, "", _KERNEL),
    ("fp16_lm_cross_entropy", "Model", False, N, "",
     "nxd computes the cross-entropy in fp32 under every precision type, a finer loss than fp16's"),
    ("init_method_std", "Model", 0.02, M, "model.init_method_std", ""),
    ("apply_query_key_layer_scaling", "Model", False, M, "model.apply_query_key_layer_scaling", ""),
    ("use_cpu_initialization", "Model", False, M, "model.use_cpu_initialization", ""),
    ("attention_softmax_in_fp32", "Model", False, N, "",
     "nxd's attention kernels accumulate the softmax in fp32 already"),
    ("rotary_pct", "Model", 1.0, M, "model.rotary_percentage", "rotates the first int(head_dim x rotary_pct) dims"),
    ("rotary_emb_base", "Model", 10000, M, "model.rope_theta", ""),
    ("rotary_save_freqs_buffer", "Model", False, N, "",
     "nxd computes rotary frequencies on the fly and keeps no buffer in checkpoints"),
    ("init_method", "Model", "normal", M, "model.init_method", ""),
    ("output_layer_init_method", "Model", "scaled_normal", M, "model.output_layer_init_method", ""),
    ("gmlp_attn_dim", "Model", 64, M, "model.gmlp_attention_dim",
     "the width of amlp layers' single-head attention; without amlp layers a notice"),
    ("gpt_j_residual", "Model", False, M, "model.transformer_block_type",
     "attention and MLP in parallel: gpt_neox (two norms) or, with gpt_j_tied, gpt_j (one norm)"),
    ("gpt_j_tied", "Model", False, M, "model.transformer_block_type", "see gpt_j_residual"),
    ("use_bias_in_norms", "Model", True, N, "",
     "GPT-NeoX never reads it: its layernorm always has a bias (rmsnorm and scalenorm none), as nxd's"),
    ("use_bias_in_attn_linear", "Model", True, M, "model.attention_bias", ""),
    ("use_bias_in_mlp", "Model", True, M, "model.mlp_bias", ""),
    ("soft_prompt_tuning", "Model", None, M, "model.soft_prompt",
     "with enabled: true, n_tokens (the reference's num_tokens too), init_string and init_range start a learned prompt "
     "before every sequence and freeze every other weight; the prompt takes positions 0 .. n_tokens - 1 and the "
     "labels stay on their tokens (NeoX's own SoftEmbedding cuts the sequence and shifts it against its labels)"),
    ("mamba_selective_scan_fusion", "Model", False, N, "", _MAMBA_SCAN),
    ("mamba_causal_conv_fusion", "Model", False, N, "", _MAMBA_KERNEL),
    ("mamba_inner_func_fusion", "Model", False, N, "", _MAMBA_KERNEL),
    ("mamba_selective_fp32_params", "Model", True, N, "",
     "DeeperSpeed's flag to keep A_log and D out of its fp16/bf16 cast; nxd's scan reads them in fp32 and their "
     "storage follows the precision type (fp32 masters under mixed_precision)"),
    ("mamba_use_bias_in_conv", "Model", True, M, "model.mamba_conv_bias", "with mamba layers; otherwise a notice"),
    ("mamba_use_bias_in_linears", "Model", False, M, "model.mamba_linear_bias",
     "with mamba layers; otherwise a notice"),
    ("output_layer_parallelism", "Model", "column", M, "nxd-parallel",
     "nxd's output layer is column-parallel (over the vocabulary)"),
    ("dim_att", "Model", None, M, "model.rwkv_dim_att",
     "with rwkv layers, the time mix's width (unset: hidden_size, as the reference says); otherwise a notice"),
    ("head_size", "Model", None, M, "model.rwkv_dim_att",
     "NeoX computes it as dim_att / num_attention_heads; any other value is refused"),
    ("ffn_dim", "Model", None, M, "model.rwkv_ffn_size",
     "with rwkv layers, the channel mix's width (unset: intermediate_size, else expansion_factor (3.5) x hidden_size, "
     "rounded down to a multiple of 32, as NeoX computes it); otherwise a notice"),
    ("fused_kernels_build_path", "Model", None, N, "", "nxd builds no fused kernels"),
    ("serve_model_weights", "Model", False, N, "", _RL),
    ("weight_server_port", "Model", 6000, N, "", _RL),
    ("online_dataserver_ips", "Model", "localhost", N, "", _RL),
    ("online_dataserver_ports", "Model", 10000, N, "", _RL),
    ("te_columnparallel", "Model", False, N, "", _TE_KERNEL),
    ("te_rowparallel", "Model", False, N, "", _TE_KERNEL),
    ("te_layernorm_mlp", "Model", False, N, "", _TE_FUSED),
    ("te_mha", "Model", False, N, "", _TE_FUSED),
    ("te_fp8_mha", "Model", False, M, "precision.fp8",
     "FP8 training through torchao's float8 (tensorwise, dynamic scaling) of every decoder layer's linear layers "
     "(TE's fp8 autocast covers each layer's TE modules); needs FP8 matmuls (CUDA 8.9+, ROCm MI300)"),
    ("te_fp8_format", "Model", "hybrid", M, "precision.fp8.format", "hybrid (e4m3 forward, e5m2 gradients) or e4m3"),
    ("te_fp8_wgrad", "Model", True, M, "precision.fp8.weight_gradient",
     "false computes the weight gradient from the high-precision operands"),
    ("te_fp8_amax_history_len", "Model", 1, N, "", _TE_DELAYED),
    ("te_fp8_amax_compute_algo", "Model", "most_recent", N, "", _TE_DELAYED),
    ("te_fp8_margin", "Model", 0, N, "", "0 is torchao's scaling; another margin is refused (torchao has none)"),
    # ----------------------------------------------------------------------------- optimizer
    ("optimizer_type", "Optimizer", "adam", N, "", "NeoX derives it from optimizer.type, which nxd reads"),
    ("use_bnb_optimizer", "Optimizer", False, M, "model.optim.name",
     "adam8bit (bitsandbytes' 8-bit Adam) for optimizer type Adam without use_mup, as NeoX's get_optimizer; with "
     "pos_emb learned, model.position_embedding_norm (NeoX's StableEmbedding table); pip install nxd-train[bnb]. "
     "Blocks are the whole tensor's in every layout (NeoX under ZeRO quantizes DeepSpeed's flat partitions)"),
    ("zero_stage", "Optimizer", None, N, "", "NeoX derives it from zero_optimization.stage, which nxd reads"),
    ("zero_reduce_scatter", "Optimizer", None, N, "", "NeoX derives it from zero_optimization"),
    ("zero_contiguous_gradients", "Optimizer", None, N, "", "NeoX derives it from zero_optimization"),
    ("zero_reduce_bucket_size", "Optimizer", None, N, "", "NeoX derives it from zero_optimization"),
    ("zero_allgather_bucket_size", "Optimizer", None, N, "", "NeoX derives it from zero_optimization"),
    ("lr", "Optimizer", None, N, "", "NeoX takes the learning rate from optimizer.params.lr, which nxd reads"),
    # ----------------------------------------------------------------------------- other
    ("distributed_backend", "Other", "nccl", N, "", "nxd uses nccl on CUDA devices and gloo on the CPU"),
    ("local_rank", "Other", None, N, "", _DERIVED),
    ("rank", "Other", None, N, "", _DERIVED),
    ("lazy_mpu_init", "Other", False, N, "", "for tools that initialise NeoX's model parallelism themselves"),
    ("short_seq_prob", "Other", 0.1, N, "", "NeoX's GPT datasets never read it"),
    ("eod_mask_loss", "Other", False, M, "data.eod_mask_loss", ""),
    ("adlr_autoresume", "Other", False, R, "",
     "NVIDIA's ADLR autoresume service is not in nxd: nxd saves a checkpoint and exits on the preemption signal "
     "(trainer.requeue_signal), requeues the job under Slurm (trainer.auto_requeue), and a run with load "
     "(resume_if_exists) continues from it"),
    ("adlr_autoresume_interval", "Other", 1000, N, "", "used only with adlr_autoresume (refused)"),
    ("seed", "Other", 1234, M, "seed", ""),
    ("onnx_safe", "Other", False, N, "", "an ONNX-exportable spelling of the same exact gelu"),
    ("deepscale", "Other", False, N, "", "DeepSpeed's older name for the deepspeed switch"),
    ("deepscale_config", "Other", None, N, "", "DeepSpeed's older name for its config file; NeoX builds its own"),
    ("deepspeed_mpi", "Other", False, N, "", _LAUNCHER),
    ("deepspeed_slurm", "Other", False, M, "trainer.cluster.scheduler",
     "true: `nxd-train launch` writes an sbatch script whose srun starts one task per process"),
    ("user_script", "Other", None, N, "", _LAUNCHER),
    ("iteration", "Other", None, M, "exp_manager.resume_from_checkpoint",
     "load/global_stepN: that GPT-NeoX checkpoint of load rather than the one `latest` names"),
    ("do_train", "Other", None, N, "", _DERIVED),
    ("do_valid", "Other", None, N, "", _DERIVED),
    ("do_test", "Other", None, N, "", _DERIVED),
    ("save_iters", "Other", None, N, "", _DERIVED),
    ("global_num_gpus", "Other", None, N, "", _DERIVED),
    # ----------------------------------------------------------------------------- parallelism
    ("pipe_parallel_size", "Parallelism", 0, M, "distributed_strategy.pipeline_model_parallel_size",
     "0 and 1 are one stage (NeoX's 0 skips its pipeline engine)"),
    ("model_parallel_size", "Parallelism", 1, M, "distributed_strategy.tensor_model_parallel_size", ""),
    ("pipe_partition_method", "Parallelism", "type:transformer|mlp", M, "model.pipeline_cuts",
     "type:... and uniform: ceil(layers / stages) layers to each stage from the first, as DeepSpeed's balanced "
     "split of equal layers; parameters: balanced by parameter count (the cut moves work, not results)"),
    ("world_size", "Parallelism", None, N, "", _DERIVED),
    ("is_pipe_parallel", "Parallelism", False, N, "", _DERIVED),
    ("sequence_parallel", "Parallelism", False, M, "distributed_strategy.sequence_parallel", ""),
    ("expert_interval", "Parallelism", 2, M, "model.moe.frequency",
     "the older spelling of moe_expert_interval (only 1: nxd counts MoE layers from 1, NeoX from 0)"),
    # ----------------------------------------------------------------------------- text generation
    ("text_gen_type", "Text generation", None, M, "generate.text_gen_type",
     "unconditional, input-file or interactive (nxd-train generate); precompute refused: nxd computes reference "
     "log-probs itself"),
    ("precompute_model_name", "Text generation", None, M, "data.pair_documents / data.example_documents",
     "with dpo or kto: every data prefix's reference log-probs are read from {prefix}_{name} (float32, one per "
     "token, as NeoX's precompute writes them) and no reference model runs"),
    ("temperature", "Text generation", 0.0, M, "generate.temperature", ""),
    ("top_p", "Text generation", 0.0, M, "generate.top_p", ""),
    ("top_k", "Text generation", 0, M, "generate.top_k", ""),
    ("return_logits", "Text generation", False, M, "generate.return_logits", ""),
    ("maximum_tokens", "Text generation", 64, M, "generate.maximum_tokens", ""),
    ("prompt_end", "Text generation", "\n", M, "generate.prompt_end", ""),
    ("sample_input_file", "Text generation", None, M, "generate.sample_input_file", ""),
    ("sample_output_file", "Text generation", "samples.txt", M, "generate.sample_output_file", ""),
    ("num_samples", "Text generation", 1, M, "generate.num_samples", ""),
    ("recompute", "Text generation", False, M, "generate.recompute",
     "true: no key/value cache, the whole prefix for every token"),
    ("eval_results_prefix", "Text generation", "", M, "eval.results_prefix",
     "nxd-train eval writes {prefix}_eval_results_{mm-dd-YYYY-HH-MM-SS}.json, as NeoX's eval.py"),
    ("eval_tasks", "Text generation", None, M, "eval.tasks",
     "lm-evaluation-harness tasks of nxd-train eval (nxd-train[eval])"),
    # ----------------------------------------------------------------------------- mixture of experts
    ("moe_num_experts", "MoE", 1, M, "model.moe.num_experts", "1: dense MLPs; more: dropless MoE layers"),
    ("moe_top_k", "MoE", 1, M, "model.moe.top_k", ""),
    ("moe_router_type", "MoE", "sinkhorn", M, "model.moe.routing_algorithm",
     "topk (softmax affinities, not renormalised); sinkhorn is NeoX's own (routing_algorithm neox_sinkhorn: at most "
     "three iterations from column-normalised costs while training, sigmoid affinities for top-1, softmax for more)"),
    ("moe_expert_interval", "MoE", 1, M, "model.moe.frequency",
     "only 1 (every layer): nxd counts MoE layers from 1, NeoX from 0"),
    ("moe_jitter_eps", "MoE", None, M, "model.moe.jitter_eps",
     "while training, the top-k router reads its input times uniform noise in [1 - eps, 1 + eps), as NeoX's does"),
    ("moe_lbl_in_fp32", "MoE", False, N, "", "current GPT-NeoX never reads it (its MoE has no load-balancing loss)"),
    ("moe_expert_parallel_size", "MoE", 1, M, "distributed_strategy.expert_model_parallel_size", ""),
    ("moe_type", "MoE", "megablocks", M, "model.moe.routing_algorithm",
     "megablocks: NeoX's dropless MoE (the keys above); deepspeed: older NeoX's DeepSpeed MoE, routing_algorithm "
     "deepspeed (DeepSpeed's top-1 / top-2 gate with random token selection and a Gumbel-sampled second expert), "
     "the experts as wide as the dense MLP; moe_router_type and moe_jitter_eps are noticed with it"),
    ("moe_loss_coeff", "MoE", 0.1, M, "model.moe.router_aux_loss_coef",
     "with moe_type: deepspeed, the weight of the layers' summed load-balancing losses (nxd averages over layers, "
     "so it is multiplied by num_layers); NeoX adds it to the loss as a Python number, so its router never "
     "receives that gradient, nxd's does, as DeepSpeed intends"),
    ("moe_train_capacity_factor", "MoE", 1.0, M, "model.moe.capacity_factor",
     "with moe_type: deepspeed and moe_token_dropping; otherwise a notice"),
    ("moe_eval_capacity_factor", "MoE", 1.0, M, "model.moe.eval_capacity_factor",
     "with moe_type: deepspeed and moe_token_dropping; otherwise a notice"),
    ("moe_min_capacity", "MoE", 4, M, "model.moe.min_capacity",
     "with moe_type: deepspeed and moe_token_dropping; otherwise a notice"),
    ("moe_token_dropping", "MoE", False, M, "model.moe.dropless",
     "with moe_type: deepspeed, experts over capacity drop tokens (DeepSpeed keeps all without it); refused with "
     "megablocks, whose MoE nxd follows dropless"),
    ("create_moe_param_group", "MoE", True, N, "", "DeepSpeed's split of the expert weights into optimizer groups of "
     "their own, with the same hyperparameters, so that its engine reduces their gradients over the expert group; "
     "nxd reduces expert gradients itself and updates them as every other weight"),
    ("moe_use_residual", "MoE", True, M, "model.moe.residual",
     "with moe_type: deepspeed, PR-MoE: a dense MLP beside the experts mixed per token by softmax(Linear(hidden, "
     "2)), as DeepSpeed's MoE computes it; with megablocks a notice"),
    ("moe_glu", "MoE", False, M, "model.moe.glu",
     "with moe_type: deepspeed, the experts gate the activation, act(gate(x)) x up(x) (older NeoX never read it; "
     "the reference documents it); with megablocks a notice"),
    ("use_tutel", "MoE", False, N, "", "a kernel choice of DeepSpeed's MoE (Tutel's dispatch) with the same routing "
     "arithmetic; nxd dispatches tokens with its own"),
    ("enable_expert_tensor_parallelism", "MoE", False, N, "", "DeepSpeed's split of each expert's ffn over the "
     "tensor-parallel ranks, the same arithmetic as replicating it; nxd's experts are split over them whenever "
     "tensor parallelism is on"),
    # ----------------------------------------------------------------------------- tokenizer
    ("tokenizer_type", "Tokenizer", "GPT2BPETokenizer", M, "data.tokenizer",
     "GPT2BPETokenizer (vocab_file, merge_file), HFTokenizer (vocab_file: a tokenizer.json), HFGPT2Tokenizer (a "
     "local GPT-2 tokenizer directory), SPMTokenizer (vocab_file: a SentencePiece model file of any name, giving "
     "sentencepiece's ids), CharLevelTokenizer (UTF-8 bytes, 512 ids), TiktokenTokenizer (vocab_file: a tiktoken "
     "encoding name; the nxd-train[tiktoken] extra; offline only from tiktoken's cache)"),
    ("padded_vocab_size", "Tokenizer", None, N, "", _DERIVED + " from the tokenizer and make_vocab_size_divisible_by"),
    # ----------------------------------------------------------------------------- training
    ("data_path", "Training", None, M, "data.data_prefix", "one indexed dataset, cut by split"),
    ("use_shared_fs", "Training", True, N, "", "nxd's first rank builds the index files and the others read them"),
    ("train_data_paths", "Training", None, M, "data.data_prefix.train",
     "blended by train_data_weights; with train_impl kto, data.example_documents.train.documents (one path)"),
    ("valid_data_paths", "Training", None, M, "data.data_prefix.validation", "blended by valid_data_weights"),
    ("test_data_paths", "Training", None, M, "data.data_prefix.test", "blended by test_data_weights"),
    ("train_data_weights", "Training", None, M, "data.data_prefix.train", ""),
    ("valid_data_weights", "Training", None, M, "data.data_prefix.validation", ""),
    ("test_data_weights", "Training", None, M, "data.data_prefix.test", ""),
    ("train_label_data_paths", "Training", None, M, "data.label_prefixes",
     "one label file per train_data_paths entry: each token's label, -100 where nothing is trained"),
    ("valid_label_data_paths", "Training", None, M, "data.label_prefixes",
     "one label file per valid_data_paths entry: each token's label, -100 where nothing is trained"),
    ("test_label_data_paths", "Training", None, M, "data.label_prefixes",
     "one label file per test_data_paths entry: each token's label, -100 where nothing is trained"),
    ("train_reward_data_paths", "Training", None, M, "data.example_documents.train.rewards",
     "with train_impl kto: one reward a document (above 0 desirable, below undesirable; its size scales kto_beta)"),
    ("valid_reward_data_paths", "Training", None, M, "data.example_documents.validation.rewards",
     "with train_impl kto: one reward a document (above 0 desirable, below undesirable; its size scales kto_beta)"),
    ("test_reward_data_paths", "Training", None, M, "data.example_documents.test.rewards",
     "with train_impl kto: one reward a document (above 0 desirable, below undesirable; its size scales kto_beta)"),
    ("pos_train_data_paths", "Training", None, M, "data.pair_documents.train.chosen", _PAIRS),
    ("neg_train_data_paths", "Training", None, M, "data.pair_documents.train.rejected", _PAIRS),
    ("pos_train_label_data_paths", "Training", None, M, "data.pair_documents.train.chosen_labels", _PAIRS),
    ("neg_train_label_data_paths", "Training", None, M, "data.pair_documents.train.rejected_labels", _PAIRS),
    ("pos_valid_data_paths", "Training", None, M, "data.pair_documents.validation.chosen", _PAIRS),
    ("neg_valid_data_paths", "Training", None, M, "data.pair_documents.validation.rejected", _PAIRS),
    ("pos_valid_label_data_paths", "Training", None, M, "data.pair_documents.validation.chosen_labels", _PAIRS),
    ("neg_valid_label_data_paths", "Training", None, M, "data.pair_documents.validation.rejected_labels", _PAIRS),
    ("pos_test_data_paths", "Training", None, M, "data.pair_documents.test.chosen", _PAIRS),
    ("neg_test_data_paths", "Training", None, M, "data.pair_documents.test.rejected", _PAIRS),
    ("pos_test_label_data_paths", "Training", None, M, "data.pair_documents.test.chosen_labels", _PAIRS),
    ("neg_test_label_data_paths", "Training", None, M, "data.pair_documents.test.rejected_labels", _PAIRS),
    ("weight_by_num_documents", "Training", False, M, "data.blend_by_documents",
     "each split's paths weighted by their document counts, the listed weights replaced (as in NeoX)"),
    ("weighted_sampler_alpha", "Training", 1.0, M, "data.blend_by_documents", "the alpha of that weighting"),
    ("data_impl", "Training", "infer", M, "data.data_impl",
     "mmap reads the memory-mapped .bin/.idx files, cached the older indexed format (TNTIDX), infer either "
     "by the file's magic"),
    ("pack_impl", "Training", "packed", M, "data.pack_impl",
     "packed: documents concatenated and cut every seq_length tokens; pack_until_overflow: shuffled whole "
     "documents joined while they fit; unpacked: one document a sample (padding not trained on)"),
    ("dataset_impl", "Training", "gpt2", M, "",
     "gpt2 (one document a sample with train_impl normal or kto) or pairwise (dpo and rm); online (reinforce's "
     "generation server) is a notice: nxd samples reinforce's completions itself"),
    ("train_impl", "Training", "normal", M, "model_alignment_strategy",
     "normal (pretraining, or SFT with label files); dpo, kto (GPT-NeoX's KL estimate from the other half of each "
     "micro-batch) and rm (a score head in place of the LM head); reinforce, model_alignment_strategy.grpo with "
     "GPT-NeoX's baseline (reinforce_leave_one_out, else the last 100 groups' mean), unscaled rewards and its KL "
     "(kl_impl, kl_div_beta), completions of up to half of seq_length, prompts from the label documents; the loss "
     "is averaged over the completion tokens of the global batch (GPT-NeoX divides each micro-batch's sum by its "
     "tokens and its rows); the rewards are nxd's, which the file's translation takes (`nxd-train config "
     "translate`)"),
    ("dpo_fp32", "Training", True, N, "", "nxd takes DPO's log-probs in fp32 (summed in fp64) whatever the precision"),
    ("dpo_reference_free", "Training", False, M, "model_alignment_strategy.dpo.reference_free", ""),
    ("dpo_beta", "Training", 0.1, M, "model_alignment_strategy.dpo.kl_beta", ""),
    ("kto_fp32", "Training", True, N, "", "nxd takes KTO's log-probs in fp32 (summed in fp64) whatever the precision"),
    ("kto_desirable_weight", "Training", 1.0, M, "model_alignment_strategy.kto.desirable_weight", ""),
    ("kto_undesirable_weight", "Training", 1.0, M, "model_alignment_strategy.kto.undesirable_weight", ""),
    ("kto_beta", "Training", 0.1, M, "model_alignment_strategy.kto.beta", ""),
    ("z_loss", "Training", 0.0, M, "model_alignment_strategy.reward_model.z_loss",
     "with train_impl rm: z_loss x (r_chosen^2 + r_rejected^2) added to each pair's loss"),
    ("fp32_reinforce", "Training", True, N, "",
     "nxd takes the log-probs of reinforce's loss in fp32 whatever the precision"),
    ("kl_impl", "Training", "mse", M, "model_alignment_strategy.grpo.kl_estimator",
     "abs, mse and kl (as k1); full (the whole vocabulary's KL) is refused; " + _REINFORCE),
    ("kl_div_beta", "Training", 0.1, M, "model_alignment_strategy.grpo.beta", _REINFORCE),
    ("reinforce_leave_one_out", "Training", False, M, "model_alignment_strategy.grpo.baseline",
     "true: leave_one_out; false: running_mean (the last 100 groups' means); " + _REINFORCE),
    ("allow_chopped", "Training", True, M, "data.allow_chopped",
     "with pack_until_overflow or unpacked: a document longer than seq_length + 1 is cut (true) or left out"),
    ("mmap_warmup", "Training", False, M, "data.skip_warmup", ""),
    ("save", "Training", None, M, "exp_manager.explicit_log_dir",
     "the run directory; checkpoints go to its checkpoints folder"),
    ("s3_path", "Training", None, M, "exp_manager.s3_checkpoints.path",
     "each complete checkpoint uploaded in the background under <s3_path>/<save folder name>/<checkpoint>/, as "
     "NeoX lays it out (nxd-train[s3])"),
    ("s3_chunk_size", "Training", 104857600, M, "exp_manager.s3_checkpoints.chunk_size",
     "bytes per multipart part; a notice without s3_path"),
    ("config_files", "Training", None, N, "", _DERIVED + "; nxd keeps the resolved config in every checkpoint"),
    ("load", "Training", None, M, "exp_manager.resume_from_checkpoint",
     "the same folder as save: resume from its newest complete checkpoint (or the GPT-NeoX one its `latest` "
     "names), or start fresh; another folder: an nxd checkpoint, a GPT-NeoX load folder or checkpoint (its "
     "weights; continued at its iteration unless finetune) or a Hugging Face directory (with finetune); missing "
     "or empty: start fresh"),
    ("checkpoint_validation_with_forward_pass", "Training", False, N, "",
     "nxd checks every checkpoint file against its recorded digest instead (nxd-train ckpt verify)"),
    ("checkpoint_scale", "Training", "linear", M, "exp_manager.checkpoint_callback_params",
     "linear: every checkpoint_factor steps; log: at the powers of checkpoint_factor"),
    ("checkpoint_factor", "Training", None, M, "exp_manager.checkpoint_callback_params.every_n_train_steps", ""),
    ("extra_save_iters", "Training", None, M, "exp_manager.checkpoint_callback_params.save_at_steps",
     "iteration 0 (the untouched initial weights) is not saved"),
    ("no_save_optim", "Training", False, N, "", "GPT-NeoX never reads it (its checkpoints always hold the optimizer)"),
    ("no_save_rng", "Training", False, N, "", "nxd always saves the RNG states: an exact resume needs them"),
    ("no_load_optim", "Training", False, M, "exp_manager.resume_optimizer",
     "false: the weights, iteration and data position are read, the optimizer is fresh and the schedule starts "
     "over, as in NeoX"),
    ("no_load_rng", "Training", False, M, "exp_manager.resume_rng", "false: random states as seeded"),
    ("finetune", "Training", False, M, "model.weight_init_only",
     "load's weights only: new optimizer, step 0"),
    ("batch_size", "Training", None, N, "", _DERIVED + " (the micro batch)"),
    ("train_iters", "Training", None, M, "trainer.max_steps", ""),
    ("train_epochs", "Training", None, M, "trainer.max_epochs", ""),
    ("eval_iters", "Training", 100, M, "trainer.limit_val_batches", ""),
    ("keep_last_n_checkpoints", "Training", None, M, "exp_manager.checkpoint_callback_params.save_top_k",
     "null keeps every checkpoint"),
    ("eval_interval", "Training", 1000, M, "trainer.val_check_interval", ""),
    ("split", "Training", "969, 30, 1", M, "data.splits_string", "train, validation, test by document ranges"),
    ("vocab_file", "Training", None, M, "data.tokenizer", "see tokenizer_type"),
    ("merge_file", "Training", None, M, "data.tokenizer.merge_file", "with GPT2BPETokenizer"),
    ("num_workers", "Training", 2, M, "data.num_workers", ""),
    ("exit_interval", "Training", None, M, "trainer.exit_interval",
     "stops after each multiple of it with exit code 0, as NeoX's sys.exit(), and (unlike NeoX, which saves only on "
     "its checkpoint_factor) with a checkpoint there, so that load resumes from it"),
    ("attention_dropout", "Training", 0.0, M, "model.attention_dropout", ""),
    ("hidden_dropout", "Training", 0.0, M, "model.hidden_dropout", "also the embedding dropout, as in NeoX"),
    ("weight_decay", "Training", 0.1, M, "model.optim.weight_decay",
     "decoupled (NeoX's fused Adam is AdamW); norms and biases take none, as in NeoX"),
    ("checkpoint_activations", "Training", False, M, "model.activations_checkpoint_granularity", "full recompute"),
    ("checkpoint_num_layers", "Training", 1, M, "model.activations_checkpoint_granularity",
     "nxd recomputes layer by layer; more layers per checkpoint only changes memory (a notice)"),
    ("deepspeed_activation_checkpointing", "Training", True, N, "",
     "which implementation recomputes; nxd uses torch's checkpointing"),
    ("contiguous_checkpointing", "Training", False, N, "", "a DeepSpeed memory layout option"),
    ("checkpoint_in_cpu", "Training", False, N, "", "a DeepSpeed memory option (checkpoints kept on the host)"),
    ("synchronize_each_layer", "Training", False, N, "", "a DeepSpeed debugging option (CUDA syncs)"),
    ("profile_backward", "Training", False, N, "", "a DeepSpeed profiling option"),
    ("partition_activations", "Training", False, N, "",
     "DeepSpeed splits recomputed layers' inputs over model-parallel ranks (memory only); nxd's sequence "
     "parallelism shards them"),
    ("clip_grad", "Training", 1.0, N, "", "NeoX derives it from gradient_clipping, which nxd reads"),
    ("hysteresis", "Training", 2, N, "", _FP16),
    ("dynamic_loss_scale", "Training", None, N, "", _FP16),
    ("loss_scale", "Training", None, N, "", _FP16),
    ("loss_scale_window", "Training", 1000.0, N, "", _FP16),
    ("min_scale", "Training", 1.0, N, "", _FP16),
    ("char_level_ppl", "Training", False, M, "trainer.char_level_ppl",
     "validation/lm_loss_char_lvl_ppl and test/...: exp(loss x tokens per character), counted on the samples "
     "evaluated by decoding them with the run's tokenizer, as NeoX counts"),
    ("use_mup", "Training", False, M, "model.mup",
     "mup's rules (MuAdam / MuSGD groups, normal draws / sqrt(width), the readout / width, attention / d) on nxd's "
     "Megatron-style layers; NeoX's LR schedule drops MuAdam's group rates (no width_mult key), nxd keeps them"),
    ("coord_check", "Training", False, M, "model.mup.coord_check",
     "mup's coordinate check at NeoX's widths, with muP and without: coord_check_up / _sp .csv and .png in the "
     "working directory; exits with 0 (NeoX with 1)"),
    ("save_base_shapes", "Training", False, M, "model.mup.save_base_shapes",
     "writes base_shapes_file (mup's format, nxd's parameter names) and exits with 0; NeoX exits with 1"),
    ("base_shapes_file", "Training", None, M, "model.mup.base_shapes_file",
     "read as given (NeoX appends each rank's number; nxd's one file names every parameter of the whole model)"),
    ("mup_init_scale", "Training", 1.0, M, "model.mup.init_scale", ""),
    ("mup_attn_temp", "Training", 1.0, M, "model.mup.attention_temperature",
     "divides the attention scores, as documented (NeoX's code never reads it)"),
    ("mup_output_temp", "Training", 1.0, M, "model.mup.output_temperature",
     "divides the logits, as documented (NeoX's code never reads it)"),
    ("mup_embedding_mult", "Training", 1.0, M, "model.mup.embedding_multiplier",
     "multiplies the embeddings inside the graph (NeoX multiplies them under no_grad, so its gradient skips it)"),
    ("mup_rp_embedding_mult", "Training", 1.0, M, "model.position_embedding_multiplier",
     "learned and sinusoidal positions, with or without use_mup, as NeoX"),
    ("mup_width_scale", "Training", 2, M, "model.mup.width_scale", ""),
    # ----------------------------------------------------------------------------- DeepSpeed config
    ("deepspeed", "DeepSpeed", True, N, "", "nxd runs on native PyTorch distributed, not DeepSpeed"),
    ("train_batch_size", "DeepSpeed", None, M, "data.global_batch_size",
     "any two of the three batch keys give the third; all three must agree (DeepSpeed's rule)"),
    ("train_micro_batch_size_per_gpu", "DeepSpeed", None, M, "data.micro_batch_size", "see train_batch_size"),
    ("gradient_accumulation_steps", "DeepSpeed", 1, M, "data.global_batch_size", "see train_batch_size"),
    ("optimizer", "DeepSpeed", None, M, "model.optim",
     "type Adam / AdamW (decoupled decay, as NeoX's fused Adam), cpu_adam (the same Adam, a notice), sgd, lion, "
     "madgrad_wd and sm3 (NeoX's own steps); onebitadam is refused; params lr, betas, eps (sgd: momentum, "
     "nesterov ...; madgrad_wd: momentum, eps; sm3: momentum, beta, eps, no weight decay as in NeoX)"),
    ("scheduler", "DeepSpeed", None, M, "model.optim.sched",
     "DeepSpeedSchedule: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle (with its momentum cycle) or "
     "LRRangeTest with DeepSpeed's params; DeeperSpeed, NeoX's DeepSpeed, runs the block's scheduler in place of "
     "NeoX's AnnealingLR, so lr_decay_style, warmup and min_lr are noticed"),
    ("fp32_allreduce", "DeepSpeed", False, M, "precision.fp32_grads_cc",
     "gradients accumulated in bf16 (data_types.grad_accum_dtype bf16) are reduced in fp32; every other type "
     "reduces in fp32 already"),
    ("prescale_gradients", "DeepSpeed", False, N, "", "where the gradient average divides; fp32 reduction makes it moot"
     ),
    ("gradient_predivide_factor", "DeepSpeed", 1.0, N, "",
     "where the gradient average divides; fp32 reduction makes it moot"),
    ("sparse_gradients", "DeepSpeed", False, N, "", "DeepSpeed's sparse embedding gradients (same values)"),
    ("fp16", "DeepSpeed", None, M, "precision.type",
     "enabled: precision type fp16, with DeepSpeed's loss scaling from the block (loss_scale 0 dynamic from "
     "2^initial_scale_power, loss_scale_window, hysteresis, min_loss_scale, consecutive_hysteresis); a block "
     "holding type: bfloat16 is read as bf16, as NeoX reads it"),
    ("bf16", "DeepSpeed", None, M, "precision.type", "enabled: mixed_precision"),
    ("amp", "DeepSpeed", None, M, "precision.type",
     "apex's opt levels: O0 fp32, O1 fp16_autocast (fp16 compute by torch.autocast over fp32 weights), O2 fp16 "
     "(fp16 weights, fp32 masters), with apex's dynamic loss scaling (2^16, window 2000, halved at each overflow) "
     "or a static loss_scale; O3 (no master weights) and the level-property overrides are refused by name"),
    ("gradient_clipping", "DeepSpeed", 1.0, M, "trainer.gradient_clip_val",
     "the global gradient norm is clipped to it; NeoX leaves the value 1.0 (its default) out of DeepSpeed's "
     "config, so NeoX itself does not clip at 1.0: nxd does what the key says, with a notice"),
    ("zero_optimization", "DeepSpeed", None, M, "distributed_strategy.zero1",
     "stage 0: replicated; stages 1 and 2: zero1 (optimizer state and gradients sharded); stage 3: zero1 and zero3 "
     "(parameters too, gathered layer by layer); offload_optimizer / offload_param (or cpu_offload / "
     "cpu_offload_params) to the CPU: distributed_strategy.cpu_offload (NVMe is refused); "
     "bucket and overlap settings get a notice"),
    ("curriculum_learning", "DeepSpeed", None, M, "data.curriculum",
     "DeepSpeed's sequence-length curriculum (curriculum_type seqlen; schedule_type fixed_linear, fixed_root or "
     "fixed_discrete with its schedule_config): each step's samples cut to the schedule's length, logged as "
     "curriculum_seqlen; not with pipeline parallelism (stages exchange one fixed shape)"),
    ("curriculum_seqlen", "DeepSpeed", 0, N, "", _DERIVED + " (logged with curriculum_learning)"),
    ("steps_per_print", "DeepSpeed", 10, N, "", "DeepSpeed's own progress print; nxd logs every log_interval steps"),
    ("wall_clock_breakdown", "DeepSpeed", False, N, "", "nxd logs each step's time"),
    ("dump_state", "DeepSpeed", False, N, "", _DS_TOOL),
    ("flops_profiler", "DeepSpeed", None, N, "", _DS_TOOL + "; nxd logs MFU"),
    ("communication_data_type", "DeepSpeed", None, N, "", "nxd reduces gradients in fp32"),
    ("autotuning", "DeepSpeed", None, M, "tune",
     "read by `nxd-train tune` (micro-batch size x ZeRO stage, each timed): start/end_profile_step and the micro-batch "
     "bounds map; the tuner's own settings are noticed"),
    ("activation_checkpointing", "DeepSpeed", None, N, "",
     "DeepSpeed's own copy of checkpoint_activations' settings; nxd reads checkpoint_activations"),
    ("sparse_attention", "DeepSpeed", None, N, "", "DeepSpeed's own copy of the sparse settings; NeoX's layers read "
     "sparsity_config"),
    ("data_efficiency", "DeepSpeed", None, R, "",
     "DeepSpeed's data-efficiency library (metric-based sampling, random layerwise token dropping) is not in nxd; "
     "its sequence-length curriculum is curriculum_learning (data.curriculum)"),
    ("tensorboard", "DeepSpeed", None, N, "", "DeepSpeed's own monitor; nxd writes TensorBoard with tensorboard_dir"),
    ("wandb", "DeepSpeed", None, N, "", "DeepSpeed's own monitor"),
    ("csv_monitor", "DeepSpeed", None, N, "", "DeepSpeed's own monitor; nxd writes metrics.csv in the run directory"),
    ("elasticity", "DeepSpeed", None, M, "data.global_batch_size",
     "DeepSpeed's elastic batch (versions 0.1 and 0.2): the global batch valid on every data-parallel size in "
     "min_gpus..max_gpus with the listed micro_batch_sizes, and this size's micro-batch; version 0.1 refuses a size "
     "outside them, 0.2 takes its fallback batch there, as DeepSpeed does"),
    ("comms_logger", "DeepSpeed", None, N, "", _DS_TOOL),
    ("compression_training", "DeepSpeed", None, R, "",
     "DeepSpeed's compression (quantization- and pruning-aware training) is not in nxd: train, export with `nxd-train "
     "ckpt export-hf`, and quantize the exported model with a quantization library (torchao, transformers' "
     "quantizers)"),
    ("checkpoint", "DeepSpeed", None, N, "", "DeepSpeed's checkpoint-writing options; nxd writes sharded DCP"),
    ("data_types", "DeepSpeed", None, M, "precision.type",
     "grad_accum_dtype: fp32 is nxd's mixed_precision; bf16 with bf16 training accumulates gradients in bf16 over "
     "fp32 master weights (precision type manual: xla_use_bf16, master_weights, fp32_grad_acc False)"),
    ("deepspeed_extra_args", "DeepSpeed", None, M, "",
     "each key in it is read as the DeepSpeed key of that name at the top level"),
    # ----------------------------------------------------------------------------- launcher
    ("hostfile", "Launcher", None, M, "trainer.cluster.hostfile",
     "DeepSpeed's hostfile: its hosts (after include / exclude and num_nodes) are trainer.num_nodes and their slots "
     "trainer.devices when num_gpus is unset; `nxd-train launch` writes the job over them"),
    ("include", "Launcher", None, M, "trainer.cluster.include", "the hostfile's hosts (and slots) to use"),
    ("exclude", "Launcher", None, M, "trainer.cluster.exclude", "the hostfile's hosts (or slots) to leave out"),
    ("num_nodes", "Launcher", -1, M, "trainer.num_nodes", "-1: every host of the hostfile (one node without one)"),
    ("num_gpus", "Launcher", None, M, "trainer.devices",
     "processes per node; null: the model-parallel size (the fewest processes the layout needs; NeoX takes every "
     "GPU of the node)"),
    ("master_port", "Launcher", 29500, M, "trainer.cluster.master_port", "the rendezvous port of each host's torchrun"),
    ("master_addr", "Launcher", None, M, "trainer.cluster.master_addr",
     "the rendezvous host of each host's torchrun (null: the first host)"),
    ("launcher", "Launcher", "pdsh", M, "trainer.cluster.scheduler",
     "slurm: `nxd-train launch` writes an sbatch script; pdsh, openmpi, mvapich with a hostfile: each host's torchrun "
     "command, started over ssh"),
    ("force_multi", "Launcher", False, N, "", _LAUNCHER),
    ("autotuning_run", "Launcher", None, N, "", _LAUNCHER),
    ("no_ssh_check", "Launcher", False, N, "", _LAUNCHER),
    ("comment", "Launcher", None, M, "trainer.cluster.comment", "sbatch --comment"),
    ("account", "Launcher", None, M, "trainer.cluster.account", "sbatch --account"),
)
# fmt: on

NEOX_KEYS: dict[str, NeoXKey] = {entry[0]: NeoXKey(*entry) for entry in _ENTRIES}
"""Every GPT-NeoX argument by name."""

GROUPS = tuple(dict.fromkeys(key.group for key in NEOX_KEYS.values()))
