"""Weights & Biases as one more of the Monitor's metric loggers (exp_manager.create_wandb_logger).

The run lives under the log directory's `wandb` folder; its id is kept beside it, so a run resumed in the
same directory goes on in the same W&B run. WANDB_MODE=offline (no network) writes it to disk for a later
`wandb sync`. The wandb package is the optional extra nxd-train[wandb]."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_fabric.loggers import Logger

from nxd_train.logging.settings import WandbSettings

RUN_ID_FILE = "wandb_run_id"


class WandbStartError(Exception):
    """W&B could not start a run (no API key online, an unreachable host ...)."""


class WandbLogger(Logger):
    """Every logged value of a run, at its optimizer step, in one W&B run with the resolved config."""

    def __init__(self, log_dir: Path, settings: WandbSettings, config: dict[str, Any]):
        import wandb

        id_file = log_dir / RUN_ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else None
        options = {} if settings.host is None else {"settings": wandb.Settings(base_url=settings.host)}
        try:
            self.run = wandb.init(
                dir=str(log_dir),
                project=settings.project,
                name=settings.name,
                group=settings.group,
                entity=settings.entity,
                config=config,
                id=run_id,
                resume="allow" if run_id else None,
                **options,
            )
        except Exception as error:  # noqa: BLE001 - wandb raises its own types and plain ones alike
            raise WandbStartError(
                f"exp_manager.create_wandb_logger: W&B could not start a run ({error}); run "
                "`wandb login`, set WANDB_API_KEY, or set WANDB_MODE=offline to write the run to "
                "disk"
            ) from None
        id_file.write_text(self.run.id)

    @property
    def name(self) -> str:
        return "wandb"

    @property
    def version(self) -> str:
        return self.run.id

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.run.log(metrics, step=step)

    def log_hyperparams(self, params: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        self.run.config.update(params, allow_val_change=True)

    def finalize(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "success" else 1)
