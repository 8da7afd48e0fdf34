"""MFU's denominator: datasheet peaks matched by device name (dense rates from the vendors' datasheets,
written here by hand), a measured ceiling elsewhere, and utilisation that never exceeds 1."""

from __future__ import annotations

import time

import pytest
import torch
from nxd_models import Ceiling, device_ceiling, peak_memory
from nxd_models.device_peaks import PEAKS, datasheet_peak, measured_peak

TERA = 1e12
DATASHEETS = {  # device name as torch.cuda.get_device_name gives it: (bf16, tf32, fp32) dense TFLOP/s
    "NVIDIA H100 80GB HBM3": (989.4, 494.7, 66.9),
    "NVIDIA H100 PCIe": (756.4, 378.0, 51.2),
    "NVIDIA H100 NVL": (835.5, 417.5, 60.0),
    "NVIDIA H200": (989.4, 494.7, 66.9),
    "NVIDIA H200 NVL": (835.5, 417.5, 60.0),
    "NVIDIA GH200 480GB": (989.4, 494.7, 66.9),
    "NVIDIA B200": (2250.0, 1100.0, 75.0),
    "NVIDIA A100-SXM4-80GB": (312.0, 156.0, 19.5),
    "NVIDIA A100 80GB PCIe": (312.0, 156.0, 19.5),
    "NVIDIA L40S": (362.05, 183.0, 91.6),
    "NVIDIA L4": (121.0, 60.0, 30.3),
    "NVIDIA A10": (125.0, 62.5, 31.2),
    "AMD Instinct MI300X": (1307.4, 653.7, 163.4),
}


@pytest.mark.parametrize("name", DATASHEETS)
def test_a_known_device_is_matched_to_its_own_datasheet(name):
    bf16, tf32, fp32 = DATASHEETS[name]
    assert datasheet_peak(name, torch.bfloat16) == pytest.approx(bf16 * TERA)
    assert datasheet_peak(name, torch.float16) == pytest.approx(bf16 * TERA)
    assert datasheet_peak(name, torch.float32, "highest") == pytest.approx(fp32 * TERA)
    assert datasheet_peak(name, torch.float32, "high") == pytest.approx(tf32 * TERA)
    assert datasheet_peak(name, torch.float32, "medium") == pytest.approx(bf16 * TERA)


def test_an_unknown_device_has_no_datasheet_peak():
    assert datasheet_peak("Tesla K80", torch.bfloat16) is None
    assert len(PEAKS) == len(DATASHEETS) - 1  # every entry tested (H100 SXM by its own name)


@pytest.mark.parametrize("name", DATASHEETS)
def test_a_rate_above_a_datasheet_peak_is_unknown_not_100_percent(name):
    peak = datasheet_peak(name, torch.bfloat16)
    ceiling = Ceiling(peak, name, measured=False)
    assert ceiling.utilisation(peak / 4) == pytest.approx(0.25)
    assert ceiling.utilisation(peak * 3) is None and ceiling.flops == peak
    assert "FLOP count is off" in ceiling.beaten()


def test_a_rate_above_a_measured_ceiling_is_unknown_not_100_percent():
    """A ceiling measured while other work held the cores (0.002 TFLOP/s against 0.051 unloaded) must not
    make every step 100%."""
    ceiling = Ceiling(100.0, "cpu", measured=True)
    assert ceiling.utilisation(50.0) == 0.5
    assert ceiling.utilisation(250.0) is None and ceiling.flops == 100.0
    assert ceiling.utilisation(100.0) == 1.0
    assert "measured while other work held the device" in ceiling.beaten()


def test_the_cpu_ceiling_is_measured_within_its_time_budget():
    started = time.perf_counter()
    flops = measured_peak(torch.device("cpu"), torch.float32, budget_s=0.6)
    # the 0.6 s budget ends the doubling (unbounded, it would reach 16384 x 16384: minutes); a loaded host stretches
    # the last size's matmuls, so the bound leaves room for that rather than timing the budget itself
    assert time.perf_counter() - started < 10.0 and flops > 1e8
    ceiling = device_ceiling(torch.device("cpu"), torch.float32)
    assert ceiling.measured and "no datasheet peak known" in ceiling.source


def test_a_process_measures_its_ceiling_once_per_device_dtype_precision_and_threads(monkeypatch):
    """A second run in the same process reads the first one's ceiling; another dtype, matmul precision or thread
    count is measured afresh."""
    from nxd_models import device_peaks

    device_peaks._measured_once.cache_clear()
    calls = []
    monkeypatch.setattr(device_peaks, "measured_peak", lambda device, dtype: calls.append(dtype) or 1e9 * len(calls))
    cpu = torch.device("cpu")
    try:
        first, again = device_ceiling(cpu, torch.float32), device_ceiling(cpu, torch.float32)
        assert first.flops == again.flops == 1e9 and calls == [torch.float32]
        assert device_ceiling(cpu, torch.bfloat16).flops == 2e9
        threads = torch.get_num_threads()
        monkeypatch.setattr(torch, "get_num_threads", lambda: threads + 1)
        assert device_ceiling(cpu, torch.float32).flops == 3e9
    finally:  # no made-up ceiling for the process's later runs
        device_peaks._measured_once.cache_clear()


def test_measuring_the_ceiling_draws_nothing_from_the_global_generator():
    """The measurement runs for as long as the clock allows; the run's later random draws (LoRA's initial
    adapters, dropout) must not depend on how long that was."""
    torch.manual_seed(1234)
    measured_peak(torch.device("cpu"), torch.float32, budget_s=0.05)
    after = torch.rand(4)
    torch.manual_seed(1234)
    assert torch.equal(after, torch.rand(4))


def test_peak_memory_of_this_process_covers_a_buffer_it_touched():
    buffer = torch.ones(64 * 2**20 // 4)  # 64 MiB, written
    assert peak_memory(torch.device("cpu")) >= buffer.numel() * 4
