"""trainer.char_level_ppl (GPT-NeoX's char_level_ppl): validation also logs exp(loss x tokens per character)."""

from __future__ import annotations

import math

import datasets
import pytest
from nxd_config import load_config
from nxd_train.checks.preflight import PreflightError, plan_run
from nxd_train.cli import default_config_path
from nxd_train.run.corpus import default_cache_dir

from tests.training_runs import FAST, hf_run_config

JOB = [
    "trainer.max_steps=1",
    "trainer.val_check_interval=1",
    "trainer.limit_val_batches=1.0",
    "+data.validation_drop_last=False",
    "+trainer.char_level_ppl=True",
]


def test_the_character_level_perplexity_counts_every_validation_sample(tmp_path, train_here):
    """Every validation sample is evaluated (the last global batch padded), so the tokens per character are those of
    the whole validation split, counted here by decoding each sample with the tokenizer."""
    rows = train_here(*JOB)
    (row,) = [row for row in rows if "validation/lm_loss_char_lvl_ppl" in row]
    cfg = load_config(default_config_path(), [*FAST, f"+exp_manager.explicit_log_dir={tmp_path / 'plan'}", *JOB])
    plan = plan_run(cfg, default_cache_dir())
    tokens = characters = 0
    for index in range(len(plan.data.validation)):
        ids = plan.data.validation[index]["input_ids"].tolist()
        tokens, characters = tokens + len(ids), characters + len(plan.cadence.decode(ids))
    assert characters > tokens  # a BPE token holds several characters
    assert math.isclose(
        row["validation/lm_loss_char_lvl_ppl"], math.exp(row["val_loss"] * tokens / characters), rel_tol=1e-9
    )


def test_pre_tokenised_data_without_a_tokenizer_is_refused(tmp_path):
    """Ids with no tokenizer (an HF model's vocabulary) cannot be decoded into characters: one preflight problem."""
    source = hf_run_config(tmp_path, vocab_size=256)
    rows = [[(7 * row + column) % 256 for column in range(64)] for row in range(48)]
    datasets.Dataset.from_dict({"input_ids": rows, "labels": rows}).save_to_disk(str(tmp_path / "train"))
    cfg = load_config(
        source,
        [
            f"+data.train_dir={tmp_path / 'train'}",
            "+trainer.char_level_ppl=True",
            f"+exp_manager.explicit_log_dir={tmp_path / 'run'}",
        ],
    )
    with pytest.raises(PreflightError, match="trainer.char_level_ppl: counts characters with the run's tokenizer"):
        plan_run(cfg, default_cache_dir())
