"""The Neuron runtime variables as a table: config in, environment out (NxDT's mapping)."""

from __future__ import annotations

import pytest
from nxd_precision import neuron_runtime_env


@pytest.mark.parametrize(
    ("precision_type", "knobs", "expected"),
    [
        ("fp32", ("0", "0", "0"), ("0", "0", "0")),
        ("autocast", ("0", "0", "0"), ("0", "0", "0")),
        ("mixed_precision", ("0", "0", "0"), ("0", "1", "0")),
        ("mixed_precisionSR", ("0", "0", "0"), ("0", "1", "1")),
        ("bf16SR", ("0", "0", "0"), ("1", "0", "1")),
        ("manual", ("1", "0", "1"), ("1", "0", "1")),
        ("mixed_precision", ("1", "1", "1"), ("0", "1", "0")),  # knobs are read for manual only
    ],
)
def test_precision_types(precision_type: str, knobs: tuple, expected: tuple) -> None:
    env = neuron_runtime_env({}, precision_type=precision_type, manual_knobs=knobs)
    assert (env["XLA_USE_BF16"], env["XLA_DOWNCAST_BF16"], env["NEURON_RT_STOCHASTIC_ROUNDING_EN"]) == expected


def test_runtime_keys_map_to_their_variables() -> None:
    env = neuron_runtime_env(
        {},
        precision_type="fp32",
        compiler_flags="--model-type=transformer",
        compiler_cache_url="s3://cache",
        async_exec_max_inflight_requests=3,
        bucket_size_collectives=1024,
        neuron_rt_exec_timeout=600,
        neuron_experimental_compress_rg=False,
        lnc=2,
        fuse_softmax=True,
    )
    assert env == {
        "XLA_USE_BF16": "0",
        "XLA_DOWNCAST_BF16": "0",
        "NEURON_RT_STOCHASTIC_ROUNDING_EN": "0",
        "NEURON_CC_FLAGS": "--model-type=transformer",
        "NEURON_COMPILE_CACHE_URL": "s3://cache",
        "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS": "3",
        "BUCKET_CAP_MB": "1024",
        "NEURON_RT_EXEC_TIMEOUT": "600",
        "NEURON_EXPERIMENTAL_COMPRESS_RG": "0",
        "NEURON_LOGICAL_NC_CONFIG": "2",
        "NEURON_FUSE_SOFTMAX": "1",
    }


def test_what_the_user_exported_wins_and_compiler_flags_append() -> None:
    current = {"BUCKET_CAP_MB": "64", "NEURON_CC_FLAGS": "--retry_failed_compilation"}
    env = neuron_runtime_env(current, precision_type="bf16SR", bucket_size_collectives=1024, compiler_flags="-O1")
    assert "BUCKET_CAP_MB" not in env
    assert env["NEURON_CC_FLAGS"] == "--retry_failed_compilation -O1"
    assert "NEURON_RT_EXEC_TIMEOUT" not in env  # unset keys set nothing
