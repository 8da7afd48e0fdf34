"""`nxd-train generate`: samples of a trained run, as GPT-NeoX's generate.py writes them.

Three modes (`generate.text_gen_type`): unconditional (num_samples continuations of the end-of-document
token), input-file (each prompt of sample_input_file, separated by prompt_end) and interactive (a prompt loop
on the terminal). Completions are JSON lines with NeoX's fields: context, text, length, finished, message,
duration_seconds (and logits with return_logits). Every process of the tensor-parallel layout runs the same
forwards on the same prompts; the first reads the terminal and writes the results.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from nxd_config.schema.inference import GenerateConfig
from nxd_data import save_atomically
from nxd_models.generation import Completion, Sampling, generate

from nxd_train.inference.loading import LoadedRun, say

NOT_STARTED = "WARNING: text generation did not start; try different batching or adjust parameters"
"""NeoX's message for a completion whose first token ended it."""
UNREAD = {
    "unconditional": ("sample_input_file", "prompt_end"),
    "input-file": ("num_samples",),
    "interactive": ("num_samples", "sample_input_file", "sample_output_file", "return_logits", "batch_size"),
}
"""The generate keys each mode does not read."""


def output_path(settings: GenerateConfig) -> Path | None:
    """Where the completions go: sample_output_file, else beside the input file (input-file mode), else nowhere."""
    if settings.sample_output_file is not None:
        return Path(settings.sample_output_file)
    if settings.text_gen_type == "input-file" and settings.sample_input_file is not None:
        return Path(settings.sample_input_file + ".output.jsonl")
    return None


def settings_problems(settings: GenerateConfig) -> list[str]:
    """What stops generation before any model is loaded: an input file that cannot be read, an output file that
    exists or whose folder does not."""
    problems = []
    if settings.text_gen_type == "input-file":
        if settings.sample_input_file is None:
            problems.append(
                "generate.sample_input_file: expected the prompts' file with text_gen_type input-file, found none"
            )
        else:
            try:
                read_prompts(settings)
            except (OSError, UnicodeDecodeError) as error:
                found = (
                    "no file"
                    if isinstance(error, FileNotFoundError)
                    else "a file that is not UTF-8 text"
                    if isinstance(error, UnicodeDecodeError)
                    else f"a file that cannot be read ({getattr(error, 'strerror', None) or error})"
                )
                problems.append(
                    f"generate.sample_input_file: expected a UTF-8 text file of prompts, found {found} "
                    f"at {settings.sample_input_file}"
                )
    out = output_path(settings)
    if settings.text_gen_type != "interactive" and out is not None:
        if out.exists() or out.is_symlink():
            problems.append(
                f"generate.sample_output_file: {out} exists; expected a new file (nxd-train never writes "
                "over one): name another, or move it away"
            )
        elif not out.resolve().parent.is_dir():
            problems.append(
                f"generate.sample_output_file: expected a file in an existing folder, found no folder "
                f"{out.resolve().parent}"
            )
    return problems


def settings_notices(settings: GenerateConfig) -> list[str]:
    """The generate keys a file sets that its mode does not read."""
    mode = settings.text_gen_type
    return [f"generate.{key}: text_gen_type {mode} does not read it" for key in UNREAD[mode] if settings.is_set(key)]


def read_prompts(settings: GenerateConfig) -> list[str]:
    """The prompts of sample_input_file: split at prompt_end, stripped, empty ones left out (as NeoX reads them)."""
    text = Path(settings.sample_input_file).read_text(encoding="utf-8")
    return [prompt.strip() for prompt in text.split(settings.prompt_end) if prompt.strip()]


def run_generation(run: LoadedRun, settings: GenerateConfig, seed: int) -> int:
    """Generate as `settings` say; 0 when done."""
    generator = torch.Generator(device=run.fabric.device).manual_seed(seed)
    if settings.text_gen_type == "interactive":
        return _interactive(run, settings, generator)
    prompts = [""] * settings.num_samples if settings.text_gen_type == "unconditional" else read_prompts(settings)
    records = list(_complete(run, settings, prompts, generator))
    out = output_path(settings)
    if not run.first:
        return 0
    if out is not None:
        save_atomically(out, "".join(json.dumps(record) + "\n" for record in records).encode())
    else:
        for record in records:
            print(json.dumps(record), flush=True)
    tokens = sum(record["length"] for record in records)
    seconds = sum(record["duration_seconds"] for record in records)
    too_long = sum(1 for record in records if record["text"] is None and record["message"] != NOT_STARTED)
    skipped = f"; {too_long} prompt(s) longer than the context, each with its message" if too_long else ""
    where = f" in {out}" if out is not None else ""
    say(run, f"nxd-train generate: {len(records)} completion(s), {tokens} tokens in {seconds:.2f} s{where}{skipped}")
    return 0


