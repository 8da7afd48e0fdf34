"""Credentials written into a URL (the S3 checkpoint path, the W&B host) are refused before launch in every dialect
that has the key, and the message never repeats them: config.yaml, the checkpoints' records and the logs would."""

from __future__ import annotations

from pathlib import Path

import pytest
from nxd_config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
TINY, NEOX = REPO / "configs/tiny.yaml", [REPO / "configs/neox/pythia_tiny.yml", REPO / "configs/neox/local_setup.yml"]


@pytest.mark.parametrize(
    ("source", "overrides", "key", "where"),
    [
        (
            TINY,
            ["+exp_manager.s3_checkpoints.path=s3://AKIAEXAMPLE:hunter2@bucket/runs"],
            "exp_manager.s3_checkpoints.path",
            "AWS_ACCESS_KEY_ID",
        ),
        (
            TINY,
            ["+exp_manager.wandb_logger_kwargs.host=https://me:hunter2@wandb.example.com"],
            "exp_manager.wandb_logger_kwargs.host",
            "WANDB_API_KEY",
        ),
        (
            NEOX,
            ["s3_path=s3://AKIAEXAMPLE:hunter2@bucket/runs"],
            "s3_path (nxd: exp_manager.s3_checkpoints.path)",
            "AWS_ACCESS_KEY_ID",
        ),
        (
            NEOX,
            ["use_wandb=True", "wandb_host=https://me:hunter2@wandb.example.com"],
            "wandb_host (nxd: exp_manager.wandb_logger_kwargs.host)",
            "WANDB_API_KEY",
        ),
        (
            TINY,
            ["+exp_manager.s3_checkpoints.path=s3://AKIAEXAMPLE:hun/ter2@bucket/runs"],  # a secret holding '/'
            "exp_manager.s3_checkpoints.path",
            "AWS_ACCESS_KEY_ID",
        ),
        (
            TINY,
            ["+exp_manager.s3_checkpoints.path=S3://AKIAEXAMPLE:hunter2@bucket"],
            "exp_manager.s3_checkpoints.path",
            "AWS_ACCESS_KEY_ID",
        ),
        (
            TINY,
            ["+exp_manager.s3_checkpoints.path=https://AKIAEXAMPLE:hunter2@bucket.s3.amazonaws.com/x"],
            "exp_manager.s3_checkpoints.path",
            "AWS_ACCESS_KEY_ID",
        ),
        (TINY, ["+compiler_cache_url=s3://AKIAEXAMPLE:hunter2@cache/neuron"], "compiler_cache_url", "AWS_* variables"),
    ],
)
def test_a_url_with_credentials_is_refused_without_repeating_them(source, overrides, key, where):
    with pytest.raises(ConfigError) as caught:
        load_config(source, overrides)
    message = str(caught.value)
    assert f"{key}: expected " in message and "found a URL holding '@', as credentials written into it do" in message
    assert where in message and "hunter2" not in message and "hun/ter2" not in message and "AKIAEXAMPLE" not in message


def test_an_s3_path_names_a_bucket_as_s3_names_them():
    cfg = load_config(TINY, ["+exp_manager.s3_checkpoints.path=s3://my-bucket.2024/runs/a"])
    assert cfg.exp_manager.s3_checkpoints.path == "s3://my-bucket.2024/runs/a"
    for bucket in ("-bucket", "ab", "my..bucket", "bucket!"):
        with pytest.raises(ConfigError, match=f"expected an S3 bucket name .*, found '{bucket}'"):
            load_config(TINY, [f"+exp_manager.s3_checkpoints.path=s3://{bucket}/runs"])
