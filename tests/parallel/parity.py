"""Train tiny models for a few steps in N real gloo processes and record what parity tests compare.

`run_scenarios(world, scenarios)` spawns `world` processes (FileStore rendezvous) that run every
scenario in turn with the same wiring nxd-train uses (`build_parallel_model`, the step executors with
the token objective, global norms), and returns rank 0's records: the initial full parameters, per
step the loss, gradient norm and full gradients, and the optimizer-state bytes this rank holds.
"""

from __future__ import annotations

import faulthandler
import os
import tempfile
from dataclasses import dataclass, field, replace
from functools import partial
from importlib import import_module

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from nxd_align import LoraFamily, LoraSpec, TokenObjective
from nxd_models import (
    AttentionKernel,
    GMLPSpec,
    GPTConfig,
    MambaSpec,
    MoESpec,
    MupSpec,
    RWKVSpec,
    SparsitySpec,
    gpt_base_shapes,
    model_family,
    set_aux_loss_weights,
)
from nxd_models.hf_moe import set_moe
from nxd_models.hf_qkv import set_qkv_linear
from nxd_parallel import (
    Layout,
    ParallelDims,
    build_executor,
    build_parallel_model,
    clip_gradients,
    modules_of,
    split_sequence,
)
from nxd_precision import Float8Spec, PrecisionOptimizer, prepare_parameters, resolve_policy
from nxd_precision.adam8bit import Adam8bit
from nxd_precision.neox_optimizers import SM3
from nxd_precision.optimizers import parameter_groups
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from transformers import LlamaConfig, MixtralConfig, Qwen3Config

STEPS, GLOBAL_BATCH, MICRO_BATCH, SEQ, VOCAB = 5, 8, 2, 16, 120
LOSS_CHUNK = 12
"""Tokens per loss chunk of the Megatron-style models: a micro-batch (32 tokens, 16 per context-parallel
rank) is cut into uneven chunks, so every layout's chunked loss is compared with whole logits."""
HANG_SECONDS = 300
MOE = MoESpec(
    num_experts=4,
    top_k=2,
    capacity_factor=1.25,
    normalize_top_k_affinities=True,
    router_aux_loss=True,
    router_aux_loss_coef=0.05,
)
"""The mixture of experts of the "moe" family: Mixtral's routing with a capacity that drops tokens, and a
load-balancing loss large enough to move the gradients."""
DEEPSPEED_MOE = {
    "ds-moe": MoESpec(
        num_experts=4,
        top_k=2,
        routing="deepspeed",
        capacity_factor=0.75,
        min_capacity=2,
        residual=True,
        router_aux_loss=True,
        router_aux_loss_coef=0.05,
    ),
    "ds-moe-top1": MoESpec(
        num_experts=4,
        top_k=1,
        routing="deepspeed",
        capacity_factor=1.0,
        eval_capacity_factor=2.0,
        residual=True,
        router_aux_loss=True,
        router_aux_loss_coef=0.05,
    ),
    "ds-moe-fixed": MoESpec(
        num_experts=4,
        top_k=2,
        routing="deepspeed",
        capacity_factor=0.75,
        min_capacity=2,
        residual=True,
        router_aux_loss=True,
        router_aux_loss_coef=0.05,
        sample_second_expert=False,
    ),
    "ds-moe-top1-fixed": MoESpec(
        num_experts=4,
        top_k=1,
        routing="deepspeed",
        capacity_factor=1.0,
        glu=True,
        router_aux_loss=True,
        router_aux_loss_coef=0.05,
        random_token_selection=False,
    ),
}
"""DeepSpeed's MoE (GPT-NeoX's moe_type: deepspeed) with PR-MoE's dense MLP: top-2 with a Gumbel-sampled second
expert and a capacity that drops tokens ("ds-moe"), top-1 with random token selection ("ds-moe-top1"). Their draws
come from each rank's generator, so a data-parallel rank or a pipeline stage draws other numbers than one process
running every micro-batch and layer (as in DeepSpeed): those layouts run the "-fixed" shapes, without draws."""
NXDT_MIXTRAL_MOE = {
    "mixtral-capacity": MoESpec(
        num_experts=8,
        top_k=2,
        capacity_factor=2.0,
        normalize_top_k_affinities=True,
        router_aux_loss=True,
        router_aux_loss_coef=0.02,
    ),
    "mixtral-dropless": MoESpec(
        num_experts=8, top_k=2, normalize_top_k_affinities=True, router_aux_loss=True, router_aux_loss_coef=0.02
    ),
}
"""The moe blocks of NxDT's two HF Mixtral recipes (hf_mixtral_8x7b, hf_mixtral_8x7b_dropless): 8 experts, top-2,
so that capacity 2.0 keeps half of a micro-batch's tokens per expert and drops the rest."""


