"""The config's alignment block as what a run needs: the preference data's form, the objective, the reference
model's log-probs and the LoRA adapters (fresh or resumed)."""

from __future__ import annotations

from pathlib import Path

from nxd_align import LoraFamily, Objective, objective_for, reference_digest
from nxd_ckpt import read_info
from nxd_config import NxdConfig
from nxd_config.schema.alignment import DPOConfig, GRPOConfig, KTOConfig, ORPOConfig, RewardModelConfig
from nxd_models import ModelFamily
from nxd_precision import PrecisionPolicy

from nxd_train.run.checkpointing import Resume, is_hf_directory, resume_choice
from nxd_train.run.data_splits import DataSplits
from nxd_train.run.model_specs import peft_config, training_method
from nxd_train.run.plan import Adapters, PreflightError, Reference


def preference_config(cfg: NxdConfig) -> DPOConfig | ORPOConfig | KTOConfig | RewardModelConfig | None:
    """The dpo, orpo, kto or reward_model block, when the run trains on preference data."""
    alignment = cfg.model_alignment_strategy
    if alignment is None:
        return None
    return alignment.dpo or alignment.orpo or alignment.kto or alignment.reward_model


def grpo_config(cfg: NxdConfig) -> GRPOConfig | None:
    """The grpo block, when the run trains online on its own samples."""
    alignment = cfg.model_alignment_strategy
    return None if alignment is None else alignment.grpo


def objective_of(cfg: NxdConfig) -> Objective:
    block = preference_config(cfg)
    if isinstance(block, DPOConfig):
        settings = {
            "beta": block.kl_beta,
            "loss_type": block.loss_type,
            "label_smoothing": block.label_smoothing,
            "reference_free": block.reference_free,
        }
    elif isinstance(block, KTOConfig):
        settings = {
            "beta": block.beta,
            "desirable_weight": block.desirable_weight,
            "undesirable_weight": block.undesirable_weight,
            "kl_estimate": block.kl_estimate,
        }
    elif isinstance(block, RewardModelConfig):
        settings = {"z_loss": block.z_loss}
    elif (grpo := grpo_config(cfg)) is not None:
        settings = {
            "max_new_tokens": grpo.max_new_tokens,
            "loss_type": grpo.loss_type,
            "epsilon": grpo.epsilon,
            "epsilon_high": grpo.epsilon_high,
            "importance_sampling": grpo.importance_sampling_level,
            "beta": grpo.beta,
            "kl_estimator": grpo.kl_estimator,
            "kl_importance_correction": grpo.kl_importance_correction,
        }
    else:
        settings = {} if block is None else {"beta": block.beta}
    return objective_for(training_method(cfg), **settings)


def initial_weights(cfg: NxdConfig, resume: Resume | None) -> Resume | None:
    """The weights the run started from at step 0 (weight_init_only), even when it now continues from
    its own checkpoint; None: the seeded initialisation."""
    if resume is not None and resume.weights_only:
        return resume
    if cfg.model.weight_init_only and cfg.exp_manager.resume_from_checkpoint:
        return resume_choice(cfg, None)
    return None


def reference_of(
    cfg: NxdConfig, resume: Resume | None, family: ModelFamily | LoraFamily, data: DataSplits, policy: PrecisionPolicy
) -> Reference | None:
    """DPO's and KTO's reference: precomputed or live, from the initial weights, with the digest of its
    table; none for reference-free DPO or where the data carries the reference log-probs."""
    block = preference_config(cfg)
    if (
        not isinstance(block, DPOConfig | KTOConfig)
        or getattr(block, "reference_free", False)
        or data.reference_in_data
    ):
        return None
    initial = initial_weights(cfg, resume)
    parts = {
        "model": str(family.spec),
        "attention": str(family.attention),
        "seq_length": cfg.seq_length,
        "initial": f"seed {cfg.seed}" if initial is None else str(initial.path),
        "policy": repr(policy),
        "train": data.train.fingerprint,
        "validation": None if data.validation is None else data.validation.fingerprint,
        **({} if data.test is None else {"test": data.test.fingerprint}),
    }
    return Reference(
        precompute=block.precompute_ref_log_probs,
        initial=initial,
        digest=reference_digest(parts),
        kl_baseline=isinstance(block, KTOConfig) and block.kl_estimate == "mismatched",
    )


def adapters_of(cfg: NxdConfig, resume: Resume | None) -> Adapters | None:
    """LoRA's checkpoint settings, and where its base comes from when a checkpoint holds adapters only:
    a continuing run's initial weights (resume_from_checkpoint; when that names the adapter checkpoint itself,
    the weights its run started from, else model.model_config), or with load_lora_from_ckpt model.model_config."""
    if (peft := peft_config(cfg)) is None:
        return None
    base, source = "frozen" if peft.save_lora_base else "merged" if peft.merge_lora else None, None
    exp = cfg.exp_manager
    directory = Path(cfg.model.hf_model_config) if cfg.model.hf_model_config else None
    if resume is not None and not resume.weights_only and exp.resume_from_checkpoint:
        source = resume_choice(cfg, None)
        if not source.weights_only:  # resumed from the adapter checkpoint itself: the base its run started from
            saved = read_info(source.path).extra.get("config", {}).get("exp_manager", {}).get("resume_from_checkpoint")
            base_dir = Path(saved) if saved else directory
            source = Resume.of_hugging_face(base_dir) if base_dir is not None and is_hf_directory(base_dir) else None
    elif peft.load_lora_from_ckpt:
        if not (exp.resume_from_checkpoint and cfg.model.weight_init_only):
            raise PreflightError(
                [
                    "model_alignment_strategy.peft.load_lora_from_ckpt: expected the LoRA checkpoint "
                    "in exp_manager.resume_from_checkpoint with model.weight_init_only: True"
                ]
            )
        if directory is not None and is_hf_directory(directory):
            source = Resume.of_hugging_face(directory)
    return Adapters(
        base=base,
        config_file=peft.save_lora_config_adapter,
        single_file=peft.merge_sharded_lora,
        from_checkpoint=peft.load_lora_from_ckpt,
        verbose=peft.lora_verbose,
        base_source=source,
    )
