"""Start-up peak host memory and time per rank: shard-local initialisation against a whole-model build
per rank, and streamed Hugging Face loading against transformers' `from_pretrained`.

    uv run --group bench python benchmarks/startup.py [--layouts 1,tp2,pp2,dp2_zero1] [--skip-hf]

The model has Llama-3-8B's width (hidden 4096, 32 heads, 8 KV heads, ffn 14336, vocab 128256) and 4
layers: 1.92B parameters, 7.7 GB in fp32. Each measurement runs in fresh gloo processes on the CPU
(peak resident memory is the process's own, VmHWM; "base" is the resident memory after imports):
- nxd: `build_parallel_model`, each rank initialising the modules it holds one at a time;
- whole model per rank: the same, but every rank first builds the whole seeded model and copies its
  slices out (nxd's start-up before shard-local initialisation), one rank at a time
  (sequential_move_factor 1), so that two whole copies never exist on this 23 GiB machine.
With the Hugging Face part a directory of the model (fp32 safetensors, written once by transformers)
is loaded at TP2 by nxd as nxd-train loads initial weights (shards allocated without random values,
then `load_hf_weights`, each rank reading its slices) and by `AutoModelForCausalLM.from_pretrained`
in one process (whose weights may be views of the mapped file: each is read once after loading, as
a first step would, so that they are resident). `--layouts ""` runs the Hugging Face part alone.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from nxd_ckpt import HFExport, load_hf_weights
from nxd_models import GPTConfig, model_family, resident_memory
from nxd_parallel import Layout, ParallelDims, build_parallel_model, modules_of

SPEC = GPTConfig(vocab_size=128256, num_layers=4, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
                 seq_length=2048, ffn_hidden_size=14336, normalization="rmsnorm", activation="swiglu",
                 position_embedding_type="rope", rope_theta=500000.0, has_bias=False, hidden_dropout=0.0,
                 attention_dropout=0.0, make_vocab_size_divisible_by=128,
                 share_embeddings_and_output_weights=False)  # fmt: skip
LAYOUTS = {"1": (1, {}, Layout()), "tp2": (2, {"tp": 2}, Layout()), "pp2": (2, {"pp": 2}, Layout()),
           "dp2_zero1": (2, {}, Layout(zero1=True))}  # fmt: skip
GIB = 2**30


class WholeModelFirst:
    """A family whose initial values come from a whole build of the model (what every rank did before
    shard-local initialisation)."""

    def __init__(self, family: Any):
        self.family = family

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "family":
            raise AttributeError(name)
        return getattr(self.family, name)

    def initial_values(self, *, seed: int, device: torch.device, names: Any = None) -> Iterator[tuple[str, Any]]:
        whole = self.family.build(device, seed=seed)
        yield from (dict(whole.named_parameters()) | dict(whole.named_buffers())).items()


@dataclass(frozen=True)
class Job:
    method: str
    """"nxd", "whole" or "from_pretrained"."""
    layout: str
    hf_dir: str | None = None


def _worker(rank: int, world: int, job: Job, directory: str) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if world > 1:
        store = dist.FileStore(os.path.join(directory, "store"), world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    base = resident_memory() / GIB
    started = time.perf_counter()
    if job.method == "from_pretrained":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(job.hf_dir, dtype=torch.float32)
        with torch.no_grad():  # its weights may still be pages of the mapped file: read each once, as a step would
            for parameter in model.parameters():
                parameter.sum()
    else:
        _, sizes, layout = LAYOUTS[job.layout]
        family = model_family(SPEC)
        mesh = ParallelDims(world, **sizes).build_mesh("cpu")
        layout = Layout(zero1=layout.zero1, ranks_at_once=1 if job.method == "whole" else world)
        loaded = family.parameter_shapes() if job.hf_dir is not None else ()  # as nxd-train: no random draws
        model = build_parallel_model(WholeModelFirst(family) if job.method == "whole" else family, layout, mesh,
                                     torch.device("cpu"), seed=1, loaded=loaded)  # fmt: skip
        if job.hf_dir is not None:
            export, shapes = HFExport.of(family.hf_mapping()), family.parameter_shapes()
            live = {key: value for module in modules_of(model) for key, value in module.state_dict().items()}
            load_hf_weights(Path(job.hf_dir), export, shapes, live)
    seconds = time.perf_counter() - started
    peak = resident_memory(peak=True) / GIB
    held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    result = {"rank": rank, "seconds": seconds, "peak_gib": peak, "base_gib": base, "held_gib": held * 4 / GIB}
    Path(directory, f"rank{rank}.json").write_text(json.dumps(result))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def measure(job: Job) -> list[dict[str, float]]:
    world = 1 if job.method == "from_pretrained" else LAYOUTS[job.layout][0]
    with tempfile.TemporaryDirectory() as directory:
        mp.start_processes(_worker, args=(world, job, directory), nprocs=world, start_method="spawn")
        return [json.loads(Path(directory, f"rank{rank}.json").read_text()) for rank in range(world)]


def _hf_directory(root: Path) -> Path:
    """The model as transformers writes it (LlamaForCausalLM, fp32 safetensors), built on the meta
    device and filled with nxd's seeded values so no second whole copy is made."""
    from transformers import LlamaConfig, LlamaForCausalLM

    family = model_family(SPEC)
    export = HFExport.of(family.hf_mapping())
    model = family.build(seed=7)
    with torch.device("meta"):
        theirs = LlamaForCausalLM(LlamaConfig(**export.config))
    ours = model.state_dict()
    state = {hf: ours[key][: export.vocab_size] if key in export.vocab_padded_keys else ours[key]
             for key, hf in export.keys.items()}  # fmt: skip
    theirs.load_state_dict(state, assign=True)
    del model, ours
    out = root / "llama-8b-width-4-layers"
    theirs.save_pretrained(out)
    return out


