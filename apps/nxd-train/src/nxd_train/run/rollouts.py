"""Online RL's step pass: each step's prompts become rollout micro-batches before the policy's pass.

On every data-parallel rank, for its own prompts: `num_generations` completions each, sampled from the policy as it
is sharded (ranks that gather weights in each forward run their forwards in lockstep; under pipeline stages the
first pipeline rank samples on the whole model, nxd-parallel's `GatheredStages`, and sends the scored completions to
the others). Each completion draws from
a stream of its own, seeded by the run's seed, the rollout's number and the prompt's index and place in its group:
whatever the layout, and after a resume, a prompt gets the same completions from the same weights. They are
scored by the rewards, turned into advantages (group by group; the "batch" scale sees every rank's rewards, the
running baseline is each rank's own, as GPT-NeoX's data server keeps it), and laid out as sequences of prompt +
completion whose labels are the completion's tokens (and its end-of-document token when it ended), packed as
documents of rows unless pipeline stages need one shape. With
num_iterations > 1 the rows also carry the log-probs they were sampled with, and a rollout batch serves that many
steps; with beta > 0 they carry the reference's. What a step sampled is summed up in `metrics` (TRL's names) and a
few completions are kept for completions.jsonl. Evaluation rollouts draw from streams of their own and change no
training state.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from nxd_align import ADVANTAGE_KEY, IGNORE_INDEX, OLD_KEY, REFERENCE_TOKENS_KEY, Advantages, weighted_rewards
from nxd_align.advantages import nan_std
from nxd_align.rewards import Reward, RewardError, checked
from nxd_config.schema.alignment import GRPOConfig
from nxd_data import PROMPT_INDEX, PROMPT_SPLIT, Prompt, PromptDataset, TextTokenizer, completion_rows
from nxd_data.prompts import SPLITS
from nxd_models import set_loss_temperature
from nxd_models.decoding import decoding_cache, decoding_logits
from nxd_models.generation import Completion, Sampling, generate
from nxd_parallel import StagedModel, modules_of

from nxd_train.run.checkpointing import Resume
from nxd_train.run.initial_weights import gathered_stages
from nxd_train.run.reference import frozen_reference, reference_mode
from nxd_train.run.reward_models import RewardModel, RewardModelSource, scored_by
from nxd_train.run.rollout_metrics import mean_std, rollout_metrics
from nxd_train.run.state import Batch, Run

REFILL_ROUNDS = 8
"""Dynamic sampling's draws of replacement groups a rollout at most."""


class RolloutError(Exception):
    """A reward stopped the run (on_reward_error: stop); the message names it and the record."""


@dataclass
class Sampled:
    """One step's completions on this rank, row by row (a prompt's group on consecutive rows)."""

    prompts: list[Prompt | None]
    """Each row's prompt (None for a padding sample's rows)."""
    completions: list[Completion]
    rewards: torch.Tensor
    per_function: torch.Tensor
    kept: torch.Tensor
    """Rows whose group is trained on (a group a reward could not score is dropped with on_reward_error: skip)."""
    entropies: list[list[float]]
    """Each row's sampled tokens' entropies."""


