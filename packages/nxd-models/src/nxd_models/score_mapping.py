"""A reward model's Hugging Face counterpart: the causal LM's `*ForSequenceClassification` with one
label, its score head exported as `score.weight` (transformers' name) and never tied to the embedding."""

from __future__ import annotations

from dataclasses import replace

from .errors import ModelConfigError
from .hf_mapping import HFMapping

SCORE_KEY = "lm_head.weight"
"""Our key of the score head (the output layer keeps its name); transformers' is `score.weight`."""


def score_mapping(causal_lm: HFMapping, pad_token_id: int | None = None) -> HFMapping:
    """`causal_lm`'s mapping for the same decoder with a score head. transformers reads the score at
    each row's last token that is not `pad_token_id`, so an export must set that id (nxd-train writes
    the id its data is padded with)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    model_type = causal_lm.config.get("model_type")
    architecture = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.get(model_type)
    if architecture is None:
        raise ModelConfigError(
            f"a reward model exports as transformers' sequence classifier of its decoder, and "
            f"transformers has none for model_type {model_type!r}"
        )
    config = {**causal_lm.config, "architectures": [architecture], "num_labels": 1, "tie_word_embeddings": False}
    config.pop("id2label", None), config.pop("label2id", None)
    if pad_token_id is not None:
        config["pad_token_id"] = pad_token_id
    return replace(
        causal_lm,
        config=config,
        keys={**causal_lm.keys, SCORE_KEY: "score.weight"},
        vocab_padded_keys=tuple(key for key in causal_lm.vocab_padded_keys if key != SCORE_KEY),
        tied={key: value for key, value in causal_lm.tied.items() if key != SCORE_KEY},
    )