def _complete(
    run: LoadedRun, settings: GenerateConfig, prompts: list[str], generator: torch.Generator
) -> Iterator[dict[str, object]]:
    """Each prompt's record, `batch_size` prompts at a time; a prompt the context cannot hold gets a message."""
    eod = run.tokenizer.eod_id
    sampling = Sampling(settings.temperature, settings.top_k, settings.top_p)
    cache = None if settings.recompute else run.new_cache
    most = 2 * run.context * run.tokenizer.max_token_bytes  # bytes that hold more than the context's tokens, as a rule
    for start in range(0, len(prompts), settings.batch_size):
        batch = prompts[start : start + settings.batch_size]
        sizes = [len(prompt.encode()) for prompt in batch]
        heads = {
            index: prompt.encode()[:most].decode(errors="ignore")
            for index, prompt in enumerate(batch)
            if sizes[index] > most
        }  # a long prompt: its first `most` bytes decide, the rest is not read
        over = {
            index: len(tokens)
            for index, tokens in zip(heads, run.tokenizer.encode(list(heads.values())), strict=True)
            if len(tokens) >= run.context
        }
        encoded = iter(run.tokenizer.encode([prompt for index, prompt in enumerate(batch) if index not in over]))
        ids = [[] if index in over else next(encoded) or [eod] for index in range(len(batch))]  # empty: end token
        fits = [index for index, tokens in enumerate(ids) if index not in over and len(tokens) < run.context]
        started = time.perf_counter()
        completions = generate(
            run.logits,
            cache,
            [ids[i] for i in fits],
            maximum_tokens=settings.maximum_tokens,
            context=run.context,
            end_id=eod,
            vocab_size=run.vocab_size,
            sampling=sampling,
            generator=generator,
            return_logits=settings.return_logits,
            device=run.fabric.device,
        )
        seconds = (time.perf_counter() - started) / max(1, len(fits))
        done = dict(zip(fits, completions, strict=True))
        for index, prompt in enumerate(batch):
            if index in done:
                yield _record(run, prompt, done[index], seconds)
            else:
                size = (
                    f"{sizes[index]:,} bytes (its first {most:,} alone are {over[index]:,} tokens)"
                    if index in over
                    else f"{len(ids[index])} tokens"
                )
                yield {
                    "context": prompt,
                    "text": None,
                    "length": 0,
                    "finished": False,
                    "message": f"WARNING: the prompt's {size} leave no room in the model's context of {run.context} "
                    f"positions; expected at most {run.context - 1} tokens",
                    "duration_seconds": 0.0,
                }


def _record(run: LoadedRun, prompt: str, completion: Completion, seconds: float) -> dict[str, object]:
    started = bool(completion.tokens)
    record: dict[str, object] = {
        "context": prompt,
        "text": run.tokenizer.decode(completion.tokens) if started else None,
        "length": len(completion.tokens),
        "finished": completion.finished,
        "message": None if started else NOT_STARTED,
        "duration_seconds": seconds,
    }
    if completion.logits is not None:  # a filtered-out token's -inf as null: JSON has no infinity
        record["logits"] = [[v if math.isfinite(v) else None for v in row] for row in completion.logits]
    return record


def _interactive(run: LoadedRun, settings: GenerateConfig, generator: torch.Generator) -> int:
    """Prompts typed on the terminal, each answered as it ends (at a newline, or at prompt_end when that is
    something else); the end of input (Ctrl-D) or the prompt `exit` ends the loop."""
    while True:
        prompt = _read_prompt(settings.prompt_end) if run.first else None
        prompt = run.fabric.broadcast(prompt, src=0)
        if prompt is None:
            return 0
        record = next(_complete(run, settings, [prompt], generator))
        if run.first:
            print(f"Generated Text: {record['text'] if record['text'] is not None else ''}", flush=True)
            if record["message"]:
                print(record["message"], flush=True)


def _read_prompt(prompt_end: str) -> str | None:
    """One prompt from standard input (None at its end, or at `exit`)."""
    text = ""
    while True:
        try:
            line = input("Context prompt >>> " if not text else "")
        except EOFError:
            return None
        if prompt_end == "\n":
            text = line
            break
        if prompt_end in line:
            text += line.split(prompt_end)[0]
            break
        text += line + "\n"
    return None if text.strip() == "exit" else text
