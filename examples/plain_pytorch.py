"""nxd's packages as libraries in a plain PyTorch training script: no config file, no nxd-train.

    python -m torch.distributed.run --standalone --nproc_per_node 2 examples/plain_pytorch.py --out runs/plain
    python -m torch.distributed.run --standalone --nproc_per_node 2 examples/plain_pytorch.py --out runs/plain \\
        --resume runs/plain/checkpoints/step=4

- nxd-data: writes a Megatron indexed dataset (.bin/.idx) of random tokens, cuts it into GPT samples
  in Megatron's shuffled order, and feeds each data-parallel rank its part of every global batch
  (`PretrainingSampler`, whose only state is the number of samples consumed).
- nxd-models + nxd-parallel: a small Llama-shaped decoder, sharded over the ranks with ZeRO-1
  (`build_parallel_model`: every rank's shards hold the values a one-process build would have).
- nxd-ckpt: saves model, optimizer and data position as a sharded checkpoint with a completion
  marker, and resumes from it exactly.

Each step prints `step N loss L` on rank 0; the loss is the mean over the whole global batch.
"""

from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from nxd_ckpt import Checkpointer, SavePolicy, load_checkpoint
from nxd_data import GPTDataset, IndexedDataset, IndexedDatasetWriter, PretrainingSampler, SampleFormat, collate
from nxd_models import GPTConfig, model_family
from nxd_parallel import Layout, ParallelDims, build_parallel_model, clip_gradients
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.utils.data import DataLoader

VOCAB, SEQ, GLOBAL_BATCH, MICRO_BATCH = 256, 32, 8, 2


def write_corpus(prefix: Path) -> None:
    """Rank 0 writes 200 documents of random tokens (id 0 ends each document); the others wait."""
    if dist.get_rank() == 0 and not Path(f"{prefix}.idx").exists():
        prefix.parent.mkdir(parents=True, exist_ok=True)
        generator = np.random.default_rng(0)
        with IndexedDatasetWriter(prefix, np.uint16) as writer:
            for _ in range(200):
                writer.add_document([*generator.integers(1, VOCAB, generator.integers(5, 60)), 0])
    dist.barrier()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save-at", type=int, default=4)
    parser.add_argument("--resume", type=Path, default=None)
    args = parser.parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if torch.cuda.is_available() else torch.device("cpu")

    write_corpus(args.out / "data" / "tokens")
    indexed = IndexedDataset(args.out / "data" / "tokens")
    samples = GPTDataset(
        indexed,
        "train",
        (0, len(indexed)),
        None,
        SampleFormat(seq_length=SEQ, eod_id=0),
        seed=1,
        cache_dir=args.out / "data" / "index-cache",
    )

    spec = GPTConfig(
        vocab_size=VOCAB,
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_kv_heads=2,
        seq_length=SEQ,
        normalization="rmsnorm",
        activation="swiglu",
        position_embedding_type="rope",
        has_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    family = model_family(spec)
    mesh = ParallelDims(world).build_mesh(device.type)  # every rank a data-parallel rank
    model = build_parallel_model(family, Layout(zero1=True), mesh, device, seed=1234)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)

    sampler = PretrainingSampler(len(samples), GLOBAL_BATCH, MICRO_BATCH, world, rank, steps=args.steps)
    done = 0
    if args.resume is not None:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state, "data": sampler.state_dict()}
        info = load_checkpoint(args.resume, state)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        done = info.step
        sampler = sampler.resumed(state["data"], steps=args.steps - done)
    batches = iter(DataLoader(samples, batch_sampler=sampler, collate_fn=collate))
    checkpointer = Checkpointer(args.out / "checkpoints", SavePolicy(filename="{step}", save_top_k=-1))

    for step in range(done + 1, args.steps + 1):
        total = torch.zeros((), dtype=torch.float64, device=device)
        for _ in range(sampler.accumulation):
            batch = {key: value.to(device) for key, value in next(batches).items()}
            logits = family.logits(model, batch)
            loss = F.cross_entropy(
                logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100, reduction="sum"
            ) / (GLOBAL_BATCH * SEQ)
            (loss * world).backward()  # ZeRO-1 averages gradients over the ranks; each holds 1/world of the batch
            total += loss.detach().double()
        clip_gradients(list(model.parameters()), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        dist.all_reduce(total)
        if rank == 0:
            print(f"step {step} loss {total.item():.10f}", flush=True)
        if step == args.save_at:
            model_state, optimizer_state = get_state_dict(model, optimizer)
            consumed = step * GLOBAL_BATCH
            checkpointer.save(
                {
                    "model": model_state,
                    "optimizer": optimizer_state,
                    "data": sampler.state_dict() | {"consumed_samples": consumed},
                },
                step=step,
                consumed_samples=consumed,
                metrics={"loss": total.item()},
            )
    checkpointer.wait()
    # collect reference cycles that still hold gloo work while the process group is alive: freed
    # later, during interpreter finalisation, they abort the process ("terminate called without an
    # active exception") in about one run of three
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
