"""Start-up: how long a command takes to get going, and peak host memory and time per rank at any model size.

    uv run --group bench python benchmarks/startup.py --commands [--repeats 3]
    uv run --group bench python benchmarks/startup.py [--layouts 1,tp2,pp2,dp2_zero1] [--skip-hf]

`--commands` times whole processes, each started fresh, best and median of `--repeats`: `import torch`, `import
lightning_fabric`, `nxd-train config check` on the tiny config, and the time from starting the default job (the
embedded tiny config, logging every step) to its first logged step, against the same for transformers' `Trainer`
on the same model (a LlamaForCausalLM of the tiny config's shape, the same batch, AdamW, gradient accumulation 2;
its data already in memory); with the targets (`config check` within 1.5x `import torch`, the first step within
`import lightning_fabric` + 4 s). Then the one-time costs a newcomer pays: the built-in corpus's BPE training
and preprocessing (the default job from an empty cache), and the MFU ceiling's matmul measurement, repeated, to
show how much its value moves between starts.

Without `--commands`:

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
import statistics
import subprocess
import sys
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
from smoke import parse_args

SPEC = GPTConfig(
    vocab_size=128256,
    num_layers=4,
    hidden_size=4096,
    num_attention_heads=32,
    num_kv_heads=8,
    seq_length=2048,
    ffn_hidden_size=14336,
    normalization="rmsnorm",
    activation="swiglu",
    position_embedding_type="rope",
    rope_theta=500000.0,
    has_bias=False,
    hidden_dropout=0.0,
    attention_dropout=0.0,
    make_vocab_size_divisible_by=128,
    share_embeddings_and_output_weights=False,
)
SMOKE_SPEC = GPTConfig(
    vocab_size=512,
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    num_kv_heads=2,
    seq_length=64,
    ffn_hidden_size=176,
    normalization="rmsnorm",
    activation="swiglu",
    position_embedding_type="rope",
    has_bias=False,
    hidden_dropout=0.0,
    attention_dropout=0.0,
    share_embeddings_and_output_weights=False,
)
LAYOUTS = {
    "1": (1, {}, Layout()),
    "tp2": (2, {"tp": 2}, Layout()),
    "pp2": (2, {"pp": 2}, Layout()),
    "dp2_zero1": (2, {}, Layout(zero1=True)),
}
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
    smoke: bool = False

    @property
    def spec(self) -> GPTConfig:
        return SMOKE_SPEC if self.smoke else SPEC


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
        family = model_family(job.spec)
        mesh = ParallelDims(world, **sizes).build_mesh("cpu")
        layout = Layout(zero1=layout.zero1, ranks_at_once=1 if job.method == "whole" else world)
        loaded = family.parameter_shapes() if job.hf_dir is not None else ()  # as nxd-train: no random draws
        model = build_parallel_model(
            WholeModelFirst(family) if job.method == "whole" else family,
            layout,
            mesh,
            torch.device("cpu"),
            seed=1,
            loaded=loaded,
        )
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


def _hf_directory(root: Path, spec: GPTConfig) -> Path:
    """The model as transformers writes it (LlamaForCausalLM, fp32 safetensors), built on the meta
    device and filled with nxd's seeded values so no second whole copy is made."""
    from transformers import LlamaConfig, LlamaForCausalLM

    family = model_family(spec)
    export = HFExport.of(family.hf_mapping())
    model = family.build(seed=7)
    with torch.device("meta"):
        theirs = LlamaForCausalLM(LlamaConfig(**export.config))
    ours = model.state_dict()
    state = {
        hf: ours[key][: export.vocab_size] if key in export.vocab_padded_keys else ours[key]
        for key, hf in export.keys.items()
    }
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


TRAINER = """
import sys, tempfile, torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments
class FirstLog(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        print(f"step {state.global_step}", flush=True)
config = LlamaConfig(vocab_size=4096, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
torch.manual_seed(1234)
model = LlamaForCausalLM(config)
ids = torch.randint(0, 4096, (4096, 64))
data = [{"input_ids": row, "labels": row} for row in ids]
args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=300, per_device_train_batch_size=4,
                         gradient_accumulation_steps=2, learning_rate=3e-3, weight_decay=0.01, adam_beta2=0.95,
                         max_grad_norm=1.0, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                         disable_tqdm=True, dataloader_num_workers=0)
Trainer(model=model, args=args, train_dataset=data, callbacks=[FirstLog()]).train()
"""
"""transformers' Trainer on the tiny config's model, printing `step N` at each log (the first after one step)."""


def _wall(command: list[str], *, cwd: Path, until: str | None = None, env: dict[str, str] | None = None) -> float:
    """Seconds from starting `command` to its exit, or to its first stdout line starting with `until` (the process
    is then stopped)."""
    started = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    if until is None:
        process.communicate()
        took = time.perf_counter() - started
    else:
        took = float("nan")
        for line in process.stdout:
            if line.startswith(until):
                took = time.perf_counter() - started
                break
        process.kill()
        process.wait()
    if until is None and process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {process.returncode}")
    return took


def _timed(label: str, repeats: int, command: list[str], **kwargs: object) -> tuple[str, float]:
    times = []
    with tempfile.TemporaryDirectory() as work:
        for _ in range(repeats):
            times.append(_wall(command, cwd=Path(work), **kwargs))
    best, median = min(times), statistics.median(times)
    print(f"| {label} | {best:.2f} | {median:.2f} |", flush=True)
    return label, best


