"""The config's precision and Neuron runtime keys as nxd-train reads them."""

from __future__ import annotations

import torch
from nxd_config import load_config
from nxd_train.cli import default_config_path
from nxd_train.run.settings import neuron_environment, precision_policy


def test_the_policy_reads_the_manual_knobs_and_the_optimizer() -> None:
    cfg = load_config(
        default_config_path(),
        [
            "precision.type=manual",
            "+precision.xla_use_bf16=1",
            "+precision.master_weights=True",
            "+precision.fp32_grad_acc=True",
            "model.optim.name=adamw_fp32OptState",
        ],
    )
    policy = precision_policy(cfg)
    assert (policy.param_dtype, policy.master_dtype, policy.grad_accumulation_dtype, policy.grad_reduction_dtype) == (
        torch.bfloat16,
        torch.float32,
        torch.float32,
        torch.bfloat16,
    )


def test_neuron_runtime_keys_become_the_runtime_variables() -> None:
    cfg = load_config(
        default_config_path(),
        [
            "precision.type=mixed_precisionSR",
            "+compiler_flags=-O1",
            "+bucket_size_collectives=1024",
            "+trainer.lnc=2",
            "+aync_exec_max_inflight_requests=3",
        ],
    )
    assert neuron_environment(cfg, {"BUCKET_CAP_MB": "64"}) == {
        "XLA_USE_BF16": "0",
        "XLA_DOWNCAST_BF16": "1",
        "NEURON_RT_STOCHASTIC_ROUNDING_EN": "1",
        "NEURON_CC_FLAGS": "-O1",
        "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS": "3",
        "NEURON_LOGICAL_NC_CONFIG": "2",
    }


def test_float8_trains_emulated_and_is_refused_without_fp8_matmuls(tmp_path, train_here, capsys) -> None:
    """precision.fp8 on this CPU: refused by name (no FP8 matmuls); with emulate the run trains, its decoder layers in
    torchao's float8, to losses near the run without it."""
    from nxd_train.cli import main

    assert (
        main(
            [
                str(default_config_path()),
                "+precision.fp8.recipe=tensorwise",
                f"+exp_manager.explicit_log_dir={tmp_path / 'refused'}",
            ]
        )
        == 1
    )
    assert "precision.fp8: float8 matmuls (torch._scaled_mm) need a GPU" in capsys.readouterr().err
    plain = [row["loss"] for row in train_here("trainer.max_steps=4")]
    fp8 = [row["loss"] for row in train_here("trainer.max_steps=4", "+precision.fp8.emulate=true")]
    assert fp8 != plain and all(abs(a - b) < 0.02 * b for a, b in zip(fp8, plain, strict=True))
