"""`model`: architecture (Megatron-style or a Hugging Face config.json), fusions, memory, optimizer.

Megatron-style defaults are those of NeMo 1.x's GPT model, which NxDT inherits. Keys that only
describe a Megatron-style architecture are rejected for `model_source: hf`, where config.json
defines the architecture (see the cross-field rules).
"""

from __future__ import annotations

from typing import Annotated, Literal

from ._base import NoneString, Section, Status, frozen_list, key
from .optim import Optimizer

MODELS = "nxd-models"

InitMethod = Literal[
    "normal",
    "scaled_normal",
    "single_residual_scaled_normal",
    "small_init",
    "wang_init",
    "xavier_uniform",
    "xavier_normal",
    "orthogonal",
    "scaled_orthogonal",
]
PAR = "nxd-parallel"
APP = "nxd-train"


class FusionsConfig(Section):
    softmax: bool = key(False, "Use the fused (scale + mask + softmax) attention path.", by=MODELS)
    flash_attention: bool = key(
        False, "Use flash / memory-efficient attention kernels where the device has them.", by=MODELS
    )
    ring_attention: bool = key(False, "Ring attention over the context-parallel group; required when cp > 1.", by=PAR)
    torch_compile: bool = key(
        False,
        "Compile each decoder block with torch.compile (inductor), after tensor parallelism and recompute "
        "wrapping, before data parallelism; the first step pays the compile time, which the log reports. "
        "Not with tensor parallelism yet.",
        by=PAR,
        status=Status.EXTENSION,
        note="NxDT compiles the whole graph with the Neuron compiler instead",
    )
    loss_chunk_tokens: int = key(
        0,
        "Compute the loss this many tokens at a time from the final hidden states and the output layer, "
        "recomputing each chunk's logits in the backward, so that a micro-batch's whole logits never exist "
        "(per-token values equal within rounding). It costs one more forward of the output layer and its "
        "softmax (18% of the step of a 4-layer Llama-3-8B slice on an H100), so it pays where the logits "
        "(micro-batch x sequence x vocabulary x 4 bytes, several times over) set the peak memory. 0 computes "
        "the whole logits at once. Both families (a Hugging Face model through nxd's stage forward).",
        ge=0,
        by=MODELS,
        status=Status.EXTENSION,
        note="NxDT computes the whole logits",
    )


