"""Hugging Face weights loaded in real gloo processes: every layout's gathered weights equal the files'
tensors bit for bit, and each rank reads only its shards (a fraction of the model), never the whole."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from nxd_ckpt import HFExport, hf_import, load_hf_weights
from nxd_models import GPTConfig, MoESpec, model_family
from nxd_models.hf_qkv import set_qkv_linear
from nxd_parallel import Layout, ParallelDims, build_parallel_model, modules_of
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig


@dataclass(frozen=True)
class Case:
    name: str
    family: str = "megatron"
    tp: int = 1
    pp: int = 1
    ep: int = 1
    kv_heads: int = 2
    layout: Layout = field(default_factory=Layout)
    largest_share: float = 0.6
    """The most of the model's values one rank may read."""

    def spec(self) -> GPTConfig | LlamaConfig:
        if self.family in ("megatron", "moe"):  # 120 tokens padded to 128 rows: tp rank 1's rows run past the file's
            moe = MoESpec(num_experts=4, top_k=2, normalize_top_k_affinities=True) if self.family == "moe" else None
            return GPTConfig(
                vocab_size=120,
                num_layers=2,
                hidden_size=32,
                num_attention_heads=4,
                num_kv_heads=self.kv_heads,
                seq_length=16,
                ffn_hidden_size=64,
                normalization="rmsnorm",
                activation="swiglu",
                position_embedding_type="rope",
                has_bias=False,
                make_vocab_size_divisible_by=8,
                share_embeddings_and_output_weights=False,
                tensor_parallel_size=self.tp,
                moe=moe,
            )
        config = LlamaConfig(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=16,
            tie_word_embeddings=False,
        )
        set_qkv_linear(config, True, True)
        return config


CASES = [
    Case("tp2", tp=2),
    Case("tp2_kv_replicator", tp=2, kv_heads=1, layout=Layout(kv_replicator=2)),
    Case("hf_fused_qkv_tp2", family="hf", tp=2),
    Case("pp2", pp=2, largest_share=0.75),
    Case("dp2_zero1", layout=Layout(zero1=True)),
    Case("moe_ep2", family="moe", ep=2, largest_share=0.7),
]


def _hf_directory(case: Case, directory: Path) -> Path:
    """The case's model as a Hugging Face directory: transformers' own Llama or Mixtral (random weights, seed 5)."""
    spec = case.spec()
    export = HFExport.of(model_family(spec).hf_mapping())
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**export.config))
    out = directory / case.name
    model.save_pretrained(out)
    return out


def _worker(rank: int, world: int, cases: list[Case], directory: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", store=dist.FileStore(os.path.join(directory, "store"), world), rank=rank, world_size=world
    )
    read, original = [0], hf_import._read

    def counted(entry, offset, size, dtype):  # noqa: ANN001, ANN202
        value = original(entry, offset, size, dtype)
        read[0] += value.numel()
        return value

    hf_import._read = counted
    try:
        for case in cases:
            family = model_family(case.spec())
            mesh = ParallelDims(world, tp=case.tp, pp=case.pp, ep=case.ep).build_mesh("cpu")
            model = build_parallel_model(family, case.layout, mesh, torch.device("cpu"), seed=3)
            export, shapes = HFExport.of(family.hf_mapping()), family.parameter_shapes()
            read[0] = 0
            live = {name: t for module in modules_of(model) for name, t in module.state_dict().items()}
            load_hf_weights(Path(directory) / case.name, export, shapes, live)
            full = {
                name: (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone() for name, t in live.items()
            }
            parts: list = [None] * world
            dist.all_gather_object(parts, (full, read[0]))
            if rank == 0:
                torch.save(parts, os.path.join(directory, f"{case.name}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def loaded() -> dict[str, tuple[Path, list]]:
    with tempfile.TemporaryDirectory() as directory:
        sources = {case.name: _hf_directory(case, Path(directory)) for case in CASES}
        mp.start_processes(_worker, args=(2, CASES, directory), nprocs=2, start_method="spawn")
        yield {
            case.name: (
                load_file(sources[case.name] / "model.safetensors"),
                torch.load(Path(directory) / f"{case.name}.pt", weights_only=False),
            )
            for case in CASES
        }


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_rank_holds_the_files_values_and_read_only_its_part(case, loaded):
    files, ranks = loaded[case.name]
    family = model_family(case.spec())
    export, shapes = HFExport.of(family.hf_mapping()), family.parameter_shapes()
    total = sum(tensor.numel() for tensor in files.values())
    gathered = {name: value for full, _ in ranks for name, value in full.items()}
    assert set(gathered) == set(shapes)
    for ours, value in gathered.items():
        if ours in export.stacked:
            theirs = torch.stack([files[key] for key in export.stacked[ours]])
        else:
            theirs = files[export.keys.get(ours) or export.keys[export.tied[ours]]]
        expected = torch.zeros(shapes[ours])
        expected[: theirs.shape[0]] = theirs  # padded vocabulary rows are zero
        assert torch.equal(value, expected), ours
    for _, read in ranks:
        assert 0 < read <= case.largest_share * total, (read, total)
