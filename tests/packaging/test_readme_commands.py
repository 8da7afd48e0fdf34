"""README.md's shell blocks marked `<!-- runs -->` (and, with --runslow, `<!-- runs: slow -->`) run as written, in
order, in one folder, as a newcomer following the README runs them: `uv run` finds this project (UV_PROJECT), the
`configs/` the commands name is the repository's, and the files they name as placeholders (`docs.jsonl.zst`,
`path/to/tokenizer.json`) are made here first, as a user would have them. Each command must exit 0."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import zstandard
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tests.packaging.test_packages import ROOT

MARKED = re.compile(r"^<!-- runs(: slow)? -->\n```bash\n(.*?)^```$", flags=re.S | re.M)


def readme_blocks() -> list[tuple[bool, str]]:
    """(slow, script) of each marked block, in README order."""
    return [(bool(slow), body) for slow, body in MARKED.findall((ROOT / "README.md").read_text())]


def _placeholders(folder) -> None:
    """The files README commands name: a jsonl.zst of documents and a tokenizer.json trained on them."""
    lines = [
        f"Document {i}: def function_{i}(value): return value * {i} + {i % 7}  # a line of code" for i in range(3000)
    ]
    (folder / "docs.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress("".join(json.dumps({"text": line}) + "\n" for line in lines).encode())
    )
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bpe.train_from_iterator(
        lines,
        trainers.BpeTrainer(
            vocab_size=512,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    (folder / "path" / "to").mkdir(parents=True)
    bpe.save(str(folder / "path" / "to" / "tokenizer.json"))


def test_the_readme_marks_runnable_blocks_and_names_no_placeholder_dots() -> None:
    blocks = readme_blocks()
    assert any(not slow for slow, _ in blocks) and any(slow for slow, _ in blocks)
    for _, script in blocks:
        assert not re.search(r"nxd-train \.\.\.|^\.\.\.", script, flags=re.M), script  # every command complete


def test_readme_commands_run_as_written(tmp_path, request) -> None:
    slow = request.config.getoption("--runslow")
    chosen = [script for is_slow, script in readme_blocks() if slow or not is_slow]
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    _placeholders(tmp_path)
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv, "uv runs the README's commands"
    environment = {
        **os.environ,
        "UV_PROJECT": str(ROOT),
        "UV_FROZEN": "1",
        "PATH": f"{os.path.dirname(uv)}{os.pathsep}{os.environ['PATH']}",
        "PYTHONWARNINGS": "ignore",
    }
    for index, script in enumerate(chosen):
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=environment,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert done.returncode == 0, (
            f"README block {index + 1}:\n{script}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        )
        print(f"ran README block {index + 1}: {len(script.strip().splitlines())} lines")