class MoEConfig(Section):
    """Mixture of experts (NxDT's Mixtral recipes): a router and stacked expert MLPs in place of the MLP
    of every `frequency`-th decoder layer, in either model family (see nxd-models' `moe`)."""

    num_experts: int | None = key(None, "Experts per MoE layer (at least 2; required).", by=MODELS, ge=1)
    frequency: int = key(
        1,
        "Every n-th decoder layer is an MoE layer: Megatron-style layers n, 2n, ... counted from 1, as NxDT's "
        "Megatron model. A Hugging Face Mixtral has experts in every layer, so only 1 there.",
        by=MODELS,
        ge=1,
    )
    dropout: float = key(
        0.0, "Dropout on each expert's inner activation (as ffn_dropout on a dense MLP's).", by=MODELS, ge=0.0, le=1.0
    )
    capacity_factor: Annotated[float | None, NoneString] = key(
        None,
        "Expert capacity: each expert takes at most min(T, ceil(T * top_k * capacity_factor / num_experts)) of a "
        "micro-batch's T tokens, in token order; the rest are dropped for that expert (its affinity becomes "
        "zero). null: no token is dropped. With dropless write 0.0 or null.",
        by=MODELS,
        ge=0.0,
    )
    dropless: bool = key(False, "No token is ever dropped (capacity_factor must then be 0.0 or null).", by=MODELS)
    routing_algorithm: Literal["top_k", "sinkhorn", "neox_sinkhorn", "deepspeed"] = key(
        "top_k",
        "top_k: each token's top_k experts by router logit. sinkhorn: top-1 of a Sinkhorn-balanced assignment "
        "while training (plain top-1 in evaluation); top_k must be 1. neox_sinkhorn (an nxd extension value): "
        "GPT-NeoX's Sinkhorn router, the top_k experts of at most three balancing iterations from column-normalised "
        "costs while training (plain top_k in evaluation); sinkhorn_iterations and sinkhorn_tol do not apply. "
        "deepspeed (an nxd extension value): DeepSpeed's MoE gate (GPT-NeoX's moe_type: deepspeed), top_k 1 or 2, "
        "softmax affinities: top-1 keeps a random choice of an overloaded expert's tokens (random_token_selection) "
        "and weighs them by their probability; top-2 samples the second expert with Gumbel noise "
        "(sample_second_expert), fills capacity with first choices before second ones and renormalises; capacity "
        "max(ceil(T / num_experts x capacity_factor x top_k), min_capacity); the load-balancing loss counts first "
        "choices, num_experts x sum(mean probability x share of first choices).",
        by=MODELS,
        extension_values=("neox_sinkhorn", "deepspeed"),
    )
    eval_capacity_factor: Annotated[float | None, NoneString] = key(
        None,
        "The capacity factor of evaluation forwards; null: capacity_factor.",
        by=MODELS,
        gt=0.0,
        status=Status.EXTENSION,
        note="GPT-NeoX's moe_eval_capacity_factor; NxDT has no such key",
    )
    min_capacity: int = key(
        0,
        "An expert takes at least this many tokens when capacity drops tokens.",
        by=MODELS,
        ge=0,
        status=Status.EXTENSION,
        note="GPT-NeoX's moe_min_capacity; NxDT has no such key",
    )
    residual: bool = key(
        False,
        "PR-MoE (Megatron-style models): a dense MLP beside the experts, the two outputs mixed per token by "
        "softmax(Linear(hidden, 2)).",
        by=MODELS,
        status=Status.EXTENSION,
        note="GPT-NeoX's moe_use_residual; NxDT has no such key",
    )
    glu: bool = key(
        False,
        "The experts gate their activation, act(gate(x)) x up(x), even when the model's activation is ungated.",
        by=MODELS,
        status=Status.EXTENSION,
        note="GPT-NeoX's moe_glu; NxDT has no such key",
    )
    random_token_selection: bool = key(
        True,
        "routing_algorithm deepspeed, top-1: an expert over capacity keeps a random choice of its tokens while "
        "training; false: the first in token order.",
        by=MODELS,
        status=Status.EXTENSION,
        note="DeepSpeed's use_rts; NxDT has no such key",
    )
    sample_second_expert: bool = key(
        True,
        "routing_algorithm deepspeed, top-2: the second expert is the largest of the other logits plus Gumbel "
        "noise while training; false: the second-largest logit.",
        by=MODELS,
        status=Status.EXTENSION,
        note="DeepSpeed's top2_2nd_expert_sampling; NxDT has no such key",
    )
    router_activation: Literal["softmax", "sigmoid"] = key(
        "softmax", "Turns router logits into the affinities that weigh the experts' outputs.", by=MODELS
    )
    sinkhorn_iterations: int = key(30, "Sinkhorn iterations per routing.", by=MODELS, ge=1)
    sinkhorn_tol: Annotated[float | None, NoneString] = key(
        None, "When set, an error if Sinkhorn's last iteration changed by this much or more.", by=MODELS, gt=0.0
    )
    top_k: int = key(1, "Experts per token (at most num_experts).", by=MODELS, ge=1)
    output_router_logits: bool = key(
        False,
        "Compute each MoE layer's load-balancing loss from its router logits (logged as moe_aux_loss; "
        "router_aux_loss_coef weighs it into the training loss).",
        by=MODELS,
    )
    router_aux_loss_coef: float = key(
        0.0,
        "Weight of the load-balancing loss (Switch Transformer's, scaled by num_experts / top_k as NxD scales "
        "it, averaged over the MoE layers) in the training loss; needs output_router_logits.",
        by=MODELS,
        ge=0.0,
    )
    normalize_top_k_affinities: bool = key(
        False, "Rescale each token's kept affinities to sum to 1 (Mixtral's routing).", by=MODELS
    )
    jitter_eps: float | None = key(
        None,
        "While training, the top-k router reads its input times uniform noise drawn in [1 - jitter_eps, 1 + "
        "jitter_eps) for each value (activation recompute draws the same); null: no jitter. Only with "
        "routing_algorithm top_k.",
        by=MODELS,
        gt=0.0,
        lt=1.0,
        status=Status.EXTENSION,
        note="GPT-NeoX's moe_jitter_eps; NxDT has no such key",
    )


