"""What the digest of every checkpoint file costs a save, and how fast `ckpt verify` reads, from one run.

    uv run python benchmarks/ckpt_checksums.py [--gib 1.0] [--repeats 3] [--dir DIR]

A state of `--gib` GiB of fp32 tensors is saved with torch.distributed.checkpoint's own file writer
and with nxd-ckpt's checksumming writer (which hashes the bytes as it writes them), alternately (each
going first in turn), `--repeats` times each with fsync; the medians and their ratio are printed. Then a complete nxd
checkpoint of the same state is verified (every file's digest against its marker), once from the page
cache (the file was just written) and reported in GiB/s beside a plain read of the same bytes.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from nxd_ckpt import Checkpointer, SavePolicy, read_info
from nxd_ckpt.checksumming_writer import ChecksummingWriter
from smoke import parse_args
from torch.distributed.checkpoint import FileSystemWriter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parse_args(parser, gib=0.01, repeats=1)
    root = Path(tempfile.mkdtemp(dir=args.dir))
    count = int(args.gib * 2**30 / 4 / 16)
    state = {f"t{i}": torch.randn(count // 16, 16) for i in range(16)}
    size = sum(t.numel() * 4 for t in state.values())
    timings = {"dcp FileSystemWriter": [], "nxd ChecksummingWriter": []}
    for repeat in range(args.repeats):
        for name in list(timings)[:: 1 if repeat % 2 else -1]:  # each goes first in turn
            folder = root / f"{name.split()[0]}-{repeat}"
            writer = (
                FileSystemWriter(folder, sync_files=True)
                if name.startswith("dcp")
                else ChecksummingWriter(folder, 0, sync_files=True)
            )
            started = time.perf_counter()
            dcp.save(state, storage_writer=writer, no_dist=True)
            timings[name].append(time.perf_counter() - started)
            shutil.rmtree(folder)
    plain, hashed = (statistics.median(timings[name]) for name in timings)
    print(f"state {size / 2**30:.2f} GiB, {args.repeats} saves each, fsync on")
    print(f"{'save':<26}{'median s':>10}{'MB/s':>10}")
    for name, seconds in zip(timings, (plain, hashed), strict=True):
        print(f"{name:<26}{seconds:>10.2f}{size / seconds / 1e6:>10.0f}")
    print(f"checksum cost on save: {hashed / plain:.3f}x the plain save's time")
    path = Checkpointer(root / "ckpts", SavePolicy(filename="bench")).save(
        state, step=1, consumed_samples=0, metrics={}
    )
    info = read_info(path)
    started = time.perf_counter()
    info.verified(contents=True)
    verify = time.perf_counter() - started
    started = time.perf_counter()
    for name in info.files:
        with open(path / name, "rb") as handle:
            while handle.read(1 << 22):
                pass
    read = time.perf_counter() - started
    print(
        f"verify (page cache): {info.size / verify / 2**30:.2f} GiB/s; plain read of the same files: "
        f"{info.size / read / 2**30:.2f} GiB/s ({verify / read:.2f}x its time)"
    )
    shutil.rmtree(root)


if __name__ == "__main__":
    main()