def commands_table(repeats: int) -> None:
    """The start-up table (see the module docstring)."""
    python = sys.executable
    nxd = str(Path(python).with_name("nxd-train"))
    tiny = str(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml")
    first_step = ["trainer.log_every_n_steps=1"]
    with tempfile.TemporaryDirectory() as warm:  # the default job's caches (BPE, corpus, indices), filled once
        cache = {"XDG_CACHE_HOME": warm}
        _wall([nxd, *first_step], cwd=Path(warm), until="step 1/", env=cache)
        print(
            f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} CPUs "
            f"({_cpu_model()}); best and median of {repeats} fresh processes\n"
        )
        print("| start-up | best (s) | median (s) |\n|---|---:|---:|")
        torch_s = _timed("`import torch`", repeats, [python, "-c", "import torch"])[1]
        fabric_s = _timed("`import lightning_fabric`", repeats, [python, "-c", "import lightning_fabric"])[1]
        check_s = _timed(
            "`nxd-train config check configs/tiny.yaml`", repeats, [nxd, "config", "check", tiny], env=cache
        )[1]
        nxd_s = _timed(
            "nxd-train default job: start to first logged step", repeats, [nxd, *first_step], until="step 1/", env=cache
        )[1]
        trainer_s = _timed(
            "transformers Trainer, same model: start to first logged step",
            repeats,
            [python, "-c", TRAINER],
            until="step 1",
        )[1]
    print(
        f"\n| target | measured | limit | met |\n|---|---:|---:|---|\n"
        f"| config check / import torch | {check_s / torch_s:.2f}x | 1.50x | {check_s <= 1.5 * torch_s} |\n"
        f"| first logged step - import lightning_fabric | {nxd_s - fabric_s:+.2f} s | +4.00 s | "
        f"{nxd_s <= fabric_s + 4} |\n"
        f"| nxd / Trainer, first logged step | {nxd_s / trainer_s:.2f}x | below 1 | {nxd_s < trainer_s} |\n"
    )
    print("| one-time cost | seconds |\n|---|---:|")
    with tempfile.TemporaryDirectory() as cold:
        from_empty = _wall([nxd, *first_step], cwd=Path(cold), until="step 1/", env={"XDG_CACHE_HOME": cold})
    print(f"| default job from an empty cache: start to first logged step | {from_empty:.2f} |")
    print(
        f"|   of which BPE training, corpus preprocessing and indices (against a warm cache) | "
        f"{from_empty - nxd_s:.2f} |"
    )
    from nxd_models.device_peaks import measured_peak

    peaks, spent = [], []
    for _ in range(5):
        started = time.perf_counter()
        peaks.append(measured_peak(torch.device("cpu"), torch.float32) / 1e12)
        spent.append(time.perf_counter() - started)
    print(f"| MFU ceiling (fp32 matmuls, best of 3 per size) at each start | {statistics.median(spent):.2f} |")
    print(
        f"\nceiling measured 5 times in this process: {', '.join(f'{p:.3f}' for p in peaks)} TFLOP/s "
        f"(spread {(max(peaks) - min(peaks)) / max(peaks):.0%})"
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", action="store_true", help="the command start-up table (see the docstring)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--skip-hf", action="store_true")
    args = parse_args(parser, layouts="1", commands=False)
    if args.commands:
        commands_table(args.repeats)
        return
    spec = SMOKE_SPEC if args.smoke else SPEC
    params = sum(shape.numel() for shape in model_family(spec).parameter_shapes().values())
    print(
        f"model: {params / 1e9:.2f}B parameters, {params * 4 / GIB:.2f} GiB fp32; torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs"
    )
    print("| start-up | parameters held per rank (GiB) | base RSS | peak RSS per rank (GiB) | seconds |")
    print("|---|---:|---:|---:|---:|")
    for layout in filter(None, args.layouts.split(",")):
        nxd, whole = measure(Job("nxd", layout, smoke=args.smoke)), measure(Job("whole", layout, smoke=args.smoke))
        print(_row(f"{layout}: nxd", nxd), flush=True)
        print(_row(f"{layout}: whole model per rank", whole), flush=True)
        ratio = max(r["peak_gib"] for r in nxd) / max(r["peak_gib"] for r in whole)
        print(f"|   peak ratio nxd / whole | | | {ratio:.2f}x | |", flush=True)
    if args.skip_hf:
        return
    with tempfile.TemporaryDirectory(dir=os.environ.get("NXD_BENCH_DIR")) as root:
        hf_dir = _hf_directory(Path(root), spec)
        nxd = measure(Job("nxd", "tp2", str(hf_dir), args.smoke))
        theirs = measure(Job("from_pretrained", "1", str(hf_dir), args.smoke))
        print(_row("HF directory, nxd TP2 (init + streamed load)", nxd), flush=True)
        print(_row("HF directory, from_pretrained (1 process)", theirs), flush=True)
        ratio = max(r["peak_gib"] for r in nxd) / max(r["peak_gib"] for r in theirs)
        print(f"|   peak ratio nxd / from_pretrained | | | {ratio:.2f}x | |", flush=True)


if __name__ == "__main__":
    main()
