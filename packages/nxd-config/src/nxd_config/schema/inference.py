"""`generate` and `eval`: what `nxd-train generate` and `nxd-train eval` do with a trained run (nxd extensions;
GPT-NeoX's generate.py / eval.py keys map onto them)."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from ._base import Section, Status, frozen_list, key

TRAIN = "nxd-train"
EXT = Status.EXTENSION
GENERATE = "nxd-train generate reads it (GPT-NeoX's generate.py key of the same name; NxDT has no generation)"
EVAL = "nxd-train eval reads it (GPT-NeoX's eval.py keys; NxDT has no evaluation harness)"


class GenerateConfig(Section):
    """Sampling from the run's newest checkpoint (GPT-NeoX's NeoXArgsTextgen)."""

    text_gen_type: Literal["unconditional", "input-file", "interactive"] = key(
        "unconditional",
        "unconditional: num_samples continuations of the end-of-document token; input-file: one per "
        "prompt of sample_input_file; interactive: a prompt loop on the terminal.",
        by=TRAIN,
        status=EXT,
        note=GENERATE,
    )
    temperature: float = key(
        0.0,
        "Divides the logits before sampling; greedy decoding where temperature, top_k and top_p are all 0.",
        by=TRAIN,
        status=EXT,
        note=GENERATE,
        ge=0,
    )
    top_k: int = key(0, "Sample among the k most likely tokens (0: all).", by=TRAIN, status=EXT, note=GENERATE, ge=0)
    top_p: float = key(
        0.0,
        "Sample from the smallest set of tokens whose probability reaches top_p (0: all).",
        by=TRAIN,
        status=EXT,
        note=GENERATE,
        ge=0,
        le=1,
    )
    maximum_tokens: int = key(
        64,
        "Tokens generated per prompt at most (fewer at the end-of-document token or the model's context).",
        by=TRAIN,
        status=EXT,
        note=GENERATE,
        ge=1,
    )
    prompt_end: str = key(
        "\n",
        "What separates the prompts of sample_input_file, and ends an interactive prompt.",
        by=TRAIN,
        status=EXT,
        note=GENERATE,
        min_length=1,
    )
    sample_input_file: str | None = key(
        None, "The prompts of input-file generation.", by=TRAIN, status=EXT, note=GENERATE
    )
    sample_output_file: str | None = key(
        "samples.txt",
        "Where the completions are written as JSON lines (context, text, length, finished, message, "
        "duration_seconds; logits with return_logits); null: the input file's name + .output.jsonl, or (unconditional) "
        "none. Never written over: an existing file is refused.",
        by=TRAIN,
        status=EXT,
        note=GENERATE,
    )
    num_samples: int = key(1, "Continuations of unconditional generation.", by=TRAIN, status=EXT, note=GENERATE, ge=1)
    recompute: bool = key(
        False,
        "Run the whole prefix through the model for every token instead of keeping a "
        "key/value cache (same tokens, slower).",
        by=TRAIN,
        status=EXT,
        note=GENERATE,
    )
    return_logits: bool = key(
        False, "Write the logits each token was chosen from with its sample.", by=TRAIN, status=EXT, note=GENERATE
    )
    batch_size: int = key(
        1,
        "Prompts generated together (each row's tokens are the same as alone).",
        by=TRAIN,
        status=EXT,
        note=GENERATE,
        ge=1,
    )


class EvalConfig(Section):
    """Benchmarks of the run's newest checkpoint with EleutherAI's lm-evaluation-harness (nxd-train[eval])."""

    tasks: frozen_list(str) = key(
        (), "lm-eval task names (GPT-NeoX's eval_tasks); --tasks on the command line.", by=TRAIN, status=EXT, note=EVAL
    )
    results_prefix: str = key(
        "",
        "Results go to {results_prefix}_eval_results_{mm-dd-YYYY-HH-MM-SS}.json, as "
        "GPT-NeoX's eval.py names them (eval_results_{...}.json without a prefix).",
        by=TRAIN,
        status=EXT,
        note=EVAL,
    )
    num_fewshot: int | None = key(
        None, "Examples in each prompt (null: each task's own).", by=TRAIN, status=EXT, note=EVAL, ge=0
    )
    limit: float | None = key(
        None, "Documents per task (a fraction below 1), for a quick look.", by=TRAIN, status=EXT, note=EVAL, gt=0
    )
    include_path: str | None = key(
        None, "A folder of task YAML files of one's own (lm-eval's --include_path).", by=TRAIN, status=EXT, note=EVAL
    )
    batch_size: int = key(8, "Requests scored in one forward.", by=TRAIN, status=EXT, note=EVAL, ge=1)
    log_samples: bool = key(
        False,
        "Write each document's prompt, responses and scores in the results file too (lm-eval's --log_samples).",
        by=TRAIN,
        status=EXT,
        note=EVAL,
    )


TUNE = "nxd-train tune reads it (GPT-NeoX's DeepSpeed autotuning block; NxDT has no autotuner)"


class TuneConfig(Section):
    """The search `nxd-train tune` makes: micro-batch sizes x ZeRO stages, pruned by the memory plan, each timed
    over a few steps (DeepSpeed's autotuning, its fast mode)."""

    micro_batch_sizes: frozen_list(int) = key(
        (),
        "The micro-batch sizes tried; empty: every size from min_micro_batch_size to max_micro_batch_size that "
        "divides a rank's share of the global batch.",
        by=TRAIN,
        status=EXT,
        note=TUNE,
    )
    min_micro_batch_size: int = key(1, "The smallest micro-batch size tried.", by=TRAIN, status=EXT, note=TUNE, ge=1)
    max_micro_batch_size: int = key(1024, "The largest micro-batch size tried.", by=TRAIN, status=EXT, note=TUNE, ge=1)
    zero_stages: frozen_list(Literal[0, 1, 3]) = key(
        (),
        "The ZeRO stages tried (0: replicated, 1: zero1, 3: zero1 and zero3); empty: all three with more than "
        "one data-parallel rank, 0 alone otherwise.",
        by=TRAIN,
        status=EXT,
        note=TUNE,
    )
    start_step: int = key(
        3, "The first step timed (the steps before it warm up).", by=TRAIN, status=EXT, note=TUNE, ge=1
    )
    end_step: int = key(
        5, "The last step timed: each candidate trains this many steps.", by=TRAIN, status=EXT, note=TUNE, ge=1
    )

    @model_validator(mode="after")
    def _ordered(self) -> TuneConfig:
        if self.start_step > self.end_step:
            raise ValueError(f"expected start_step at most end_step ({self.end_step}), found {self.start_step}")
        if self.min_micro_batch_size > self.max_micro_batch_size:
            raise ValueError(
                f"expected min_micro_batch_size at most max_micro_batch_size "
                f"({self.max_micro_batch_size}), found {self.min_micro_batch_size}"
            )
        return self