NEOX_SHAPES = {
    "pythia": dict(
        transformer_block_type="gpt_neox",
        position_embedding_type="rope",
        rotary_percentage=0.25,
        activation="approx-gelu",
        init_method="small_init",
        output_layer_init_method="wang_init",
    ),
    "alibi": dict(
        transformer_block_type="gpt_j",
        position_embedding_type="alibi",
        normalization="scalenorm",
        activation="geglu",
        mlp_bias=False,
        init_method="xavier_uniform",
        qk_layernorm=True,
    ),
    "sinusoidal": dict(
        position_embedding_type="sinusoidal",
        activation="mish",
        attention_bias=False,
        init_method="orthogonal",
        output_layer_init_method="single_residual_scaled_normal",
    ),
    "opt": dict(
        position_embedding_type="learned_absolute",
        position_embedding_offset=2,
        max_position_embeddings=SEQ + 2,
        normalization="non_parametric_layernorm",
        activation="relu",
        qk_layernorm=True,
    ),
    "qk": dict(position_embedding_type="rope", qk_layernorm=True),
    "rpe": dict(
        position_embedding_type="rpe",
        rpe_num_buckets=8,
        rpe_max_distance=12,
        normalization="rmsnorm",
        activation="swiglu",
        qk_layernorm=True,
    ),
    "shared": dict(
        position_embedding_type="rope", num_unique_layers=2, param_sharing_style="grouped", activation="swiglu"
    ),
    "prompt": dict(
        position_embedding_type="learned_absolute",
        max_position_embeddings=SEQ + 4,
        soft_prompt_tokens=4,
        soft_prompt_init_ids=(5, 9, 11),
    ),
    "sparse": dict(
        position_embedding_type="rope",
        layer_settings=(
            SparsitySpec(
                block=4,
                different_layout_per_head=True,
                num_local_blocks=2,
                num_different_global_patterns=2,
                num_random_blocks=1,
                global_block_indices=(0, 2),
                global_block_end_indices=(1, 3),
                seed=5,
            ),
        ),
    ),
    "gmlp": dict(position_embedding_type="rope", layer_settings=(GMLPSpec(attention_dim=8),)),
    "mamba": dict(
        position_embedding_type="rope", normalization="rmsnorm", layer_settings=(MambaSpec(linear_bias=True),)
    ),
    "rwkv": dict(position_embedding_type="rope", layer_settings=(RWKVSpec(ffn_size=64),)),
    "mup": dict(position_embedding_type="learned_absolute", position_embedding_multiplier=0.5),
}
"""GPT-NeoX's model shapes: Pythia's (parallel residual from two layernorms, rotary on a quarter of each head,
gelu's tanh form, biases, small_init / wang_init); ALiBi with one scalenorm feeding attention and a geglu MLP
(GPT-J's block) without MLP biases, scalenorm on each head's queries and keys (use_qk_layernorm); sinusoidal
positions with mish and orthogonal weights; OPT's learned positions
two rows on (opt_pos_emb_offset) with layernorms that learn nothing (non_parametric_layernorm), on the queries and
keys too; a layernorm over all heads of each token's queries and keys ("qk"); T5's relative
buckets (rpe), 8 of them up to distance 12, so that a sequence of 16 reaches the shared last bucket, with rmsnorm
on each head's queries and keys; DeepSpeed's block-sparse layers ("sparse": SPARSE_LAYERS in turn, blocks of 4
tokens, a layout per head so that tensor-parallel ranks read their heads' own, random blocks); four layers running
two layers' weights in turn (Megatron's parameter sharing, "shared"); a soft prompt of 4 vectors started from the
embedding rows of three tokens, the only weights that train ("prompt"); gMLP, aMLP (a tiny attention 8 wide) and
dense layers in turn ("gmlp"); Mamba (with biases on its projections) and dense layers in turn ("mamba"); RWKV-6 and dense
layers in turn ("rwkv"); muP at four times its base shapes' width, with GPT-NeoX's temperatures and multipliers
(`MUP`), its optimizer groups stepping at their own rates ("mup")."""
MUP = dict(init_scale=0.8, attention_temperature=2.0, output_temperature=1.5, embedding_multiplier=3.0)
SPARSE_LAYERS = ("local", "sparse_fixed", "sparse_variable", "bigbird", "bslongformer", "dense")
"""The sparse shape's layers, in turn (six layers hold each kind once)."""
LAYER_TURNS = {
    "sparse": SPARSE_LAYERS,
    "gmlp": ("gmlp", "amlp", "dense"),
    "mamba": ("mamba", "dense"),
    "rwkv": ("rwkv", "dense"),
}
"""The shapes whose layers take kinds in turn."""


