"""Reward models as online RL's rewards: a run nxd trained with model_alignment_strategy.reward_model (its newest
checkpoint, or a checkpoint folder) or a Hugging Face *ForSequenceClassification folder or hub id.

Before launch (`reward_model_source`): the model must score with the policy's own tokenizer (the completions' token
ids are scored as they were sampled, so another vocabulary would read other words), and an nxd run must be a
reward model's (its output layer a score head). At set-up each process loads its own copy (an nxd checkpoint through
its Hugging Face export, written under a temporary name and removed once loaded); a completion's score is the
head's output at the last token of prompt + completion + end-of-document that is not the model's pad_token_id,
where transformers' own forward reads it (an nxd reward model's export names no pad id, so it scores at the
end-of-document token, as it trained).
A folder's own code runs only with trust_remote_code.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from nxd_ckpt import CheckpointError, is_checkpoint_dir, newest_usable, read_info
from nxd_data import DataError, TokenizerSource, load_tokenizer

from nxd_train.logging.log_dir import CHECKPOINT_DIR
from nxd_train.run.checkpointing import HEAD_RECORD
from nxd_train.run.identity import IDENTITY


class RewardModelError(Exception):
    """A reward model that cannot score this run's completions (the message names its key)."""


@dataclass(frozen=True)
class RewardModelSource:
    location: str
    """A Hugging Face folder or hub id, or an nxd checkpoint folder."""
    nxd_checkpoint: bool
    trust_remote_code: bool = False


def reward_model_source(location: str, key: str, tokenizer_fingerprint: str | None, trust: bool) -> RewardModelSource:
    """Where the reward model at `location` is read from; a RewardModelError naming `key` when it is not a reward
    model, or its tokenizer is not the policy's (`tokenizer_fingerprint`)."""
    path = Path(location)
    checkpoint = _newest_checkpoint(path, key)
    if checkpoint is not None:
        extra = read_info(checkpoint).extra
        if extra.get(HEAD_RECORD) != "score":
            raise RewardModelError(
                f"{key}: {checkpoint} holds a causal LM; expected a run trained with "
                "model_alignment_strategy.reward_model (a score head)"
            )
        saved = extra.get(IDENTITY, {}).get("tokenizer")
        if tokenizer_fingerprint is not None and saved is not None and saved != tokenizer_fingerprint:
            raise RewardModelError(
                f"{key}: {checkpoint} was trained with another tokenizer than the policy's ({_why()})"
            )
        return RewardModelSource(str(checkpoint), True, trust)
    _check_classifier(location, key, trust)
    try:
        tokenizer = load_tokenizer(TokenizerSource(location, trust_remote_code=trust), key)
    except DataError as error:
        raise RewardModelError(f"{key}: {error}") from None
    if tokenizer_fingerprint is not None and tokenizer.fingerprint != tokenizer_fingerprint:
        raise RewardModelError(f"{key}: {location}'s tokenizer is not the policy's ({_why()})")
    return RewardModelSource(location, False, trust)


def _check_classifier(location: str, key: str, trust: bool) -> None:
    """A RewardModelError naming `key` unless `location`'s config.json describes a sequence classifier with one
    label (transformers' AutoConfig reads it: a folder, or a hub id)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(location, trust_remote_code=trust)
    except (OSError, ValueError) as error:
        raise RewardModelError(
            f"{key}: {location}: expected a Hugging Face sequence classifier's folder or hub id, or an nxd reward "
            f"model run; found none readable ({str(error).splitlines()[0]})"
        ) from None
    architectures = getattr(config, "architectures", None) or []
    if not any(name.endswith("ForSequenceClassification") for name in architectures) or config.num_labels != 1:
        raise RewardModelError(
            f"{key}: {location}: expected a *ForSequenceClassification with one label (a score head), found "
            f"{', '.join(architectures) or 'no architecture'} with {config.num_labels} labels"
        )


def _why() -> str:
    return (
        "its vocabulary, merges or special ids differ); expected a reward model of the policy's tokenizer: the "
        "completions' token ids are scored as they were sampled"
    )


def _newest_checkpoint(path: Path, key: str) -> Path | None:
    """`path` as an nxd checkpoint (itself, or its log directory's newest usable one); None for anything else."""
    if path.is_dir() and is_checkpoint_dir(path):
        return path
    if not (path / CHECKPOINT_DIR).is_dir():
        return None
    newest, passed_over = newest_usable(path / CHECKPOINT_DIR, contents=False)  # the export verifies its files
    if newest is None:
        found = "; ".join(passed_over) if passed_over else "none"
        raise RewardModelError(f"{key}: {path}: expected a complete checkpoint of a reward model, found {found}")
    return newest.path


class RewardModel:
    """A loaded reward model: `scores` of token sequences (each its prompt + completion + end-of-document)."""

    def __init__(self, source: RewardModelSource, device: torch.device, work_dir: Path):
        from nxd_ckpt import export_hf  # torch.distributed.checkpoint: at set-up, not for a config check
        from transformers import AutoModelForSequenceClassification

        if source.nxd_checkpoint:
            with tempfile.TemporaryDirectory(dir=work_dir, prefix=".reward-model-") as folder:
                try:
                    exported = export_hf(Path(source.location), Path(folder) / "model", dtype=torch.float32)
                except CheckpointError as error:
                    raise RewardModelError(f"reward model {source.location}: {error}") from None
                self.model = AutoModelForSequenceClassification.from_pretrained(exported, dtype=torch.float32)
        else:
            self.model = AutoModelForSequenceClassification.from_pretrained(
                source.location, dtype=torch.float32, trust_remote_code=source.trust_remote_code
            )
        if not hasattr(self.model, "score") or self.model.config.num_labels != 1:
            raise RewardModelError(
                f"reward model {source.location}: expected a *ForSequenceClassification with one label (a score "
                f"head), found {type(self.model).__name__} with {self.model.config.num_labels} labels"
            )
        self.model.to(device).eval().requires_grad_(False)
        self.device = device

    @torch.no_grad()
    def scores(self, sequences: list[list[int]]) -> list[float]:
        """Each sequence's score where transformers' own forward reads it: at its last token that is not the model's
        pad_token_id (rows right-padded here; padding never reaches a real token)."""
        width = max(len(sequence) for sequence in sequences)
        ids = torch.zeros((len(sequences), width), dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, sequence in enumerate(sequences):
            ids[row, : len(sequence)], mask[row, : len(sequence)] = torch.tensor(sequence), 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        hidden = self.model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
        per_token = self.model.score(hidden).float()[..., 0]
        pad = self.model.config.pad_token_id
        last = torch.tensor(
            [max((i for i, token in enumerate(sequence) if token != pad), default=0) for sequence in sequences],
            device=self.device,
        )
        return per_token[torch.arange(len(sequences), device=self.device), last].tolist()


def scored_by(model: RewardModel, end_id: int) -> Any:
    """A reward function (TRL's call) scoring each prompt + completion with `model` from their token ids."""

    def score(prompt_ids: list[list[int]], completion_ids: list[list[int]], **_: Any) -> list[float]:
        return model.scores([[*p, *c, end_id] for p, c in zip(prompt_ids, completion_ids, strict=True)])

    return score
