"""Shared test options (slower tests run only with --runslow) and the in-process training fixture."""

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def train_here(tmp_path):
    """Train the tiny config in this process with overrides; each call logs to a fresh directory."""
    from tests.training_runs import train_in_process  # the training stack loads only for tests that train

    runs = iter(range(1000))
    return lambda *overrides: train_in_process(tmp_path / f"run{next(runs)}", *overrides)