def model_spec(
    family: str,
    kv_heads: int = 2,
    qkv: str | None = None,
    layers: int = 2,
    tied: bool = True,
    loss_chunk: int = LOSS_CHUNK,
) -> GPTConfig | LlamaConfig | Qwen3Config:
    """A two-layer Llama shape of either family, the Megatron-style Mistral (sliding window) or GPT
    shape (no dropout, so every layout computes the same);
    `qkv` "fused" or "separate" builds either family with one QKV module (qkv_linear);
    `layers` shapes the Llama ones, `tied` (output layer sharing the embedding) and `loss_chunk` (tokens
    per loss chunk, 0 for whole logits) the Megatron-style ones."""
    if family in ("megatron", "mistral", "moe", *DEEPSPEED_MOE):  # mistral: a sliding window of a third of the
        # sequence; moe: MOE
        return GPTConfig(
            vocab_size=VOCAB,
            num_layers=layers,
            hidden_size=32,
            num_attention_heads=4,
            num_kv_heads=kv_heads,
            seq_length=SEQ,
            ffn_hidden_size=64,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            normalization="rmsnorm",
            activation="swiglu",
            position_embedding_type="rope",
            has_bias=False,
            make_vocab_size_divisible_by=8,
            qkv_linear=qkv is not None,
            fuse_qkv=qkv == "fused",
            share_embeddings_and_output_weights=tied,
            sliding_window=SEQ // 3 if family == "mistral" else None,
            loss_chunk_tokens=loss_chunk,
            moe=MOE if family == "moe" else DEEPSPEED_MOE.get(family),
        )
    if family == "gpt":  # GPT-2 / NeoX shape: layernorm, gelu, biases, learned positions, tied output
        return GPTConfig(
            vocab_size=VOCAB,
            num_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            seq_length=SEQ,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            make_vocab_size_divisible_by=8,
            loss_chunk_tokens=loss_chunk,
        )
    if family in NEOX_SHAPES:  # GPT-NeoX's shapes (untied, so that pipeline stages hold whole layers)
        config = _neox_sized(layers, loss_chunk, LAYER_TURNS.get(family), NEOX_SHAPES[family])
        if family == "mup":  # base shapes a quarter as wide
            shapes = gpt_base_shapes(replace(config, hidden_size=8, ffn_hidden_size=12), 2)
            config = replace(config, mup=MupSpec(tuple((name, tuple(shape)) for name, shape in shapes.items()), **MUP))
        return config
    if family == "mixtral" or family in NXDT_MIXTRAL_MOE:  # transformers' Mixtral with nxd's MoE layer
        moe = NXDT_MIXTRAL_MOE.get(family, MOE)
        config = MixtralConfig(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=kv_heads,
            max_position_embeddings=SEQ,
            num_local_experts=moe.num_experts,
            tie_word_embeddings=False,
        )
        set_moe(config, moe, "mixtral")
        return config
    if family == "qwen3":  # per-head q/k norms: transformers' replicated_with_grad_allreduce style
        config = Qwen3Config(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=kv_heads,
            head_dim=8,
            max_position_embeddings=SEQ,
            tie_word_embeddings=False,
        )
    else:
        config = LlamaConfig(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=kv_heads,
            max_position_embeddings=SEQ,
            tie_word_embeddings=False,
        )
    set_qkv_linear(config, qkv is not None, qkv == "fused")
    return config


