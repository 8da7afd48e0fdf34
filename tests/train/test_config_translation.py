"""The config's names and the packages' agree: every optimizer and schedule the config accepts is one
nxd-precision builds, and the app hands it every documented parameter."""

from __future__ import annotations

from nxd_config import load_config
from nxd_config.schema.optim import OPTIMIZER_NAMES, SCHEDULER_NAMES
from nxd_precision.optimizers import OPTIMIZER_NAMES as BUILT_OPTIMIZERS
from nxd_precision.schedules import SCHEDULE_NAMES
from nxd_train.checks.preflight import plan_run
from nxd_train.cli import default_config_path
from nxd_train.run.corpus import default_cache_dir


def test_every_configurable_optimizer_and_schedule_is_built():
    assert set(OPTIMIZER_NAMES) == set(BUILT_OPTIMIZERS)
    assert set(SCHEDULER_NAMES) == set(SCHEDULE_NAMES)


def test_the_plan_carries_every_optimizer_and_schedule_key():
    cfg = load_config(
        default_config_path(),
        [
            "model.optim.name=sgd",
            "~model.optim.betas",
            "+model.optim.momentum=0.5",
            "+model.optim.nesterov=True",
            "trainer.gradient_clip_val=0.25",
        ],
    )
    update = plan_run(cfg, default_cache_dir()).update
    assert update.optimizer == "sgd"
    assert update.options == {
        "lr": cfg.model.optim.lr,
        "weight_decay": cfg.model.optim.weight_decay,
        "momentum": 0.5,
        "dampening": 0.0,
        "nesterov": True,
    }
    assert update.schedule == cfg.model.optim.sched.name
    assert update.schedule_options == cfg.model.optim.sched.model_dump(exclude={"name"})
    assert update.clip == 0.25


def test_the_plan_carries_the_host_memory_policy():
    assert plan_run(load_config(default_config_path()), default_cache_dir()).launch.keep_freed_host_memory
    cfg = load_config(default_config_path(), ["+trainer.keep_freed_host_memory=false"])
    assert not plan_run(cfg, default_cache_dir()).launch.keep_freed_host_memory
