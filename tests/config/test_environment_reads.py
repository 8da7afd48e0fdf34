"""${oc.env:NAME} in a config reads only the variables the user names in NXD_ALLOW_ENV: a config someone hands you
cannot copy a secret from the environment into config.yaml, the logs, the W&B run or a URL the run contacts."""

from __future__ import annotations

from pathlib import Path

import pytest
from nxd_config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
TINY, NEOX = REPO / "configs/tiny.yaml", [REPO / "configs/neox/pythia_tiny.yml", REPO / "configs/neox/local_setup.yml"]


@pytest.mark.parametrize(
    ("source", "overrides", "key"),
    [
        (
            TINY,
            ["+exp_manager.s3_checkpoints.path=s3://b/${oc.env:NXD_TEST_SECRET}"],
            "exp_manager.s3_checkpoints.path",
        ),
        (NEOX, ["use_wandb=True", "wandb_group=${oc.env:NXD_TEST_SECRET}"], "wandb_group"),
    ],
)
def test_an_environment_variable_the_user_did_not_name_is_refused(source, overrides, key, monkeypatch):
    monkeypatch.setenv("NXD_TEST_SECRET", "hunter2")
    monkeypatch.setenv("NXD_ALLOW_ENV", "HOME,NXD_TEST_OTHER")
    with pytest.raises(ConfigError) as caught:
        load_config(source, overrides)
    message = str(caught.value)
    assert f"{key}" in message and "hunter2" not in message
    assert (
        "a config reads the environment variable NXD_TEST_SECRET only where you allow it: add NXD_TEST_SECRET to "
        "NXD_ALLOW_ENV"
    ) in message


def test_the_variables_the_user_names_read_as_omegaconf_reads_them(monkeypatch):
    monkeypatch.setenv("NXD_TEST_RUN", "nightly")
    monkeypatch.delenv("NXD_TEST_UNSET", raising=False)
    monkeypatch.setenv("NXD_ALLOW_ENV", "NXD_TEST_RUN, NXD_TEST_UNSET")
    assert load_config(TINY, ["name=${oc.env:NXD_TEST_RUN}"]).name == "nightly"
    assert load_config(TINY, ["name=${oc.env:NXD_TEST_UNSET,fallback}"]).name == "fallback"
    with pytest.raises(ConfigError, match="Environment variable 'NXD_TEST_UNSET' not found"):
        load_config(TINY, ["name=${oc.env:NXD_TEST_UNSET}"])
