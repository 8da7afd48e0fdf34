"""nxd-config: NxDT-dialect YAML -> a typed, validated, immutable `NxdConfig`.

    from nxd_config import load_config, ConfigError
    config = load_config("configs/tiny.yaml", ["trainer.max_steps=10"])
    config.distributed_strategy.tensor_model_parallel_size
"""

from .errors import ConfigDeprecation, ConfigError, ConfigIssue, ConfigNotice
from .loading import load_config
from .schema import NxdConfig, Status

__version__ = "0.1.0"

__all__ = [
    "ConfigDeprecation",
    "ConfigError",
    "ConfigIssue",
    "ConfigNotice",
    "NxdConfig",
    "Status",
    "load_config",
]