_NEOX = {"by": MODELS, "status": Status.EXTENSION}


class SparseAttentionConfig(Section):
    """DeepSpeed's block-sparse layouts for the layers `attention_layers` names (GPT-NeoX's sparsity_config),
    always causal: a token attends a key when their blocks are in the layout and the key is not in its future. Keys
    a layout kind does not read change nothing for it."""

    block: int = key(16, "Tokens per block, each way.", ge=1, note="GPT-NeoX's sparsity_config.block", **_NEOX)
    different_layout_per_head: bool = key(
        False,
        "Each head builds its own layout (its own random blocks; sparse_fixed: its own global pattern); "
        "false: every head has head 0's. local layers always share one.",
        note="GPT-NeoX's sparsity_config.different_layout_per_head",
        **_NEOX,
    )
    num_local_blocks: int | None = key(
        None,
        "sparse_fixed: blocks per local window (null: 4). local: the sliding window in blocks, centred, so "
        "a row sees window // 2 blocks back (null: num_sliding_window_blocks, else 4).",
        ge=1,
        note="GPT-NeoX's sparsity_config.num_local_blocks",
        **_NEOX,
    )
    num_global_blocks: int = key(
        1,
        "sparse_fixed: the blocks of each local window every later row sees (the window's last ones). bigbird: "
        "the first blocks, seen by every row.",
        ge=1,
        note="GPT-NeoX's sparsity_config.num_global_blocks",
        **_NEOX,
    )
    num_different_global_patterns: int = key(
        1,
        "sparse_fixed with different_layout_per_head: head h takes the (h mod this)-th global group from a "
        "window's end.",
        ge=1,
        note="GPT-NeoX's sparsity_config.num_different_global_patterns",
        **_NEOX,
    )
    num_random_blocks: int | None = key(
        None,
        "sparse_variable and bigbird: random blocks per row (bigbird draws past ones), drawn with the run's "
        "seed and the layer's number (null: 0 for sparse_variable, 1 for bigbird).",
        ge=0,
        note="GPT-NeoX's sparsity_config.num_random_blocks",
        **_NEOX,
    )
    local_window_blocks: frozen_list(int) = key(
        (4,),
        "sparse_variable: the sizes in blocks of consecutive local windows; the last repeats to the end.",
        note="GPT-NeoX's sparsity_config.local_window_blocks",
        **_NEOX,
    )
    global_block_indices: frozen_list(int) = key(
        (0,),
        "sparse_variable and bslongformer: the global blocks every later row sees (bslongformer's also see "
        "every earlier block); with global_block_end_indices, where each global range starts.",
        note="GPT-NeoX's sparsity_config.global_block_indices",
        **_NEOX,
    )
    global_block_end_indices: frozen_list(int) | None = key(
        None,
        "The end (exclusive) of each global range, one per global_block_indices.",
        note="GPT-NeoX's sparsity_config.global_block_end_indices",
        **_NEOX,
    )
    num_sliding_window_blocks: int | None = key(
        None,
        "bigbird and bslongformer: the sliding window in blocks, centred (null: 3).",
        ge=1,
        note="GPT-NeoX's sparsity_config.num_sliding_window_blocks",
        **_NEOX,
    )


class SoftPromptConfig(Section):
    """Soft prompt tuning (GPT-NeoX's soft_prompt_tuning; prompt tuning, Lester et al. 2021): learned vectors
    before every sequence, in positions 0 .. n_tokens - 1 and seen by every packed document; only they train."""

    n_tokens: int = key(10, "Learned vectors before every sequence.", ge=1, note="GPT-NeoX's n_tokens", **_NEOX)
    init_string: str = key(
        "",
        "When set, the prompt starts as the embedding rows of this text's tokens (the run's tokenizer, the "
        "weights the run starts from), repeated to n_tokens; else each value is drawn from U(-init_range, "
        "init_range).",
        note="GPT-NeoX's init_string",
        **_NEOX,
    )
    init_range: float = key(
        0.5, "The uniform draw's bound without init_string.", gt=0.0, note="GPT-NeoX's init_range", **_NEOX
    )


