"""Is this a transformers model or config? Answered without importing transformers.

transformers' model classes cost seconds to import (they pull torch._dynamo, and torchao or bitsandbytes where
those are installed), and a Megatron-style run never needs them. Nothing can be an instance of a class whose
module was never imported, so the checks read the classes from `sys.modules` only when they are there.
"""

from __future__ import annotations

import logging
import sys


def import_model_classes() -> None:
    """Import transformers' model classes without the deprecation notices torch's pytree logs for the enums of
    torchao, which transformers imports where it is installed (nothing a user acts on)."""
    quiet = logging.getLogger("torch.utils._pytree")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        import transformers.modeling_utils  # noqa: F401
    finally:
        quiet.setLevel(level)


def is_hf_model(module: object) -> bool:
    """Whether `module` is a transformers `PreTrainedModel`."""
    modeling = sys.modules.get("transformers.modeling_utils")
    return modeling is not None and isinstance(module, modeling.PreTrainedModel)


def is_hf_config(spec: object) -> bool:
    """Whether `spec` is a transformers `PretrainedConfig`."""
    configuration = sys.modules.get("transformers.configuration_utils")
    return configuration is not None and isinstance(spec, configuration.PretrainedConfig)
