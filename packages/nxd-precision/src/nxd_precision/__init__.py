"""nxd_precision: precision policies, the update step (optimizers by NxDT name, LR schedules, fp32
master weights, fp16 loss scaling), stochastic rounding and the Neuron runtime's variables."""

from importlib.metadata import version as _distribution_version

from .adam8bit import adam8bit_support_problem
from .errors import PrecisionConfigError
from .float8 import FLOAT8_MATMUL_MULTIPLE, Float8Spec, float8_coverage, float8_support_problem
from .loss_scaling import LossScaler, LossScaling
from .neuron_runtime import neuron_runtime_env
from .nonfinite import NonFiniteGuard, NonFiniteStop
from .novograd import Novograd
from .optimizer import PrecisionOptimizer, prepare_parameters
from .optimizers import apply_options, build_optimizer, bytes_per_value
from .policy import PrecisionPolicy, bf16_support_problem, resolve_policy
from .schedules import apply_schedule, build_scheduler
from .stochastic_rounding import stochastic_round

__version__ = _distribution_version("nxd-precision")  # one source: the pyproject's version

__all__ = [
    "FLOAT8_MATMUL_MULTIPLE",
    "Float8Spec",
    "LossScaler",
    "LossScaling",
    "NonFiniteGuard",
    "NonFiniteStop",
    "Novograd",
    "PrecisionConfigError",
    "PrecisionOptimizer",
    "PrecisionPolicy",
    "adam8bit_support_problem",
    "bf16_support_problem",
    "apply_options",
    "apply_schedule",
    "build_optimizer",
    "build_scheduler",
    "float8_coverage",
    "float8_support_problem",
    "bytes_per_value",
    "neuron_runtime_env",
    "prepare_parameters",
    "resolve_policy",
    "stochastic_round",
]