class MupConfig(Section):
    """muP, the maximal update parametrisation (GPT-NeoX's use_mup, by Microsoft's mup package's rules): a base-shape
    file names the widths the hyperparameters were tuned at, and each weight's draw, learning rate and weight decay,
    the attention scores and the output layer's input scale with the model's width against it."""

    base_shapes_file: str | None = key(
        None,
        "mup's base-shape file (YAML: each parameter's base size of every width dimension, null for the "
        "others), written by save_base_shapes or mup's make_base_shapes; required.",
        note="GPT-NeoX's base_shapes_file (NeoX's per-rank files name NeoX's modules, not nxd's)",
        **_NEOX,
    )
    save_base_shapes: bool = key(
        False,
        "Write base_shapes_file for this model as the base (its widths against a model width_scale times as "
        "wide, as mup's make_base_shapes) and exit with 0 without training.",
        by=APP,
        status=Status.EXTENSION,
        note="GPT-NeoX's save_base_shapes (NeoX exits with 1 after saving)",
    )
    width_scale: int = key(
        2,
        "How much wider the delta model of save_base_shapes is.",
        by=APP,
        ge=2,
        status=Status.EXTENSION,
        note="GPT-NeoX's mup_width_scale",
    )
    init_scale: float = key(
        1.0, "Every drawn weight is multiplied by it.", gt=0.0, note="GPT-NeoX's mup_init_scale", **_NEOX
    )
    attention_temperature: float = key(
        1.0,
        "The attention scores q.k / d are divided by it.",
        gt=0.0,
        note="GPT-NeoX's mup_attn_temp (documented there, not read by NeoX's code)",
        **_NEOX,
    )
    output_temperature: float = key(
        1.0,
        "The logits are divided by it.",
        gt=0.0,
        note="GPT-NeoX's mup_output_temp (documented there, not read by NeoX's code)",
        **_NEOX,
    )
    embedding_multiplier: float = key(
        1.0,
        "The embedding layer's output (after its dropout) is multiplied by it.",
        note="GPT-NeoX's mup_embedding_mult",
        **_NEOX,
    )
    coord_check: bool = key(
        False,
        "Run mup's coordinate check instead of training: the model at each of coord_check_widths trains 4 "
        "steps on the first micro-batches, with muP and without, recording each module's mean absolute output; "
        "written as coord_check_up and coord_check_sp (.csv, and .png plots where matplotlib is installed) in the "
        "working directory, then exit with 0.",
        by=APP,
        status=Status.EXTENSION,
        note="GPT-NeoX's coord_check (NeoX plots with mup's package and exits with 1)",
    )
    coord_check_widths: list[int] | None = key(
        None,
        "The hidden sizes the coordinate check trains (the MLP and head widths the model sets scale with "
        "them); null: GPT-NeoX's, num_attention_heads x 2^p for p in 2 .. 8.",
        by=APP,
        status=Status.EXTENSION,
        note="nxd extension: NeoX fixes its widths",
    )


GATED_ACTIVATIONS = ("swiglu", "geglu", "reglu", "bilinear", "glu")
"""model.activation values that gate the MLP: act(gate(x)) * up(x)."""
AttentionKind = Literal[
    "dense", "local", "sparse_fixed", "sparse_variable", "bigbird", "bslongformer", "gmlp", "amlp", "mamba", "rwkv"
]