def _neox_sized(layers: int, loss_chunk: int, turns: tuple[str, ...] | None, shape: dict) -> GPTConfig:
    """A GPT-NeoX-sized model of `shape` whose layers take the kinds `turns` in turn (None: dense)."""
    return GPTConfig(
        attention_layers=tuple(turns[index % len(turns)] for index in range(layers)) if turns else None,
        vocab_size=VOCAB,
        num_layers=layers,
        hidden_size=32,
        num_attention_heads=4,
        seq_length=SEQ,
        ffn_hidden_size=48,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        make_vocab_size_divisible_by=8,
        share_embeddings_and_output_weights=False,
        loss_chunk_tokens=loss_chunk,
        **shape,
    )


def plug_in_spec(module: str, layers: int, loss_chunk: int) -> GPTConfig:
    """The GPT-NeoX-sized model of a layer kind nxd does not ship: `module` registers its `KIND` in this process
    (`ensure_registered`) and gives its `SHAPE` (attention_layers in turn, and the other GPTConfig fields)."""
    plug_in = import_module(module)
    plug_in.ensure_registered()
    shape = dict(plug_in.SHAPE)
    return _neox_sized(layers, loss_chunk, shape.pop("attention_layers"), shape)


@dataclass(frozen=True)
class Scenario:
    name: str
    family: str = "megatron"
    tp: int = 1
    kv_heads: int = 2
    layout: Layout = field(default_factory=Layout)
    clip: float = 0.0
    qkv: str | None = None
    documents: bool = False
    """Each sample packs documents of DOCUMENTS tokens: positions restart and attention stays inside them."""
    precision: str = "fp32"
    """precision.type (every type but autocast, which is Fabric's autocast over the fp32 run)."""
    fp8: bool = False
    """The decoder layers' linear layers in torchao's float8 (emulated: float8 numerics on the CPU)."""
    fp8_recipe: str = "tensorwise"
    fp8_format: str | None = None
    """None: the recipe's own (tensorwise: e5m2 gradients)."""
    fp8_all_gather: bool = False
    """Under ZeRO, the weights gathered as float8 (the one-process reference has nothing to gather)."""
    pp: int = 1
    cp: int = 1
    ep: int = 1
    layers: int = 2
    tied: bool = True
    lora: tuple[str, ...] = ()
    """LoRA target modules (rank 4, alpha 8); empty trains the whole model."""
    loss_chunk: int = LOSS_CHUNK
    """Tokens per loss chunk (Megatron-style models); the one-process references use 0, whole logits."""
    attention: AttentionKernel = AttentionKernel.FLASH
    """The fusions keys' attention kernel (fused_softmax: flash_attention False, NxDT's Mixtral recipes)."""
    plug_in: str | None = None
    """A module defining a layer kind nxd does not ship (see `plug_in_spec`): the model is built of it instead."""
    optimizer: str = "adamw"
    """adamw, sm3 (GPT-NeoX's: accumulators over whole tensors, with momentum and weight decay) or adam8bit
    (bitsandbytes' 8-bit Adam, quantized in blocks over whole tensors)."""

    def built_family(self):  # noqa: ANN201
        family = model_family(self.spec(), self.attention)
        return LoraFamily(family, LoraSpec(rank=4, alpha=8, targets=self.lora)) if self.lora else family

    def spec(self) -> GPTConfig | LlamaConfig | Qwen3Config:
        if self.plug_in is not None:
            return plug_in_spec(self.plug_in, self.layers, self.loss_chunk)
        return model_spec(self.family, self.kv_heads, self.qkv, self.layers, self.tied, self.loss_chunk)


