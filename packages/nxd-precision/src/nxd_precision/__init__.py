"""nxd_precision: precision policies, stochastic rounding and the Neuron runtime's variables."""

from .errors import PrecisionConfigError
from .neuron_runtime import neuron_runtime_env
from .optimizer import PrecisionOptimizer, prepare_parameters
from .policy import TYPES, PrecisionPolicy, bf16_support_problem, resolve_policy
from .stochastic_rounding import copy_stochastically_rounded_, stochastic_round

__version__ = "0.1.0"

__all__ = [
    "TYPES",
    "PrecisionConfigError",
    "PrecisionOptimizer",
    "PrecisionPolicy",
    "bf16_support_problem",
    "copy_stochastically_rounded_",
    "neuron_runtime_env",
    "prepare_parameters",
    "resolve_policy",
    "stochastic_round",
]