class ModelConfig(Section):
    # --- common to Megatron-style and Hugging Face models
    hf_model_config: str | None = key(
        None,
        "Path of a Hugging Face config.json that defines the architecture (model_source: hf).",
        by=MODELS,
        alias="model_config",
    )
    trust_remote_code: bool = key(
        False,
        "Run the Python a tokenizer folder ships (transformers' auto_map in tokenizer_config.json); off, such a "
        "folder is refused by name and never asks on the terminal (model config.json files never run code).",
        by="nxd-data",
    )
    encoder_seq_length: int | None = key(None, "Training sequence length (required).", by=MODELS, ge=1)
    max_position_embeddings: int | None = key(
        None, "Longest position the model supports; null uses encoder_seq_length.", by=MODELS, ge=1
    )
    num_layers: int | None = key(
        None, "Transformer layers (required for megatron; overrides config.json for hf).", by=MODELS, ge=1
    )
    hidden_size: int | None = key(
        None, "Hidden width (required for megatron; overrides config.json for hf).", by=MODELS, ge=1
    )
    rope_theta: float | None = key(
        None, "RoPE base; null keeps config.json's value (hf) or 10000 (megatron).", by=MODELS, gt=0.0
    )
    qkv_linear: bool = key(
        False, "One GQA-aware QKV projection module (with kv_replicator), either family; exports keep q/k/v.", by=PAR
    )
    fuse_qkv: bool = key(True, "Fuse the q, k and v weights of that module into one matmul.", by=PAR)
    transpose_nki_inputs: bool = key(
        True,
        "Transpose the inputs of the NKI flash-attention kernel.",
        by=MODELS,
        status=Status.NEURON_ONLY,
        note="a layout option of Neuron's NKI kernel",
    )
    pipeline_cuts: frozen_list(str) | None = key(
        None,
        "Layer names that end each pipeline stage but the last (NxD's cut after the named layer), e.g. "
        "model.layers.9 (pp * virtual pp - 1 of them); unset balances the stages by parameter count.",
        by=PAR,
    )
    use_cpu_initialization: bool = key(
        True, "Materialise weights on the CPU, then move them; False materialises on the device.", by=MODELS
    )
    weight_init_only: bool = key(
        False, "When loading a checkpoint, take only the model weights (new optimizer, step 0).", by="nxd-ckpt"
    )
    activations_checkpoint_granularity: Literal["selective", "full"] | None = key(
        None, "Recompute activations in backward: whole layers (full), named modules (selective) or none.", by=PAR
    )
    activations_checkpoint_recompute: frozen_list(str) | None = key(
        None, "Module names recomputed with selective granularity (CoreAttention = the attention core).", by=PAR
    )
    activations_checkpoint_recompute_mlp: bool = key(
        False, "Also recompute the MLP (selective); full granularity recomputes it anyway.", by=PAR
    )
    fusions: FusionsConfig = key(FusionsConfig(), "Attention kernel choices.", by=MODELS)
    do_layer_norm_weight_decay: bool = key(False, "Apply weight decay to norm weights and biases too.", by=APP)
    optim: Optimizer | None = key(None, "Optimizer (required) with its learning-rate schedule.", by=APP)
    # --- Megatron-style architecture
    ffn_hidden_size: int | None = key(None, "MLP inner width; null means 4 * hidden_size.", by=MODELS, ge=1)
    num_attention_heads: int | None = key(None, "Query heads (required for megatron).", by=MODELS, ge=1)
    num_kv_heads: int | None = key(None, "Key/value heads (GQA/MQA); null means num_attention_heads.", by=MODELS, ge=1)
    kv_channels: int | None = key(
        None, "Per-head width; null means hidden_size / num_attention_heads.", by=MODELS, ge=1
    )
    init_method_std: float = key(0.02, "Standard deviation of the normal weight init.", by=MODELS, gt=0.0)
    use_scaled_init_method: bool = key(True, "Scale output-projection init by 1/sqrt(2 * num_layers).", by=MODELS)
    hidden_dropout: float = key(0.1, "Dropout on the residual branches.", by=MODELS, ge=0.0, lt=1.0)
    attention_dropout: float = key(0.1, "Dropout on the attention probabilities.", by=MODELS, ge=0.0, lt=1.0)
    ffn_dropout: float = key(0.0, "Dropout inside the MLP.", by=MODELS, ge=0.0, lt=1.0)
    apply_query_key_layer_scaling: bool = key(
        True, "Scale Q*K^T by 1/layer_number (undone inside an fp32 softmax).", by=MODELS
    )
    normalization: Literal["rmsnorm", "layernorm", "scalenorm", "non_parametric_layernorm"] = key(
        "layernorm",
        "Norm layer: layernorm (with a bias), rmsnorm, or the nxd extension values (from GPT-NeoX) scalenorm "
        "(x / max(||x||, eps) times one learned scalar) and non_parametric_layernorm (layernorm without its weight "
        "and bias: nothing learned).",
        by=MODELS,
        extension_values=("scalenorm", "non_parametric_layernorm"),
    )
    layernorm_epsilon: float = key(1e-5, "Norm epsilon.", by=MODELS, gt=0.0)
    qk_layernorm: bool = key(
        False,
        "One norm of the normalization type applied to each token's queries and then its keys (the same "
        "weights), built over (heads, head_dim) as GPT-NeoX builds it: a layernorm standardises all heads of a token "
        "together (across the tensor-parallel ranks' heads), rmsnorm and scalenorm each head; needs as many key/value "
        "heads as query heads.",
        by=MODELS,
        status=Status.EXTENSION,
        note="GPT-NeoX's use_qk_layernorm; NxDT has no such key",
    )
    make_vocab_size_divisible_by: int = key(
        128, "Pad the vocabulary to a multiple of this (times tp).", by=MODELS, ge=1
    )
    persist_layer_norm: bool = key(
        True,
        "Use Apex's persistent fused layer-norm kernel.",
        by=MODELS,
        status=Status.NO_EFFECT,
        note="a CUDA kernel choice of Megatron/Apex with identical results; nxd uses torch's norms",
    )
    share_embeddings_and_output_weights: bool = key(True, "Tie the output layer to the input embedding.", by=MODELS)
    position_embedding_type: Literal["learned_absolute", "rope", "sinusoidal", "alibi", "rpe", "none"] = key(
        "learned_absolute",
        "Position encoding: learned_absolute, rope, or the nxd extension values (from GPT-NeoX) sinusoidal (fixed "
        "sin | cos added to the embedding), alibi (a per-head linear bias on attention scores), rpe (T5's learned "
        "relative position buckets, one table shared by every layer; rpe_num_buckets, rpe_max_distance) and none. "
        "alibi and rpe bias the scores, so not with context parallelism; rpe not with pipeline parallelism.",
        by=MODELS,
        extension_values=("sinusoidal", "alibi", "rpe", "none"),
    )
    rpe_num_buckets: int = key(
        32,
        "With rpe: buckets of key-to-query distance; the first half are single distances, the rest grow "
        "logarithmically up to rpe_max_distance.",
        by=MODELS,
        status=Status.EXTENSION,
        ge=2,
        note="GPT-NeoX's rpe_num_buckets; NxDT has no such key",
    )
    rpe_max_distance: int = key(
        128,
        "With rpe: the distance from which every key shares the last bucket.",
        by=MODELS,
        status=Status.EXTENSION,
        ge=1,
        note="GPT-NeoX's rpe_max_distance; NxDT has no such key",
    )
    position_embedding_offset: int = key(
        0,
        "Added to every position id before the learned_absolute or sinusoidal table (OPT's learned positions "
        "start at 2); with learned_absolute, max_position_embeddings must hold encoder_seq_length + offset rows.",
        by=MODELS,
        status=Status.EXTENSION,
        ge=0,
        note="GPT-NeoX's opt_pos_emb_offset; NxDT has no such key",
    )
    rotary_percentage: float = key(
        1.0, "Fraction of each head's dimensions that RoPE rotates.", by=MODELS, gt=0.0, le=1.0
    )
    activation: Literal[
        "swiglu", "gelu", "approx-gelu", "relu", "silu", "mish", "softsign", "geglu", "reglu", "bilinear", "glu"
    ] = key(
        "gelu",
        "MLP activation: gelu (exact) or swiglu; the nxd extension values (from GPT-NeoX) approx-gelu (gelu's tanh "
        "approximation), relu, silu, mish, softsign, and the gated geglu, reglu, bilinear (no activation) and glu "
        "(sigmoid), each down(act(gate(x)) * up(x)) as swiglu.",
        by=MODELS,
        extension_values=("approx-gelu", "relu", "silu", "mish", "softsign", "geglu", "reglu", "bilinear", "glu"),
    )
    transformer_block_type: Literal["pre_ln", "post_ln", "normformer", "gpt_j", "gpt_neox"] = key(
        "pre_ln",
        "Where the norms sit in a block: pre_ln, x + attn(norm(x)) then + mlp(norm(x)); gpt_j, attention and MLP in "
        "parallel from one norm, x + attn(norm(x)) + mlp(norm(x)) (GPT-J); gpt_neox (an nxd extension value), in "
        "parallel from two norms, x + attn(norm1(x)) + mlp(norm2(x)) (GPT-NeoX-20B, Pythia).",
        by=MODELS,
        status=Status.LIMITED,
        note="pre_ln, gpt_j and gpt_neox; NeMo's post_ln and normformer are rejected",
        extension_values=("gpt_neox",),
    )
    has_bias: bool = key(True, "Biases in the linear layers.", by=MODELS)
    attention_bias: bool | None = key(
        None,
        "Biases in the query, key, value and output projections; null follows has_bias.",
        by=MODELS,
        status=Status.EXTENSION,
        note="from GPT-NeoX's use_bias_in_attn_linear; null keeps NxDT's has_bias",
    )
    mlp_bias: bool | None = key(
        None,
        "Biases in the MLP's linear layers; null follows has_bias.",
        by=MODELS,
        status=Status.EXTENSION,
        note="from GPT-NeoX's use_bias_in_mlp; null keeps NxDT's has_bias",
    )
    init_method: InitMethod = key(
        "normal",
        "Initialisation of every weight but the output projections (attention output, MLP down): normal "
        "N(0, init_method_std); scaled_normal N(0, std / sqrt(2 num_layers)); single_residual_scaled_normal "
        "N(0, std / sqrt(num_layers)); small_init N(0, sqrt(2 / (5 hidden_size))); wang_init "
        "N(0, 2 / (num_layers sqrt(hidden_size))); xavier_uniform, xavier_normal (fans of the whole projection, q, k "
        "and v together, gate and up together); orthogonal (gain sqrt(2)), scaled_orthogonal (gain "
        "sqrt(2 / num_layers)).",
        by=MODELS,
        status=Status.EXTENSION,
        note="GPT-NeoX's init_method; normal is NxDT's Megatron initialisation",
    )
    output_layer_init_method: InitMethod | None = key(
        None,
        "Initialisation of the attention output and MLP down projections (the methods of init_method); null: "
        "scaled_normal with use_scaled_init_method, else normal.",
        by=MODELS,
        status=Status.EXTENSION,
        note="GPT-NeoX's output_layer_init_method; null keeps NxDT's use_scaled_init_method",
    )
    sliding_window_size: int | None = key(
        None,
        "Sliding-window attention (Mistral) of the Megatron-style model: each token attends the previous "
        "sliding_window_size tokens, itself included, within its document; at most the sequence length (equal: "
        "full causal). Not with context parallelism below the sequence length. HF models take it from config.json.",
        by=MODELS,
        ge=1,
    )
    attention_layers: frozen_list(AttentionKind) | None = key(
        None,
        "The kind of each decoder layer, one per layer: dense (causal attention over every earlier token, then the "
        "MLP), a block-sparse layout of DeepSpeed's (local, sparse_fixed, sparse_variable, bigbird, bslongformer; "
        "see sparse_attention), or gmlp / amlp (Liu et al.'s gMLP block in place of attention and MLP: a spatial "
        "gating unit over the sequence, 4 x hidden_size wide, amlp with a tiny attention of gmlp_attention_dim; as "
        "GPT-NeoX builds it, its output replaces the residual stream), or mamba (Gu and Dao's selective state-space "
        "block in place of attention and MLP, x + mixer(norm(x)), 16 states a channel, as GPT-NeoX builds it; see "
        "the mamba_* keys), or rwkv (RWKV-6's time mix and channel mix in place of attention and MLP, as GPT-NeoX "
        "builds them: num_attention_heads heads, layernorms whatever normalization says; see the rwkv_* keys). null: "
        "dense everywhere. Sparse, gMLP, mamba and rwkv layers take no context parallelism, gMLP, mamba and rwkv "
        "layers no sequence parallelism (their weights are whole on every tensor-parallel rank); gMLP layers need an "
        "ungated activation; sparse layers drop their output with attention_dropout, as GPT-NeoX's do.",
        by=MODELS,
        status=Status.EXTENSION,
        note="GPT-NeoX's attention_config; NxDT has no such key",
    )
    mamba_inner_size: int | None = key(
        None,
        "The channels of a mamba layer; null: 2 x hidden_size.",
        by=MODELS,
        ge=1,
        status=Status.EXTENSION,
        note="GPT-NeoX's intermediate_size / expansion_factor for mamba layers",
    )
    mamba_conv_bias: bool = key(
        True,
        "A bias on a mamba layer's convolution.",
        by=MODELS,
        status=Status.EXTENSION,
        note="GPT-NeoX's mamba_use_bias_in_conv; NxDT has no such key",
    )
    mamba_linear_bias: bool = key(
        False,
        "Biases on a mamba layer's in, x and out projections.",
        by=MODELS,
        status=Status.EXTENSION,
        note="GPT-NeoX's mamba_use_bias_in_linears; NxDT has no such key",
    )
    rwkv_dim_att: int | None = key(
        None,
        "The width of an rwkv layer's time mix (num_attention_heads heads of it); null: hidden_size.",
        by=MODELS,
        ge=1,
        status=Status.EXTENSION,
        note="GPT-NeoX's dim_att; NxDT has no such key",
    )
    rwkv_ffn_size: int | None = key(
        None,
        "The width of an rwkv layer's channel mix; null: 3.5 x hidden_size rounded down to a multiple of 32.",
        by=MODELS,
        ge=1,
        status=Status.EXTENSION,
        note="GPT-NeoX's ffn_dim; NxDT has no such key",
    )
    gmlp_attention_dim: int = key(
        64,
        "The width of an amlp layer's single-head attention; acted on only by amlp layers.",
        by=MODELS,
        ge=1,
        status=Status.EXTENSION,
        note="GPT-NeoX's gmlp_attn_dim; NxDT has no such key",
    )
    soft_prompt: SoftPromptConfig | None = key(
        None,
        "Soft prompt tuning: a learned prompt (see the soft_prompt keys) before every sequence, and every other "
        "weight frozen; null: none. Language-model training or sft only, without LoRA, pipeline or context "
        "parallelism.",
        by=MODELS,
        status=Status.EXTENSION,
        note="GPT-NeoX's soft_prompt_tuning; NxDT has no such key",
    )
    num_unique_layers: int | None = key(
        None,
        "Decoder layers with their own weights (Megatron's parameter sharing): the num_layers positions run "
        "them in param_sharing_style's order; a divisor of num_layers; null: every layer its own. Not with pipeline "
        "parallelism (a shared layer would live on several stages), sequence parallelism, attention_layers or "
        "moe.",
        by=MODELS,
        ge=1,
        status=Status.EXTENSION,
        note="GPT-NeoX's num_unique_layers; NxDT has no such key",
    )
    param_sharing_style: Literal["grouped", "spaced"] = key(
        "grouped",
        "With num_unique_layers: grouped runs unique layer i mod num_unique_layers at position i (4 "
        "layers, 2 unique: [1, 2, 1, 2]); spaced runs i // (num_layers / num_unique_layers) ([1, 1, 2, 2]).",
        by=MODELS,
        status=Status.EXTENSION,
        note="GPT-NeoX's param_sharing_style; NxDT has no such key",
    )
    sparse_attention: SparseAttentionConfig = key(
        SparseAttentionConfig(),
        "The block-sparse layouts' settings.",
        by=MODELS,
        status=Status.EXTENSION,
        note="GPT-NeoX's sparsity_config; NxDT has no such key",
    )
    mup: MupConfig | None = key(
        None,
        "muP (see the mup keys); null: the standard parametrisation. Megatron-style models with attention "
        "layers, drawn from normal init methods, trained with adam, adamw or sgd; not with peft or reward_model.",
        by=MODELS,
        status=Status.EXTENSION,
        note="GPT-NeoX's use_mup; NxDT has no such key",
    )
    position_embedding_multiplier: float = key(
        1.0,
        "The learned or sinusoidal position embeddings are multiplied by it.",
        by=MODELS,
        status=Status.EXTENSION,
        note="GPT-NeoX's mup_rp_embedding_mult; NxDT has no such key",
    )
    position_embedding_norm: bool = key(
        False,
        "The learned position table is bitsandbytes' StableEmbedding: a LayerNorm over its rows, and fp32 "
        "moments under adam8bit. Needs learned_absolute positions.",
        by=MODELS,
        status=Status.EXTENSION,
        note="GPT-NeoX's use_bnb_optimizer with pos_emb learned; NxDT has no such key",
    )
    moe: MoEConfig | None = key(
        None,
        "Mixture-of-experts layers (see the moe keys); null builds dense MLPs. With model_source: hf the "
        "config.json must be a Mixtral's, and these keys set its experts and routing.",
        by=MODELS,
    )