DOCUMENTS = (5, 7, 4)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of the whole tensor (a replicated DTensor's full_tensor() is its storage, not a copy)."""
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def _batches() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    return [torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ + 1), generator=generator) for _ in range(STEPS)]


def train_scenario(scenario: Scenario, world: int) -> dict:
    """Run one scenario in this process (one of `world`); every rank returns the same record."""
    dims = ParallelDims(world, tp=scenario.tp, pp=scenario.pp, cp=scenario.cp, ep=scenario.ep)
    mesh = dims.build_mesh("cpu")
    float8 = Float8Spec(
        recipe=scenario.fp8_recipe, format=scenario.fp8_format, emulate=True, all_gather=scenario.fp8_all_gather
    )
    policy = resolve_policy(scenario.precision, float8=float8 if scenario.fp8 else None)
    family = scenario.built_family()
    model = build_parallel_model(
        family, scenario.layout, mesh, torch.device("cpu"), seed=11, prepare=partial(prepare_parameters, policy=policy)
    )
    pp = mesh.get("pp")
    executor = build_executor(
        model, family.token_losses, torch.device("cpu"), pp=pp, microbatches=GLOBAL_BATCH // dims.dp // MICRO_BATCH
    )
    set_aux_loss_weights(modules_of(model), GLOBAL_BATCH // dims.dp // MICRO_BATCH)
    objective = TokenObjective()
    record = {
        "init": _gathered({name: _full(p) for name, p in model.named_parameters()}, pp),
        "loss": [],
        "norm": [],
        "grads": [],
    }
    # eps 1e-6: Adam turns a gradient near 0 into a step of about lr whose sign the gradient's last bits
    # decide, so with the default 1e-8 layouts whose sums round differently drift apart by design
    scales = family.optimizer_scales([name for name, p in model.named_parameters() if p.requires_grad], "adamw")
    optimizer = PrecisionOptimizer(
        model.parameters(),
        policy,
        lambda tensors: (
            torch.optim.AdamW(
                tensors if scales is None else parameter_groups(tensors, 0.1, True, scales, 1e-3),
                lr=1e-3,
                weight_decay=0.1,
                eps=1e-6,
                foreach=False,
            )
            if scenario.optimizer == "adamw"
            else SM3(tensors, lr=1e-2, momentum=0.5, weight_decay=0.1, eps=1e-6)
            if scenario.optimizer == "sm3"
            else Adam8bit(tensors, lr=1e-3, weight_decay=0.1, eps=1e-6, min_8bit_size=64)
        ),
    )
    loss_mesh, rank = mesh.get("dp_cp"), mesh.data_parallel_rank
    dp, cp, cp_rank = dims.dp, dims.cp, mesh.rank("cp")
    per_rank = GLOBAL_BATCH // dp
    for batch in _batches():
        mine = batch[rank * per_rank : (rank + 1) * per_rank]
        tokens = batch[:, 1:].numel()
        micro = []
        for ids in mine.split(MICRO_BATCH):
            positions, documents = torch.arange(SEQ).expand(ids.shape[0], SEQ), None
            if scenario.documents:
                positions = torch.cat([torch.arange(n) for n in DOCUMENTS]).expand(ids.shape[0], SEQ)
                documents = torch.cat([torch.full((n,), d) for d, n in enumerate(DOCUMENTS)]).expand(ids.shape[0], SEQ)
            part = {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "position_ids": positions}
            if documents is not None:
                part["document_ids"] = documents
            if cp > 1:  # this rank's zig-zag part of the sequence
                part = {key: split_sequence(value, cp, cp_rank) for key, value in part.items()}
            micro.append(part)
        loss = executor.run(micro, objective.loss, scale=dp * cp / tokens).loss
        for group in (loss_mesh, pp):
            if group is not None:
                dist.all_reduce(loss, group=group.get_group())
        record["loss"].append(loss.item() / tokens)
        record.setdefault("dtypes", _dtypes(model, optimizer))
        optimizer.collect_gradients()
        record["norm"].append(
            clip_gradients(
                optimizer.gradient_tensors, scenario.clip or float("inf"), across=None if pp is None else pp.get_group()
            ).item()
        )
        trained = [name for name, p in model.named_parameters() if p.requires_grad]
        record["grads"].append(
            _gathered({name: _full(t.grad) for name, t in zip(trained, optimizer.gradient_tensors, strict=True)}, pp)
        )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    states = optimizer.optimizer.state.values()
    record["optimizer_state_bytes"] = sum(
        (value.to_local() if isinstance(value, DTensor) else value).nbytes
        for state in states
        for value in state.values()
        if torch.is_tensor(value) and value.ndim
    )
    record["dtypes"]["state"] = {str(v.dtype) for s in states for v in s.values() if torch.is_tensor(v) and v.ndim}
    record["float8_gathered"] = _float8_gathered(model)
    return record


def _float8_gathered(model) -> list[str]:  # noqa: ANN001
    """The parameters FSDP2 gathers as float8 after training: their shards are torchao's float8-casting weights."""
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    return [
        name
        for name, parameter in model.named_parameters()
        if isinstance(parameter, DTensor) and isinstance(parameter.to_local(), WeightWithDynamicFloat8CastTensor)
    ]


def _gathered(tensors: dict[str, torch.Tensor], pp: DeviceMesh | None) -> dict[str, torch.Tensor]:
    """Every pipeline stage's tensors (each rank holds its stages' only)."""
    if pp is None:
        return tensors
    parts = [None] * pp.size()
    dist.all_gather_object(parts, tensors, group=pp.get_group())
    return {name: value for part in parts for name, value in part.items()}


def _dtypes(model: torch.nn.Module, optimizer: PrecisionOptimizer) -> dict[str, set[str]]:
    """The dtypes of parameters, accumulated gradients and master weights, before the first step."""
    masters = optimizer.copies if optimizer.persistent and optimizer.copies_needed else []
    return {
        "param": {str(p.dtype) for p in model.parameters()},
        "grad": {str(p.grad.dtype) for p in model.parameters() if p.grad is not None},
        "master": {str(m.dtype) for m in masters},
    }


def _worker(rank: int, world: int, scenarios: list[Scenario], directory: str) -> None:
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)  # a hang fails the test instead of stalling CI
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(directory, "store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        for scenario in scenarios:
            record = train_scenario(scenario, world)
            if rank == 0:
                torch.save(record, os.path.join(directory, f"{scenario.name}.pt"))
    finally:
        dist.destroy_process_group()


def run_scenarios(world: int, scenarios: list[Scenario]) -> dict[str, dict]:
    """Each scenario's record from `world` spawned processes."""
    with tempfile.TemporaryDirectory() as directory:
        mp.start_processes(_worker, args=(world, scenarios, directory), nprocs=world, start_method="spawn")
        return {s.name: torch.load(os.path.join(directory, f"{s.name}.pt"), weights_only=False) for s in scenarios}


def max_difference(reference: dict, other: dict) -> dict[str, float]:
    """Largest absolute differences of losses, gradient norms and gradients over all steps."""
    grads = max(
        (reference_grad[name] - step[name]).abs().max().item()
        for reference_grad, step in zip(reference["grads"], other["grads"], strict=True)
        for name in reference_grad
    )
    return {
        "loss": max(abs(a - b) for a, b in zip(reference["loss"], other["loss"], strict=True)),
        "norm": max(abs(a - b) for a, b in zip(reference["norm"], other["norm"], strict=True)),
        "grad": grads,
    }
