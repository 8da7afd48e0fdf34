"""`--smoke`, which every benchmark takes: tiny shapes and a step or two per column, so that the default test suite
runs each script in seconds and sees it still prints its table. A smoke run's figures measure nothing."""

from __future__ import annotations

import argparse
from typing import Any

SMOKE_HELP = "tiny shapes, a step or two per column: checks the script runs; its figures measure nothing"
TINY_MODEL = [
    "model.num_layers=2",
    "model.hidden_size=64",
    "model.ffn_hidden_size=176",
    "model.num_attention_heads=4",
    "model.num_kv_heads=2",
    "data.seq_length=64",
    "model.encoder_seq_length=64",
]
"""Overrides that shrink an nxd config's Llama-shaped model to two layers of width 64 at sequence 64."""


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None = None, **smoke: Any) -> argparse.Namespace:
    """`parser`'s arguments with --smoke added; under --smoke, each of `smoke` replaces the argument of its name."""
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    if args.smoke:
        for name, value in smoke.items():
            setattr(args, name, value)
    return args