def _row(label: str, results: list[dict[str, float]]) -> str:
    peak = max(r["peak_gib"] for r in results)
    held = max(r["held_gib"] for r in results)
    base = max(r["base_gib"] for r in results)
    seconds = max(r["seconds"] for r in results)
    return f"| {label} | {held:.2f} | {base:.2f} | {peak:.2f} | {seconds:.1f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--skip-hf", action="store_true")
    args = parser.parse_args()
    params = sum(shape.numel() for shape in model_family(SPEC).parameter_shapes().values())
    print(f"model: {params / 1e9:.2f}B parameters, {params * 4 / GIB:.2f} GiB fp32; torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    print("| start-up | parameters held per rank (GiB) | base RSS | peak RSS per rank (GiB) | seconds |")
    print("|---|---:|---:|---:|---:|")
    for layout in filter(None, args.layouts.split(",")):
        nxd, whole = measure(Job("nxd", layout)), measure(Job("whole", layout))
        print(_row(f"{layout}: nxd", nxd), flush=True)
        print(_row(f"{layout}: whole model per rank", whole), flush=True)
        ratio = max(r["peak_gib"] for r in nxd) / max(r["peak_gib"] for r in whole)
        print(f"|   peak ratio nxd / whole | | | {ratio:.2f}x | |", flush=True)
    if args.skip_hf:
        return
    with tempfile.TemporaryDirectory(dir=os.environ.get("NXD_BENCH_DIR")) as root:
        hf_dir = _hf_directory(Path(root))
        nxd = measure(Job("nxd", "tp2", str(hf_dir)))
        theirs = measure(Job("from_pretrained", "1", str(hf_dir)))
        print(_row("HF directory, nxd TP2 (init + streamed load)", nxd), flush=True)
        print(_row("HF directory, from_pretrained (1 process)", theirs), flush=True)
        ratio = max(r["peak_gib"] for r in nxd) / max(r["peak_gib"] for r in theirs)
        print(f"|   peak ratio nxd / from_pretrained | | | {ratio:.2f}x | |", flush=True)


if __name__ == "__main__":
    main()
