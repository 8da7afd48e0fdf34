"""The AWS Neuron runtime's environment variables for a run, from the config: one pure function.

nxd runs on torch devices; on a Neuron device the runtime and compiler read these variables, as
NxDT's training script sets them. Variables the user already exported win (the compiler flags are
appended to theirs); nothing is set on any other device.
"""

from __future__ import annotations

from collections.abc import Mapping

PRECISION_VARIABLES = {
    # type: (XLA_USE_BF16, XLA_DOWNCAST_BF16, NEURON_RT_STOCHASTIC_ROUNDING_EN)
    "fp32": ("0", "0", "0"),
    "autocast": ("0", "0", "0"),
    "mixed_precision": ("0", "1", "0"),
    "mixed_precisionSR": ("0", "1", "1"),
    "bf16SR": ("1", "0", "1"),
    "fp16": ("0", "0", "0"),  # fp16 tensors are torch's own dtype: no bf16 switch
    "fp16_autocast": ("0", "0", "0"),
}


def neuron_runtime_env(
    current: Mapping[str, str],
    *,
    precision_type: str,
    manual_knobs: tuple[str, str, str] = ("0", "0", "0"),
    compiler_flags: str | None = None,
    compiler_cache_url: str | None = None,
    async_exec_max_inflight_requests: int | None = None,
    bucket_size_collectives: int | None = None,
    neuron_rt_exec_timeout: int | None = None,
    neuron_experimental_compress_rg: bool | None = None,
    lnc: int | None = None,
    fuse_softmax: bool = False,
) -> dict[str, str]:
    """The variables to set, given the environment `current`. `manual_knobs` are the precision knobs
    (xla_use_bf16, xla_downcast_bf16, neuron_rt_stochastic_rounding_en) read for type manual."""
    use_bf16, downcast, rounding = manual_knobs if precision_type == "manual" else PRECISION_VARIABLES[precision_type]
    wanted: dict[str, str | None] = {
        "XLA_USE_BF16": use_bf16,
        "XLA_DOWNCAST_BF16": downcast,
        "NEURON_RT_STOCHASTIC_ROUNDING_EN": rounding,
        "NEURON_COMPILE_CACHE_URL": compiler_cache_url,
        "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS": _text(async_exec_max_inflight_requests),
        "BUCKET_CAP_MB": _text(bucket_size_collectives),
        "NEURON_RT_EXEC_TIMEOUT": _text(neuron_rt_exec_timeout),
        "NEURON_EXPERIMENTAL_COMPRESS_RG": None
        if neuron_experimental_compress_rg is None
        else str(int(neuron_experimental_compress_rg)),
        "NEURON_LOGICAL_NC_CONFIG": _text(lnc),
        "NEURON_FUSE_SOFTMAX": "1" if fuse_softmax else None,
    }
    result = {name: value for name, value in wanted.items() if value is not None and name not in current}
    if compiler_flags:
        existing = current.get("NEURON_CC_FLAGS")
        result["NEURON_CC_FLAGS"] = f"{existing} {compiler_flags}" if existing else compiler_flags
    return result


def _text(value: int | None) -> str | None:
    return None if value is None else str(value)
