"""nxd_precision: precision policies, the update step (optimizers by NxDT name, LR schedules, fp32
master weights, fp16 loss scaling), stochastic rounding and the Neuron runtime's variables."""

from importlib.metadata import version as _distribution_version

from .errors import PrecisionConfigError
from .loss_scaling import LossScaler, LossScaling
from .neox_optimizers import Lion, MadgradWD
from .neuron_runtime import neuron_runtime_env
from .nonfinite import NonFiniteGuard, NonFiniteStop
from .novograd import Novograd
from .optimizer import PrecisionOptimizer, prepare_parameters
from .optimizers import OPTIMIZER_NAMES, apply_options, build_optimizer, bytes_per_value, parameter_groups
from .policy import TYPES, PrecisionPolicy, bf16_support_problem, resolve_policy
from .schedules import SCHEDULE_NAMES, apply_schedule, build_scheduler, schedule_function
from .stochastic_rounding import copy_stochastically_rounded_, stochastic_round

__version__ = _distribution_version("nxd-precision")  # one source: the pyproject's version

__all__ = [
    "OPTIMIZER_NAMES",
    "SCHEDULE_NAMES",
    "TYPES",
    "Lion",
    "LossScaler",
    "LossScaling",
    "MadgradWD",
    "NonFiniteGuard",
    "NonFiniteStop",
    "Novograd",
    "PrecisionConfigError",
    "PrecisionOptimizer",
    "PrecisionPolicy",
    "bf16_support_problem",
    "apply_options",
    "apply_schedule",
    "build_optimizer",
    "build_scheduler",
    "bytes_per_value",
    "copy_stochastically_rounded_",
    "neuron_runtime_env",
    "parameter_groups",
    "prepare_parameters",
    "resolve_policy",
    "schedule_function",
    "stochastic_round",
]
