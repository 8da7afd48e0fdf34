"""Comet as one more of the Monitor's metric loggers (exp_manager.create_comet_logger; GPT-NeoX's use_comet).

With an API key (COMET_API_KEY, or `comet login`'s file) the experiment is online; without one it is an offline
experiment archived under the log directory's `comet` folder when the run ends (each process of a resumed run in
a folder of its own), for `comet upload`. Its key is
kept beside it, so a run resumed in the same directory goes on in the same experiment. The comet-ml package is
the optional extra nxd-train[comet]."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from lightning_fabric.loggers import Logger

from nxd_train.logging.settings import CometSettings

KEY_FILE = "comet_experiment_key"
FOLDER = "comet"


class CometStartError(Exception):
    """Comet could not start an experiment (a rejected API key, an unreachable host ...)."""


class CometLogger(Logger):
    """Every logged value of a run, at its optimizer step, in one Comet experiment with the resolved config."""

    def __init__(self, log_dir: Path, settings: CometSettings, config: dict[str, Any]):
        import comet_ml

        key_file = log_dir / KEY_FILE
        key = key_file.read_text().strip() if key_file.is_file() else uuid.uuid4().hex
        online = comet_ml.config.get_api_key(None, comet_ml.config.get_config()) is not None
        # each process's offline archive in a folder of its own: comet-ml names the archive after the experiment
        # key, so a resumed run's would replace the archive of the steps before it
        folder = log_dir / FOLDER / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        folder.mkdir(parents=True, exist_ok=True)
        options = comet_ml.ExperimentConfig(
            name=settings.name,
            tags=list(settings.tags) or None,
            offline_directory=str(folder),
            auto_output_logging=False,
            auto_metric_logging=False,
            auto_param_logging=False,
            log_code=False,
            log_git_metadata=False,
            log_git_patch=False,
            log_graph=False,
            parse_args=False,
            display_summary_level=0,
        )
        try:
            self.experiment = comet_ml.start(
                workspace=settings.workspace,
                project_name=settings.project,
                experiment_key=key,
                mode="get_or_create",
                online=online,
                experiment_config=options,
            )
            self.experiment.log_parameters(config)
            if settings.others:
                self.experiment.log_others(dict(settings.others))
        except Exception as error:  # noqa: BLE001 - comet raises its own types and plain ones alike
            raise CometStartError(
                f"exp_manager.create_comet_logger: Comet could not start an experiment ({error}); "
                "check COMET_API_KEY (or `comet login`), or unset it to write an offline "
                "experiment"
            ) from None
        key_file.write_text(key)
        self.key = key

    @property
    def name(self) -> str:
        return "comet"

    @property
    def version(self) -> str:
        return self.key

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.experiment.log_metrics(metrics, step=step)

    def log_hyperparams(self, params: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        self.experiment.log_parameters(params)

    def finalize(self, status: str) -> None:
        self.experiment.end()
