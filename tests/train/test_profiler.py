"""exp_manager.profiler (GPT-NeoX's profile and memory_profiling): torch.profiler over a window of steps."""

from __future__ import annotations

import json

import pytest
from nxd_config import ConfigError, load_config
from nxd_train.checks.preflight import plan_run
from nxd_train.cli import default_config_path
from nxd_train.run.corpus import default_cache_dir

from tests.training_runs import FAST, losses

WINDOW = ["+exp_manager.profiler.start_step=2", "+exp_manager.profiler.stop_step=3"]


def profiled_steps(trace: dict) -> list[int]:
    """The steps a Chrome trace holds, by their ProfilerStep#<step> ranges."""
    return sorted(
        int(event["name"].split("#")[1])
        for event in trace["traceEvents"]
        if event.get("ph") == "X" and event["name"].startswith("ProfilerStep#")
    )


def test_the_window_traces_exactly_its_steps_and_changes_no_loss(tmp_path, train_here):
    plain = losses(train_here("trainer.max_steps=4"))
    profiled = losses(
        train_here(
            "trainer.max_steps=4", "+exp_manager.profiler.enabled=True", "+exp_manager.profiler.memory=True", *WINDOW
        )
    )
    assert profiled == plain
    folder = tmp_path / "run1" / "profiler"
    traces = sorted(folder.glob("rank0.*.pt.trace.json"))  # TensorBoard's profiler plugin: <worker>.<ms>.pt.trace.json
    assert len(traces) == 1 and sorted(p.name for p in folder.iterdir()) == sorted(
        [traces[0].name, traces[0].name.replace(".pt.trace.json", ".memory_timeline.html")]
    )  # nothing partial left
    trace = json.loads(traces[0].read_text())
    assert profiled_steps(trace) == [2, 3]
    names = {event["name"] for event in trace["traceEvents"]}
    assert any(name.startswith("aten::mm") for name in names) and "[memory]" in names  # operators and allocations
    assert "<html>" in (folder / traces[0].name.replace(".pt.trace.json", ".memory_timeline.html")).read_text()


def test_a_run_ending_inside_the_window_writes_what_it_traced(tmp_path, train_here):
    train_here("trainer.max_steps=2", "+exp_manager.profiler.enabled=True", *WINDOW)
    (trace,) = (tmp_path / "run0" / "profiler").glob("rank0.*.pt.trace.json")
    assert profiled_steps(json.loads(trace.read_text())) == [2]


def test_memory_records_go_where_named_and_no_window_costs_nothing(tmp_path):
    def plan(*overrides):
        cfg = load_config(default_config_path(), [*FAST, f"+exp_manager.explicit_log_dir={tmp_path}", *overrides])
        return plan_run(cfg, default_cache_dir()).logging.profiler

    assert plan() is None  # the loop then builds no profiler and wraps no step
    window = plan("+exp_manager.profiler.memory=True", f"+exp_manager.profiler.memory_dir={tmp_path / 'mem'}")
    assert (window.trace, window.memory, window.memory_dir, window.start_step, window.stop_step) == (
        False,
        True,
        tmp_path / "mem",
        11,
        13,
    )


def test_a_memory_dir_without_memory_records_is_refused():
    with pytest.raises(ConfigError, match="exp_manager.profiler.memory_dir: names where memory records go"):
        load_config(default_config_path(), ["+exp_manager.profiler.memory_dir=mem"])


def test_a_window_that_ends_before_it_starts_is_refused():
    with pytest.raises(ConfigError) as caught:
        load_config(default_config_path(), ["+exp_manager.profiler.start_step=5", "+exp_manager.profiler.stop_step=4"])
    assert "exp_manager.profiler" in str(caught.value) and "stop_step (4) is before start_step (5)" in str(caught.value)
