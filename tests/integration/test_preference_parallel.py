"""DPO, ORPO, KTO and reward models in 2 real gloo processes, launched by the nxd-train command, against one process: tensor
+ sequence parallel, pipeline (1F1B, pairs kept in one micro-batch), context parallel (ring attention,
each sequence's log-probs added over its ranks) and data parallel with ZeRO-1 and full recomputation
log the same losses, gradient norms, validation losses and preference metrics (KTO's KL baseline, measured
over the global batch or, GPT-NeoX's, on each micro-batch's halves, included) within 1e-6 (relative above 1: DPO's gradient norms are about 5). DPO's reference table, computed sharded over the layout,
equals one process's within 1e-6 relative (a sum of some 60 fp32 per-token log-probs, each of which
may differ in its last bit between layouts)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest
from safetensors.torch import load_file

from tests.integration.test_sft_parallel import LAYOUTS
from tests.neox_post_training import kto_documents_job
from tests.training_runs import dpo_job, kto_job, orpo_job, read_metrics, reward_job, run_command

OVERRIDES = [
    "trainer.max_steps=4",
    "trainer.log_every_n_steps=1",
    "exp_manager.create_tensorboard_logger=False",
    "data.micro_batch_size=2",
    "data.global_batch_size=8",
    "trainer.val_check_interval=4",
    "trainer.limit_val_batches=2",
    "trainer.gradient_clip_val=0.5",
    "model.optim.lr=3e-3",
]
COMPARED = {
    "orpo": ("loss", "grad_norm", "val_loss", "nll_loss", "log_odds_ratio", "rewards/margins", "logps/rejected"),
    "dpo": (
        "loss",
        "grad_norm",
        "val_loss",
        "rewards/chosen",
        "rewards/margins",
        "rewards/accuracies",
        "logps/rejected",
    ),
    "kto": (
        "loss",
        "grad_norm",
        "val_loss",
        "kl",
        "rewards/chosen",
        "rewards/rejected",
        "logps/chosen",
        "share/chosen",
    ),
    "reward_model": ("loss", "grad_norm", "val_loss", "margin", "rewards/chosen", "rewards/rejected"),
    "kto_halves": ("loss", "grad_norm", "val_loss", "kl", "rewards/chosen", "logps/rejected"),
}
JOBS = {
    "orpo": orpo_job,
    "dpo": dpo_job,
    "kto": kto_job,
    "reward_model": partial(reward_job, z_loss=0.01),
    "kto_halves": kto_documents_job,
}
TABLE = "reference_log_probs.safetensors"


def assert_close(expected_rows: list[dict], rows: list[dict], keys: tuple[str, ...]) -> None:
    """Every key's logged values agree. DPO's accuracies are compared from step 2 on: at step 1 the
    policy is the reference, so both rewards are 0 up to rounding, and which of the two is larger is
    decided by the last bit of each layout's sums."""
    for key in keys:
        first = 2 if key == "rewards/accuracies" else 1
        expected = [row[key] for row in expected_rows if key in row and row["step"] >= first]
        found = [row[key] for row in rows if key in row and row["step"] >= first]
        assert len(expected) == len(found) > 0, key
        assert all(abs(a - b) <= 1e-6 * max(1.0, abs(a)) for a, b in zip(expected, found, strict=True)), (
            key,
            expected,
            found,
        )


@pytest.fixture(scope="module")
def data(tmp_path_factory, chat_tokenizer_dir) -> dict[str, list[str]]:
    folder = tmp_path_factory.mktemp("preference_data")
    return {method: job(folder / method, chat_tokenizer_dir) for method, job in JOBS.items()}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, data) -> Callable[[str], tuple]:
    """Each method's one-process run (metrics and log directory), made when a test first asks for it."""
    from tests.training_runs import train_in_process

    runs = {}

    def run(method: str) -> tuple:
        if method not in runs:
            folder = tmp_path_factory.mktemp(f"one_{method}")
            runs[method] = (train_in_process(folder, *OVERRIDES, *data[method]), folder)
        return runs[method]

    return run


DEFAULT_SUITE = {"dpo": "tp2_sp", "kto": "dp2_zero1_recompute"}
"""The pair objectives share DPO's two-process path and KTO has its own; ORPO and reward models with --runslow."""
PAIRS = [
    pytest.param(method, layout, marks=[] if DEFAULT_SUITE.get(method) == layout else [pytest.mark.slow])
    for layout in ("tp2_sp", "pp2", "cp2", "dp2_zero1_recompute")
    for method in JOBS
]
"""DPO, ORPO and reward models (the row-parallel score head) in tensor + sequence parallel, KTO data parallel
(its baseline summed over the ranks); every other layout of each (pipeline and context parallel too), and KTO
on NeoX's documents with NeoX's estimate (each micro-batch's halves), run with --runslow."""


@pytest.mark.parametrize(("method", "layout"), PAIRS)
def test_preference_in_two_processes_logs_what_one_process_logs(method, layout, data, one_process, tmp_path):
    result = run_command(
        *OVERRIDES,
        *data[method],
        *LAYOUTS[layout],
        "trainer.devices=2",
        f"+exp_manager.explicit_log_dir={tmp_path / layout}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Warning" not in result.stderr, result.stderr[-3000:]
    expected_rows, one_dir = one_process(method)
    assert_close(expected_rows, read_metrics(tmp_path / layout), COMPARED[method])
    if method in ("dpo", "kto", "kto_halves"):
        expected, found = load_file(one_dir / TABLE), load_file(tmp_path / layout / TABLE)
        assert expected.keys() == found.keys() == {"train", "validation"}
        for split in expected:
            error = (expected[split] - found[split]).abs() / expected[split].abs().clamp(min=1)
            assert error.max() < 1e-6, (split, error.max())


LIVE = {
    "pp2_frozen_copy": [*LAYOUTS["pp2"]],
    "tp2_sp_lora": [*LAYOUTS["tp2_sp"], "+model_alignment_strategy.peft.lora_rank=4"],
}


@pytest.mark.slow  # the default suite's live reference: one process (tests/train/test_dpo.py, adapters off and a
# frozen copy); DPO's table in two processes above
@pytest.mark.parametrize("case", LIVE)
def test_a_live_reference_in_two_processes_trains_as_one_process_with_a_table(case, chat_tokenizer_dir, tmp_path):
    """precompute_ref_log_probs False: the frozen copy runs as pipeline stages of its own, or LoRA's
    adapters are switched off on tensor-parallel shards; one process with the precomputed table agrees."""
    from tests.training_runs import train_in_process

    adapters = [item for item in LIVE[case] if "peft" in item]
    expected = train_in_process(
        tmp_path / "one", *OVERRIDES, *dpo_job(tmp_path / "data", chat_tokenizer_dir), *adapters
    )
    live = dpo_job(tmp_path / "data", chat_tokenizer_dir, precompute=False)
    result = run_command(
        *OVERRIDES,
        *live,
        *LIVE[case],
        "trainer.devices=2",
        f"+exp_manager.explicit_log_dir={tmp_path / case}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert_close(expected, read_metrics(tmp_path / case), COMPARED["dpo"])
    assert not (tmp_path / case / TABLE).exists()
