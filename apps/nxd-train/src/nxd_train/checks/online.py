"""What an online-RL run (model_alignment_strategy.grpo) needs before launch: its rewards loaded (a function that
does not import is named by its key), a reference's weights when beta > 0, and the parts of this release it
cannot take yet, each refused by its key."""

from __future__ import annotations

from pathlib import Path

from nxd_align.rewards import Reward, RewardError, builtin_reward, import_reward
from nxd_ckpt import CheckpointError
from nxd_config import NxdConfig
from nxd_config.schema.alignment import RewardConfig
from nxd_models import ModelFamily

from nxd_train.run.checkpointing import Resume
from nxd_train.run.objective_specs import grpo_config, initial_weights
from nxd_train.run.plan import OnlineRL
from nxd_train.run.reward_models import RewardModelError, reward_model_source

GRPO = "model_alignment_strategy.grpo"


def online_plan(
    cfg: NxdConfig, resume: Resume | None, family: ModelFamily | None, tokenizer: str | None
) -> tuple[OnlineRL | None, list[str]]:
    """The run's rollout plan (None for other runs) and the problems that stop it; `tokenizer`: the policy's
    tokenizer's fingerprint, which a reward model's must equal."""
    grpo = grpo_config(cfg)
    if grpo is None:
        return None, []
    problems, rewards, models = [], [], {}
    if not grpo.rewards:  # a GPT-NeoX file names none (its data server scored the completions)
        problems.append(
            f"{GRPO}.rewards: expected at least one reward (a function, builtin or model), found none; a GPT-NeoX "
            "file cannot name them: translate it (nxd-train config translate) and add them"
        )
    for index, spec in enumerate(grpo.rewards):
        key = f"{GRPO}.rewards[{index}]"
        try:
            if spec.model is not None:
                name = spec.name or Path(spec.model.rstrip("/")).name
                models[name] = reward_model_source(spec.model, f"{key}.model", tokenizer, spec.trust_remote_code)
                rewards.append(Reward(name, None, spec.weight))
            else:
                rewards.append(_reward(spec, key))
        except (RewardError, RewardModelError, CheckpointError) as error:
            problems.append(str(error))
    if len({reward.name for reward in rewards}) < len(rewards):
        problems.append(
            f"{GRPO}.rewards: expected each reward under its own name (they are logged as rewards/<name>/mean), "
            f"found {', '.join(reward.name for reward in rewards)}: give them names"
        )
    initial = initial_weights(cfg, resume)
    if grpo.beta and initial is None and cfg.model_alignment_strategy.peft is None:
        problems.append(
            f"{GRPO}.beta: a KL to the reference needs the weights the run starts from (model.weight_init_only with "
            "exp_manager.resume_from_checkpoint, or a Hugging Face model), and this run starts from a random "
            f"initialisation; expected beta 0, or initial weights, found {grpo.beta}"
        )
    problems += _not_yet(family)
    return OnlineRL(grpo, tuple(rewards), initial, models), problems


def _reward(spec: RewardConfig, key: str) -> Reward:
    if spec.function is not None:
        return Reward(
            spec.name or spec.function.partition(":")[2], import_reward(spec.function, f"{key}.function"), spec.weight
        )
    function = builtin_reward(spec.builtin, field=spec.field, pattern=spec.pattern, tolerance=spec.tolerance)
    return Reward(spec.name or spec.builtin, function, spec.weight)


def _not_yet(family: ModelFamily | None) -> list[str]:
    if family is None or family.moe is None:
        return []
    return [
        f"model.moe: a mixture-of-experts policy would sample with every token routed, which its training routing "
        f"is not; expected a dense model with {GRPO}"
    ]
