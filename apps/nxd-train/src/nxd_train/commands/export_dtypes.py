"""The dtypes `nxd-train ckpt export-hf --dtype` offers: option value -> torch dtype name."""

EXPORT_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
