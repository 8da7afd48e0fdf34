"""nxd-config: NxDT-dialect YAML (or GPT-NeoX config files) -> a typed, validated, immutable `NxdConfig`.

from nxd_config import load_config, ConfigError
config = load_config("configs/tiny.yaml", ["trainer.max_steps=10"])
config = load_config(["neox/125M.yml", "neox/local_setup.yml"], ["train_iters=10"])
config.distributed_strategy.tensor_model_parallel_size
"""

from importlib.metadata import version as _distribution_version

from .dialects import DIALECTS
from .errors import ConfigDeprecation, ConfigError, ConfigIssue, ConfigNotice
from .hostfile import Host, HostfileError, read_hostfile, select_hosts
from .loading import load_config, nxdt_yaml_with
from .reference import KeyRow, key_rows
from .schema import NxdConfig, Status
from .writing import to_nxdt_yaml

__version__ = _distribution_version("nxd-config")  # one source: the pyproject's version

__all__ = [
    "DIALECTS",
    "ConfigDeprecation",
    "ConfigError",
    "ConfigIssue",
    "ConfigNotice",
    "Host",
    "HostfileError",
    "KeyRow",
    "NxdConfig",
    "Status",
    "key_rows",
    "load_config",
    "nxdt_yaml_with",
    "read_hostfile",
    "select_hosts",
    "to_nxdt_yaml",
]