class Rollouts:
    """The step pass of a GRPO run (module docstring)."""

    def __init__(
        self,
        run: Run,
        grpo: GRPOConfig,
        rewards: Sequence[Reward],
        tokenizer: TextTokenizer,
        initial: Resume | None,
        models: dict[str, RewardModelSource],
    ):
        """`initial`: the reference's weights with beta > 0 (None: the seeded initialisation); `models`: the
        reward models to load, by the name of the reward they serve."""
        self.run, self.grpo, self.tokenizer = run, grpo, tokenizer
        self.rewards = [
            reward
            if reward.function is not None
            else replace(
                reward,
                function=scored_by(RewardModel(models[reward.name], run.fabric.device, run.log_dir), tokenizer.eod_id),
            )
            for reward in rewards
        ]
        self.group = grpo.num_generations
        self.sampling = Sampling(grpo.temperature, grpo.top_k, grpo.top_p if grpo.top_p < 1 else 0.0)  # 0: no nucleus
        self.seed = run.plan.launch.seed if grpo.seed is None else grpo.seed
        self.draws = 0
        """Training rollouts sampled so far: part of each completion's seed."""
        self.evaluations = 0
        """Evaluation rollouts so far (their seeds are apart from training's, and they change no training state)."""
        self.tag = ""
        """The rollout in progress, in the seeds: its training number, or eval/ and its evaluation number."""
        self.sampling_seconds = 0.0
        self.advantages = Advantages(grpo.num_generations, grpo.baseline, grpo.scale_rewards)
        self.reference = frozen_reference(run, initial) if grpo.beta else None
        self.whole = None
        """With pipeline stages: the whole model sampling runs on (refreshed from the stages each rollout)."""
        if isinstance(run.model, StagedModel):
            self.whole = gathered_stages(run.plan, run.fabric, run.mesh)
            run.monitor.info(
                f"rollouts: the first of the {run.dims.pp} pipeline ranks samples on the whole policy, its stages "
                "gathered before each rollout (a cached generation runs token by token, which a pipeline schedule "
                "does not), and sends the scored completions to the others"
            )
        self.policy = run.model if self.whole is None else self.whole.model
        """What rollouts sample from: the policy, or its gathered stages."""
        self.packed = run.trim_to is not None and run.dims.cp == 1 and run.plan.family.packs_exactly
        """Whether completions train packed as documents of rows: rows no wider than unpacked ones (any kernel gains),
        where a packed completion computes as it was sampled (pipeline stages pass one shape: trim_to is None)."""
        for model in (run.model, *(() if self.reference is None else (self.reference[0],))):
            set_loss_temperature(modules_of(model), grpo.temperature)  # the log-probs of what was sampled
        self.metrics: dict[str, float] = {}
        self.samples: list[dict[str, Any]] = []
        self.skipped_groups = 0
        self.refilled_groups = 0

    def __call__(self, batches: list[Batch]) -> None:
        if PROMPT_INDEX not in batches[0]:  # the same rollout batch again (num_iterations)
            return
        split = SPLITS[int(batches[0][PROMPT_SPLIT][0])]
        dataset = {"train": self.run.train_data, "validation": self.run.validation_data, "test": self.run.test_data}
        self._roll_out(batches, dataset[split], training=torch.is_grad_enabled())  # evaluation runs without them

    def write_samples(self, path: Path, step: int) -> None:
        """The step's kept completions with their rewards, one JSON line each, appended to `path`."""
        if not self.samples:
            return
        with open(path, "a") as file:
            for sample in self.samples:
                file.write(json.dumps({"step": step, **sample}) + "\n")

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the rollouts drawn (the next ones' seeds), the running baseline, the skipped
        groups."""
        return {
            "draws": self.draws,
            "advantages": self.advantages.state_dict(),
            "skipped_groups": self.skipped_groups,
            "refilled_groups": self.refilled_groups,
        }

    def resume(self, state: dict[str, Any] | None, drawn: int) -> None:
        """Continue from a checkpoint's `state`; without one (other random states, or a resume at another world
        size), from the `drawn` rollouts its steps took, with a fresh running baseline."""
        if state is None:
            self.draws = drawn
            return
        self.draws = int(state["draws"])
        self.advantages.load_state_dict(state.get("advantages", {}))
        self.skipped_groups = int(state.get("skipped_groups", 0))
        self.refilled_groups = int(state.get("refilled_groups", 0))

    def _roll_out(self, batches: list[Batch], dataset: PromptDataset, *, training: bool) -> None:
        """The micro-batches' prompts sampled, scored and laid out in place; an evaluation's rollout keeps its own
        baseline and leaves the training metrics, samples and counters as they were."""
        started, self.sampling_seconds = time.perf_counter(), 0.0
        indices = [index for batch in batches for index in batch[PROMPT_INDEX].tolist()]
        rows = [dataset.prompts[index] if index >= 0 else None for index in indices for _ in range(self.group)]
        if training:
            self.draws += 1
        else:
            self.evaluations += 1
        self.tag = str(self.draws) if training else f"eval/{self.evaluations}"
        streams = [self._stream(index, place) for index in indices for place in range(self.group)]
        if self.whole is None:
            sampled = self._sampled(rows, streams, dataset, training=training)
        else:
            sampled = self._on_first_stage(rows, streams, dataset, training=training)
        rule = self.advantages if training else Advantages(self.group, self.grpo.baseline, self.grpo.scale_rewards)
        advantages = rule(sampled.rewards, self._batch_std) * sampled.kept
        start = 0
        for batch in batches:
            count = len(batch[PROMPT_INDEX]) * self.group
            batch.clear()
            batch.update(self._lay_out(sampled, advantages, slice(start, start + count)))
            start += count
        if self.grpo.num_iterations > 1:
            self._attach_log_probs(batches, OLD_KEY, self.run.model, self.run.executor, lora=False)
        if self.reference is not None:
            model, executor, lora = self.reference
            self._attach_log_probs(batches, REFERENCE_TOKENS_KEY, model, executor, lora=lora)
        if training:
            self._summarise(sampled, advantages, self.sampling_seconds, time.perf_counter() - started)

    def _refill(self, sampled: Sampled, dataset: PromptDataset) -> None:
        """DAPO's dynamic sampling: each group whose rewards are all equal (nothing to learn from) is replaced by the
        group of another prompt whose rewards differ, in at most REFILL_ROUNDS rounds; a group still flat then stays
        (its advantages are 0). Each data-parallel rank draws its own replacement prompts (so which ones depends on
        the layout), and every rank runs as many rounds (generation runs in lockstep)."""
        rank = self.run.mesh.data_parallel_rank
        for attempt in range(REFILL_ROUNDS):
            flat = [start for start in range(0, len(sampled.prompts), self.group) if self._spread(sampled, start) == 0]
            if not self._anywhere(len(flat)):
                break
            picker = torch.Generator().manual_seed(self._seed(f"refill/{attempt}/rank{rank}"))
            fresh = torch.randint(len(dataset), (len(flat),), generator=picker).tolist()
            rows = [dataset.prompts[index] for index in fresh for _ in range(self.group)]
            streams = [
                self._stream(f"refill{attempt}/rank{rank}:{index}", place)
                for index in fresh
                for place in range(self.group)
            ]
            completions, entropies = self._sample(rows or [None], streams or [self._stream("idle", 0)])
            if not rows:
                continue
            candidates = self._score(rows, completions, entropies, training=True)
            for number, start in enumerate(flat):
                offset = number * self.group
                if not self._spread(candidates, offset):  # unscored, dropped or flat again: not taken
                    continue
                span, taken = slice(start, start + self.group), slice(offset, offset + self.group)
                for name in ("prompts", "completions", "rewards", "per_function", "kept", "entropies"):
                    getattr(sampled, name)[span] = getattr(candidates, name)[taken]
                self.refilled_groups += 1

    def _sampled(
        self, rows: list[Prompt | None], streams: list[torch.Generator], dataset: PromptDataset, *, training: bool
    ) -> Sampled:
        """The rows' completions, scored (with dynamic sampling, flat groups replaced)."""
        completions, entropies = self._sample(rows, streams)
        sampled = self._score(rows, completions, entropies, training=training)
        if self.grpo.dynamic_sampling and training:
            self._refill(sampled, dataset)
        return sampled

    def _on_first_stage(
        self, rows: list[Prompt | None], streams: list[torch.Generator], dataset: PromptDataset, *, training: bool
    ) -> Sampled:
        """With pipeline stages: every pipeline rank sends its stages' weights into the whole model, the first one
        samples and scores, and the others receive what it found (with its counters and sampling time), so the first
        stage's inputs and the last stage's labels are of one rollout; a failure there stops every rank."""
        self.whole.refresh(self.run.model)
        group = self.run.mesh.get("pp").get_group()
        found: list[Any] = [None]
        if self.run.mesh.rank("pp") == 0:
            try:
                sampled = self._sampled(rows, streams, dataset, training=training)
                found = [(sampled, self.skipped_groups, self.refilled_groups, self.sampling_seconds)]
            except Exception as error:  # noqa: BLE001 - sent to the other stages, then raised on every rank
                found = [error]
        torch.distributed.broadcast_object_list(found, src=torch.distributed.get_global_rank(group, 0), group=group)
        if isinstance(found[0], Exception):
            raise found[0]
        sampled, self.skipped_groups, self.refilled_groups, self.sampling_seconds = found[0]
        return sampled

    def _spread(self, sampled: Sampled, start: int) -> float | None:
        """How far apart the rewards of the group at `start` are; None for a group not trained on (a padding
        sample's, one dropped by on_reward_error: skip, or one no reward scored)."""
        rewards = sampled.rewards[start : start + self.group]
        if sampled.prompts[start] is None or not sampled.kept[start] or rewards.isnan().all():
            return None
        present = rewards[~rewards.isnan()]
        return 0.0 if (present.max() - present.min()).abs() < 1e-9 else float(present.max() - present.min())

    def _anywhere(self, count: int) -> bool:
        """Whether any data-parallel rank has `count` > 0 (each asks with its own)."""
        flag = torch.tensor([float(count)], device=self.run.fabric.device)
        if self.run.token_mesh is not None:
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self.run.token_mesh.get_group())
        return flag.item() > 0

    def _stream(self, index: int | str, place: int) -> torch.Generator:
        """The sampling stream of completion `place` of prompt `index` in this rollout."""
        return torch.Generator(device=self.run.fabric.device).manual_seed(self._seed(f"{index}/{place}"))

    def _seed(self, name: str) -> int:
        """A seed for `name` in this rollout, from the run's seed and the rollout's number."""
        key = f"{self.seed}/{self.tag}/{name}".encode()
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & (2**63 - 1)

    def _sample(
        self, rows: list[Prompt | None], streams: list[torch.Generator]
    ) -> tuple[list[Completion], list[list[float]]]:
        """Every row's completion and its tokens' entropies, the model in eval mode without gradients (dropout off,
        as TRL samples); the time it took adds to `sampling_seconds`."""
        started = time.perf_counter()
        run, tokenizer, stops = self.run, self.tokenizer, self.grpo.stop
        prompts = [row.tokens if row is not None else [tokenizer.eod_id] for row in rows]

        def stopped(row: int, tokens: list[int]) -> bool:
            text = tokenizer.decode(tokens)
            return any(stop in text for stop in stops)

        lockstep = None
        if run.dims.dp > 1 and self.whole is None:  # as many forwards on every data-parallel rank (ZeRO-3 gathers)
            group = run.mesh.get("dp_cp").get_group()

            def lockstep(more: bool) -> bool:
                flag = torch.tensor([float(more)], device=run.fabric.device)
                torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=group)
                return bool(flag.item())

        entropies: list[list[float]] = []
        model = self.policy
        with reference_mode(model, lora=False), run.executor.autocast():
            completions = generate(
                lambda ids, positions, cache: decoding_logits(model, ids, positions, cache),
                lambda: decoding_cache(model),
                prompts,
                maximum_tokens=self.grpo.max_new_tokens,
                context=run.plan.seq_length,
                end_id=tokenizer.eod_id,
                vocab_size=tokenizer.vocab_size,
                sampling=self.sampling,
                generator=streams,
                device=run.fabric.device,
                stop=stopped if stops else None,
                entropies=entropies,
                lockstep=lockstep,
            )
        self.sampling_seconds += time.perf_counter() - started
        return completions, entropies

    def _score(
        self, rows: list[Prompt | None], completions: list[Completion], entropies: list[list[float]], *, training: bool
    ) -> Sampled:
        """Each reward's scores of the real rows (NaN on padding rows), their weighted sum, and which groups stay.
        A reward that fails stops the run naming the first record of the first group it fails on, or (skip) drops
        the groups it fails on (counted when `training`)."""
        count, functions = len(rows), len(self.rewards)
        per_function = torch.full((count, functions), math.nan, dtype=torch.float64)
        kept = torch.tensor([row is not None for row in rows], dtype=torch.float64)
        real = [index for index, row in enumerate(rows) if row is not None]
        texts = [self.tokenizer.decode(c.tokens) if row else "" for row, c in zip(rows, completions, strict=True)]
        for column, reward in enumerate(self.rewards):  # each reward sees the texts decoded once
            try:
                scores = self._call(reward, rows, completions, texts, real)
                per_function[real, column] = torch.tensor(scores, dtype=torch.float64)
            except RewardError as error:
                failures = self._score_by_group(reward, column, rows, completions, texts, per_function, kept)
                if self.grpo.on_reward_error == "stop":
                    raise RolloutError(str(failures[0] if failures else error)) from None
                if training:
                    self.skipped_groups += len(failures)
        weights = [reward.weight for reward in self.rewards]
        return Sampled(rows, completions, weighted_rewards(per_function, weights), per_function, kept, entropies)

    def _score_by_group(
        self,
        reward: Reward,
        column: int,
        rows: list[Prompt | None],
        completions: list[Completion],
        texts: list[str],
        per_function: torch.Tensor,
        kept: torch.Tensor,
    ) -> list[RewardError]:
        """The reward again, group by group: a group it fails on is dropped (`kept` 0); the failures, in order."""
        failures = []
        for start in range(0, len(rows), self.group):
            group = range(start, start + self.group)
            if rows[start] is None or not kept[start]:
                continue
            try:
                scores = self._call(reward, rows, completions, texts, group)
                per_function[start : start + self.group, column] = torch.tensor(scores, dtype=torch.float64)
            except RewardError as error:
                kept[start : start + self.group] = 0.0
                failures.append(error)
        return failures

    def _call(
        self,
        reward: Reward,
        rows: list[Prompt | None],
        completions: list[Completion],
        texts: list[str],
        chosen: Sequence[int],
    ) -> list[float]:
        """`reward` over the `chosen` rows, as TRL calls a reward function (module docstring of nxd_align.rewards)."""
        rows, completions, texts = (
            [rows[i] for i in chosen],
            [completions[i] for i in chosen],
            [texts[i] for i in chosen],
        )
        shown = [
            text if isinstance(row.text, str) else [{"role": "assistant", "content": text}]
            for row, text in zip(rows, texts, strict=True)
        ]
        fields: dict[str, list[Any]] = {}
        for name in {name for row in rows for name in row.record if name != self.grpo.prompt_field}:
            fields[name] = [row.record.get(name) for row in rows]
        return checked(
            reward,
            len(rows),
            lambda function: function(
                prompts=[row.text for row in rows],
                completions=shown,
                completion_ids=[c.tokens for c in completions],
                prompt_ids=[row.tokens for row in rows],
                **fields,
            ),
            [row.place for row in rows],
        )

    def _batch_std(self, rewards: torch.Tensor) -> torch.Tensor:
        """The standard deviation of the global batch's rewards (every data-parallel rank's), NaN left out."""
        present = ~rewards.isnan()
        values = rewards.nan_to_num(0.0)
        moments = torch.stack([present.sum().double(), values.sum(), values.square().sum()])
        moments = self.run.summed(moments.to(self.run.fabric.device), self.run.token_mesh).cpu()
        count, total, squares = moments.tolist()
        return torch.tensor(mean_std(total, squares, count)[1] if count >= 2 else math.nan, dtype=torch.float64)

    def _lay_out(self, sampled: Sampled, advantages: torch.Tensor, rows: slice) -> dict[str, torch.Tensor]:
        """The micro-batch of `rows`: each prompt + its completion (+ end-of-document when it ended), trained on the
        completion's tokens; packed as documents of rows where the layout allows it (nxd-data's `completion_rows`),
        else one a row, padded to the longest (in the multiple the layout needs)."""
        run, eod = self.run, self.tokenizer.eod_id
        sequences, labels = [], []
        for prompt, completion, kept in zip(
            sampled.prompts[rows], sampled.completions[rows], sampled.kept[rows].tolist(), strict=True
        ):
            tokens = [eod] if prompt is None else list(prompt.tokens)
            answer = [*completion.tokens, *([eod] if completion.finished else [])]
            truncated = not completion.finished and not completion.stopped
            trained = (
                prompt is not None and kept and answer and not (truncated and self.grpo.mask_truncated_completions)
            )
            sequences.append([*tokens, *answer])
            labels.append([IGNORE_INDEX] * (len(tokens) - 1) + (answer if trained else [IGNORE_INDEX] * len(answer)))
            labels[-1].append(IGNORE_INDEX)  # the last token predicts nothing
        width = run.plan.seq_length
        if (multiple := run.trim_to) is not None:
            width = min(-(-max(map(len, sequences)) // multiple) * multiple, width)
        laid_out = completion_rows(sequences, labels, width=width, pad_id=eod, packed=self.packed)
        laid_out[ADVANTAGE_KEY] = advantages[rows].float()
        return {key: value.to(run.fabric.device) for key, value in laid_out.items()}

    def _attach_log_probs(self, batches: list[Batch], key: str, model: Any, executor: Any, *, lora: bool) -> None:
        """Each row's per-token log-probs under `model` (the policy at sampling time, or the reference) as `key`."""

        def capture(token_losses: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            batch[key] = (-token_losses).detach().float()
            return token_losses.new_zeros((), dtype=torch.float64), {}

        with reference_mode(model, lora):
            executor.run(batches, capture, training=False)

    def _summarise(self, sampled: Sampled, advantages: torch.Tensor, generated: float, took: float) -> None:
        """The step's rollout metrics over every data-parallel rank (TRL's names), and a few samples kept."""
        run = self.run
        real = torch.tensor([p is not None for p in sampled.prompts])
        entropies = [
            value for prompt, row in zip(sampled.prompts, sampled.entropies, strict=True) if prompt for value in row
        ]
        lengths = torch.tensor([float(len(c.tokens) + c.finished) for c in sampled.completions])[real]
        truncated = torch.tensor([float(not c.finished and not c.stopped) for c in sampled.completions])[real]
        rewards = sampled.rewards[real]
        groups = rewards.view(-1, self.group) if len(rewards) else rewards.view(0, self.group)
        sums = {
            "completions": float(len(lengths)),
            "scored": float((~rewards.isnan()).sum()),
            "groups": float(len(groups)),
            "reward": float(rewards.nansum()),
            "reward_squares": float(rewards.nan_to_num(0.0).square().sum()),
            "advantage_squares": float(advantages[real].double().square().sum()),
            "length": float(lengths.sum()),
            "truncated": float(truncated.sum()),
            "zero_std": float((nan_std(groups, dim=1).nan_to_num(0.0) < 1e-6).sum()),
            "entropy": float(sum(entropies)),
            "entropy_tokens": float(len(entropies)),
            "generation_seconds": generated,
            "step_rollout_seconds": took,
            "skipped_groups": float(self.skipped_groups),
            "refilled_groups": float(self.refilled_groups),
        }
        for column, reward in enumerate(self.rewards):
            scores = sampled.per_function[real, column]
            sums[f"rewards/{reward.name}/sum"] = float(scores.nansum())
            sums[f"rewards/{reward.name}/squares"] = float(scores.nan_to_num(0.0).square().sum())
            sums[f"rewards/{reward.name}/count"] = float((~scores.isnan()).sum())
        names = list(sums)
        device = run.fabric.device
        totals = run.summed(torch.tensor([sums[n] for n in names], dtype=torch.float64, device=device), run.token_mesh)
        shortest = float(lengths.min()) if len(lengths) else math.inf
        longest = float(lengths.max()) if len(lengths) else -math.inf
        extremes = torch.tensor([shortest, -longest], dtype=torch.float64, device=device)
        if run.token_mesh is not None:
            torch.distributed.all_reduce(extremes, op=torch.distributed.ReduceOp.MIN, group=run.token_mesh.get_group())
        total = dict(zip(names, totals.tolist(), strict=True))
        self.metrics = rollout_metrics(total, extremes.tolist(), self.rewards, run.dims.dp)
        self.samples = [
            {
                "prompt": prompt.text,
                "completion": self.tokenizer.decode(completion.tokens),
                "reward": None if math.isnan(reward) else reward,
            }
            for prompt, completion, reward in zip(
                sampled.prompts, sampled.completions, sampled.rewards.tolist(), strict=True
            )
            if prompt is not None
        ][: self.grpo.log_completions]
