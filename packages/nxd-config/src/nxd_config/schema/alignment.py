"""`model_alignment_strategy`: SFT, DPO, ORPO, KTO, reward-model or online (GRPO) training, each optionally with
LoRA (`peft`).

A method is chosen by writing its block: `sft:` alone (even empty) selects SFT with defaults.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from ._base import Section, frozen_list, key

ALIGN = "nxd-align"
DATA = "nxd-data"

Truncation = Literal["keep_start", "keep_end"]
METHODS = ("sft", "dpo", "orpo", "kto", "reward_model", "grpo")
PREFERENCE_METHODS = ("dpo", "orpo", "kto", "reward_model")
"""The methods trained on preference data (a prompt and responses, cut to max_prompt_length)."""


class SFTConfig(Section):
    packing: bool = key(
        False,
        "Pack records into rows of seq_length (best fit; each record attends only to itself and keeps its "
        "prompt masking) instead of padding one record per row.",
        by=DATA,
    )


class DPOConfig(Section):
    kl_beta: float = key(0.01, "Beta of the DPO loss (strength of the pull towards the reference).", by=ALIGN, gt=0.0)
    loss_type: Literal["sigmoid", "ipo", "hinge", "robust"] = key(
        "sigmoid",
        "DPO loss, of h = the chosen minus the rejected response's log-ratio to the reference: sigmoid, "
        "-log sigmoid(beta h); ipo, (h' - 1 / (2 beta))^2 with log-ratios averaged per response token (as TRL); "
        "hinge, max(0, 1 - beta h); robust, sigmoid corrected for preference labels flipped with probability "
        "label_smoothing.",
        by=ALIGN,
    )
    label_smoothing: float = key(
        0.0,
        "nxd extension (TRL's key): the probability that a preference label is flipped, in [0, 0.5); robust "
        "divides it out, sigmoid becomes conservative DPO (cDPO). Not used by ipo or hinge.",
        by=ALIGN,
        ge=0.0,
        lt=0.5,
    )
    reference_free: bool = key(
        False,
        "nxd extension (GPT-NeoX's dpo_reference_free): no reference model; its log-probs count as 0.",
        by=ALIGN,
    )
    max_prompt_length: int | None = key(
        None,
        "Longest prompt kept in prompt + response (required with train_dir records). Older spelling: "
        "max_dpo_prompt_length.",
        by=DATA,
        ge=1,
    )
    precompute_ref_log_probs: bool = key(
        True,
        "Compute the reference model's log-probs (the initial weights; under LoRA, the base) once before "
        "training, for train and validation data, kept with the run and its checkpoints; False runs the reference "
        "beside the policy every step (LoRA: the adapters switched off; else a frozen copy of the model).",
        by=ALIGN,
    )
    truncation_mode: Truncation = key("keep_start", "Which end of an over-long prompt + response is kept.", by=DATA)


class ORPOConfig(Section):
    beta: float = key(0.01, "Weight of the odds-ratio term of the ORPO loss.", by=ALIGN, gt=0.0)
    max_prompt_length: int | None = key(
        None, "Longest prompt kept in prompt + response (required with train_dir records).", by=DATA, ge=1
    )
    truncation_mode: Truncation = key("keep_start", "Which end of an over-long prompt + response is kept.", by=DATA)


class KTOConfig(Section):
    beta: float = key(
        0.1, "nxd extension. Beta of the KTO loss (strength of the pull towards the reference).", by=ALIGN, gt=0.0
    )
    desirable_weight: float = key(
        1.0,
        "Weight of the desirable examples' losses (raise it when they are fewer than the undesirable ones).",
        by=ALIGN,
        gt=0.0,
    )
    undesirable_weight: float = key(1.0, "Weight of the undesirable examples' losses.", by=ALIGN, gt=0.0)
    kl_estimate: Literal["mismatched", "batch_halves"] = key(
        "mismatched",
        "nxd extension. KTO's KL baseline: mismatched, the KTO paper's and TRL's (each prompt with "
        "another record's completion, averaged over the global batch); batch_halves, GPT-NeoX's (each half of a "
        "micro-batch measured on the other half's examples, each clamped at 0 before the mean), which reads "
        "data.example_documents (each document's reward: its sign the kind, its size a factor on beta) and needs an "
        "even micro_batch_size. Unlike GPT-NeoX's own step, beta is not diluted by the share of the row a document "
        "fills and each example keeps its own weight.",
        by=ALIGN,
    )
    max_prompt_length: int | None = key(
        None, "Longest prompt kept in prompt + completion (required with train_dir records).", by=DATA, ge=1
    )
    precompute_ref_log_probs: bool = key(
        True,
        "Compute the reference model's log-probs of every example (and KL sequence) once before training (kept "
        "with the run and its checkpoints); False runs the reference beside the policy every step.",
        by=ALIGN,
    )
    truncation_mode: Truncation = key("keep_start", "Which end of an over-long prompt + completion is kept.", by=DATA)


class RewardModelConfig(Section):
    packing: bool = key(
        True,
        "nxd extension. Each micro-batch's sequences are packed into one row without padding, attention "
        "confined to each sequence (the same scores, less work); false pads each to the micro-batch's longest. "
        "Rows stay padded under pipeline parallelism (its stages pass one shape), context parallelism (its ring "
        "attention would compute the whole packed row) and where attention takes masks only (the unfused kernel, "
        "ALiBi).",
        by=DATA,
    )
    z_loss: float = key(
        0.0,
        "nxd extension (GPT-NeoX's z_loss): weight of r_chosen^2 + r_rejected^2 added to each pair's loss, "
        "keeping the scores near 0.",
        by=ALIGN,
        ge=0.0,
    )
    max_prompt_length: int | None = key(
        None, "Longest prompt kept in prompt + response (required with train_dir records).", by=DATA, ge=1
    )
    truncation_mode: Truncation = key("keep_start", "Which end of an over-long prompt + response is kept.", by=DATA)


class PeftConfig(Section):
    lora_rank: int = key(16, "LoRA rank r.", by=ALIGN, ge=1)
    lora_alpha: int = key(32, "LoRA scaling numerator (updates are scaled by alpha / r).", by=ALIGN, ge=1)
    lora_dropout: float = key(0.05, "Dropout on the input of each adapter (its A).", by=ALIGN, ge=0.0, lt=1.0)
    lora_bias: Literal["none", "all", "lora_only"] = key(
        "none",
        "Biases that train with the adapters: none, all (every bias of the model) or lora_only (those of the "
        "adapted layers).",
        by=ALIGN,
    )
    lora_verbose: bool = key(False, "Log every adapted layer and this rank's trainable tensors.", by=ALIGN)
    target_modules: frozen_list(str) = key(
        ("qkv_proj",),
        "Linear layers of the decoder that get adapters: NxDT's qkv_proj (q, k and v, or the fused QKV "
        "module), gate_up_proj (gate and up), o_proj, down_proj, or transformers' q_proj, k_proj, v_proj, gate_proj, "
        "up_proj.",
        by=ALIGN,
    )
    load_lora_from_ckpt: bool = key(
        False,
        "exp_manager.resume_from_checkpoint names a LoRA checkpoint: start from its adapters, and its base "
        "when saved with save_lora_base (else the base is the Hugging Face directory model.model_config).",
        by="nxd-ckpt",
    )
    save_lora_base: bool = key(
        False, "Checkpoints also hold the frozen base model, under its own names.", by="nxd-ckpt"
    )
    merge_lora: bool = key(
        False,
        "Checkpoints also hold the merged weights W + (alpha / r) B A under the base model's names, computed "
        "in fp32 (the live weights never change).",
        by="nxd-ckpt",
    )
    save_lora_config_adapter: bool = key(True, "Each checkpoint holds peft's adapter_config.json.", by="nxd-ckpt")
    merge_sharded_lora: bool = key(
        False,
        "Each checkpoint also holds adapter_model.safetensors: the whole adapter gathered from every shard, "
        "in peft's layout for the Hugging Face model.",
        by="nxd-ckpt",
    )


class RewardConfig(Section):
    """One reward of a GRPO run: exactly one of function, builtin or model."""

    name: str | None = key(
        None,
        "What the reward is logged as (rewards/<name>/mean); default: the function's, builtin's or folder's name.",
        by=ALIGN,
    )
    function: str | None = key(
        None,
        "A Python function named by import path, module:function (as QEfficient's prompt_func), called with "
        "prompts=, completions= (texts, or assistant messages for chat prompts), completion_ids=, prompt_ids= and "
        "each of the record's other fields as a list (so it takes **kwargs for what it does not read); returns one "
        "float per completion, or None to leave it unscored.",
        by=ALIGN,
    )
    builtin: Literal["exact_match", "regex", "numeric", "format"] | None = key(
        None,
        "A verifiable reward: exact_match, 1 when the completion (stripped) equals the record's `field`; regex, 1 "
        "when `pattern` is found in the completion; numeric, 1 when the completion's answer (after '####', else "
        "its last number) is within `tolerance` of the record's `field`; format, 1 when the whole completion "
        "matches `pattern`. 0 otherwise.",
        by=ALIGN,
    )
    model: str | None = key(
        None,
        "A reward model: the folder of an nxd run trained with reward_model (its newest checkpoint, or a "
        "checkpoint folder), or a Hugging Face *ForSequenceClassification folder or hub id; it scores prompt + "
        "completion + end-of-document (their token ids, so its tokenizer must be the policy's) where transformers' "
        "own forward reads the score: at the last token that is not the model's pad id.",
        by=ALIGN,
    )
    trust_remote_code: bool = key(False, "Run a Hugging Face reward model's own code (its auto_map).", by=ALIGN)
    field: str = key("answer", "The record field exact_match and numeric compare with.", by=ALIGN)
    pattern: str | None = key(None, "The regular expression of regex and format (Python's re).", by=ALIGN)
    tolerance: float = key(0.0, "How far numeric's answer may be from the record's.", by=ALIGN, ge=0.0)
    weight: float = key(1.0, "The reward's weight in the sum the advantages are computed from.", by=ALIGN)


class GRPOConfig(Section):
    num_generations: int = key(
        8,
        "Completions sampled per prompt (the group). data.global_batch_size counts prompts, each with its group.",
        by=ALIGN,
        ge=1,
    )
    max_new_tokens: int = key(
        512, "Longest completion; prompt + completion must fit model.encoder_seq_length.", by=ALIGN, ge=1
    )
    temperature: float = key(
        1.0,
        "Sampling temperature; the loss's log-probs are of the model's logits divided by it, as TRL's.",
        by=ALIGN,
        gt=0.0,
    )
    top_k: int = key(0, "Sample among the k likeliest tokens (0: all).", by=ALIGN, ge=0)
    top_p: float = key(
        1.0, "Sample from the smallest set of tokens whose probability reaches top_p.", by=ALIGN, gt=0.0, le=1.0
    )
    stop: frozen_list(str) = key(
        (), "Strings that end a completion (kept in it), besides the end-of-document token.", by=ALIGN
    )
    seed: int | None = key(
        None,
        "Seed of the rollouts' sampling: each completion draws from its own stream, seeded by it, the rollout's "
        "number and the prompt, so a layout or a resume samples the same completions; null: the run's seed.",
        by=ALIGN,
    )
    mask_truncated_completions: bool = key(
        False, "Leave completions that reached max_new_tokens without ending out of the loss.", by=ALIGN
    )
    baseline: Literal["group_mean", "leave_one_out", "running_mean"] = key(
        "group_mean",
        "What a reward is compared with: its group's mean (GRPO), the mean of the group's other completions (RLOO, "
        "GPT-NeoX's reinforce_leave_one_out), or the mean of the last 100 groups' means (GPT-NeoX's REINFORCE).",
        by=ALIGN,
    )
    scale_rewards: Literal["group", "batch", "none"] = key(
        "group",
        "The standard deviation the centred rewards are divided by (plus 1e-4): the group's, the global batch's, or "
        "none (Dr. GRPO).",
        by=ALIGN,
    )
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = key(
        "dapo",
        "How the per-token terms are averaged: dapo, over every completion token of the global batch; bnpo, each "
        "micro-batch's tokens, then over micro-batches; grpo, each completion's tokens, then over completions; "
        "dr_grpo, each completion's token sum over max_new_tokens, then over completions.",
        by=ALIGN,
    )
    epsilon: float = key(
        0.2, "The ratio's lower clip, 1 - epsilon (and the upper one unless epsilon_high).", by=ALIGN, ge=0.0
    )
    epsilon_high: float | None = key(
        None, "The ratio's upper clip, 1 + epsilon_high (DAPO's clip-higher).", by=ALIGN, ge=0.0
    )
    importance_sampling_level: Literal["token", "sequence"] = key(
        "token", "The importance ratio per token, or per sequence (GSPO: the mean log-ratio over its tokens).", by=ALIGN
    )
    num_iterations: int = key(
        1,
        "Optimizer steps on each rollout batch (mu); its log-probs at sampling time are kept for the ratio.",
        by=ALIGN,
        ge=1,
    )
    beta: float = key(
        0.0,
        "Weight of the KL to the reference model (the initial weights; under LoRA, the base); 0 loads no reference.",
        by=ALIGN,
        ge=0.0,
    )
    kl_estimator: Literal["k3", "k1", "abs", "mse"] = key(
        "k3",
        "The per-token KL estimate: k3, exp(ref - logp) - (ref - logp) - 1 (TRL's); k1, logp - ref; abs, its "
        "magnitude; mse, half its square (GPT-NeoX's kl_impl kl, abs and mse).",
        by=ALIGN,
    )
    kl_importance_correction: bool = key(
        True,
        "Weight the KL term by the importance ratio (TRL's use_bias_correction_kl); 1 on the sampling policy, it "
        "adds KL x grad log p to the gradient. False: the KL's own gradient only (GPT-NeoX's REINFORCE).",
        by=ALIGN,
    )
    dynamic_sampling: bool = key(
        False,
        "Replace each group whose rewards are all equal (no advantage to learn from) by the group of another "
        "prompt of the training data whose rewards differ (DAPO), in at most 8 rounds of draws a step; a group still "
        "flat then stays. Logged as rollouts/refilled_groups.",
        by=ALIGN,
    )
    rewards: frozen_list(RewardConfig) = key((), "The rewards, summed with their weights.", by=ALIGN)
    on_reward_error: Literal["stop", "skip"] = key(
        "stop",
        "A reward that raises, returns the wrong count or NaN: stop the run naming it and the record, or drop that "
        "group from the step and count it (rollouts/skipped_groups).",
        by=ALIGN,
    )
    prompt_field: str = key(
        "prompt",
        "The record field holding the prompt: a string, or chat messages rendered with the tokenizer's template.",
        by=DATA,
    )
    log_completions: int = key(
        4, "Sampled completions with their rewards written to completions.jsonl at each logging step.", by=ALIGN, ge=0
    )


class AlignmentConfig(Section):
    sft: SFTConfig | None = key(
        None,
        "Supervised fine-tuning: the loss on the outputs of input/output records, or on the assistant turns "
        "of messages records (rendered with the tokenizer's chat template), in data.train_dir.",
        by=ALIGN,
    )
    dpo: DPOConfig | None = key(None, "Direct preference optimisation.", by=ALIGN)
    orpo: ORPOConfig | None = key(None, "Odds-ratio preference optimisation.", by=ALIGN)
    kto: KTOConfig | None = key(
        None,
        "nxd extension. Kahneman-Tversky optimisation: prompt / completion / label records (label true for a "
        "desirable completion), against a reference.",
        by=ALIGN,
    )
    reward_model: RewardModelConfig | None = key(
        None,
        "nxd extension. A reward model: the output layer becomes a score head, trained on the same prompt / "
        "chosen / rejected records as DPO (an optional margin per record) with the pairwise loss -log sigmoid(r_chosen "
        "- r_rejected - margin); exports as transformers' *ForSequenceClassification.",
        by=ALIGN,
    )
    grpo: GRPOConfig | None = key(
        None,
        "nxd extension. Online reinforcement learning (GRPO and its variants: Dr. GRPO, DAPO, GSPO, RLOO, GPT-NeoX's "
        "REINFORCE): each step samples completions of its prompts (data.train_dir records, or data.data_prefix "
        "documents with their data.label_prefixes) from the policy, scores them with the rewards and trains on their "
        "advantages.",
        by=ALIGN,
    )
    peft: PeftConfig | None = key(None, "LoRA adapters; combines with any method.", by=ALIGN)

    @model_validator(mode="before")
    @classmethod
    def _present_means_enabled(cls, data: Any) -> Any:
        """`dpo:` with nothing under it selects DPO with its defaults, as in NxDT."""
        if isinstance(data, dict):
            return {name: ({} if value is None else value) for name, value in data.items()}
        return data

    @property
    def method(self) -> str | None:
        """The chosen method: 'sft', 'dpo', 'orpo', 'kto', 'reward_model', 'grpo', or None (only LoRA, or nothing)."""
        for name in METHODS:
            if getattr(self, name) is not None:
                return name
        return None
