"""Text generation with either model family: greedy or sampled continuations of token prompts.

Prompts of one batch share positions, as GPT-NeoX's generate.py runs them: rows are filled from the shortest
prompt's end, a row still inside its own prompt takes its prompt's next token instead of the model's choice,
so no padding enters any attention and greedy rows get the tokens they would get alone (sampled rows draw
from one generator, so a batch's samples depend on its rows). A row that has ended leaves the batch, and its
rows of the cache with it (the cache's `reorder_cache(rows)`, transformers' own method, which nxd's `KVCache`
has too): the forwards run over the rows still generating only. Choices follow NeoX:
greedy where temperature, top_k and top_p are all 0, otherwise the logits in float32 divided by the
temperature, filtered to the top k and the top-p nucleus (transformers' own logits warpers), and sampled
from a seeded generator, so a seed repeats its samples. A row ends at the end-of-document token (not part
of its text) or after `maximum_tokens`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .decoding import whole_logits
from .errors import ModelConfigError

if TYPE_CHECKING:
    from transformers import LogitsProcessorList

StepLogits = Callable[[torch.Tensor, torch.Tensor, object | None], torch.Tensor]
"""(input_ids, position_ids, cache or None) -> logits (batch, seq, vocab): one forward of a model family."""


@dataclass(frozen=True)
class Sampling:
    """How a next token is chosen (GPT-NeoX's generation keys)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 and self.top_k == 0 and self.top_p == 0

    def warpers(self) -> LogitsProcessorList:
        """transformers' warpers for this choice, in NeoX's order: temperature, then top-k, then top-p."""
        try:
            from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
        except ImportError:
            raise ModelConfigError(
                "sampled generation (temperature, top_k or top_p) uses transformers' logits "
                "warpers, and transformers is not installed; install nxd-models[hf]"
            ) from None

        warpers = LogitsProcessorList()
        if self.temperature > 0 and self.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(self.temperature))
        if self.top_k > 0:
            warpers.append(TopKLogitsWarper(self.top_k))
        if 0 < self.top_p < 1:
            warpers.append(TopPLogitsWarper(self.top_p))
        return warpers


@dataclass
class Completion:
    """One prompt's continuation."""

    tokens: list[int]
    """The generated tokens (the end-of-document token that ended it is not one of them)."""
    finished: bool
    """It ended at the end-of-document token (not at maximum_tokens or the context's end)."""
    logits: list[list[float]] | None = None
    """With return_logits: the logits each chosen token was drawn from (after temperature and filtering; the
    end-of-document token that ended the row included)."""
    stopped: bool = False
    """`stop` ended it (a stop sequence appeared)."""


def generate(
    step: StepLogits,
    new_cache: Callable[[], object] | None,
    prompts: Sequence[Sequence[int]],
    *,
    maximum_tokens: int,
    context: int,
    end_id: int,
    vocab_size: int,
    sampling: Sampling = Sampling(),
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    return_logits: bool = False,
    device: torch.device | str = "cpu",
    stop: Callable[[int, list[int]], bool] | None = None,
    entropies: list[list[float]] | None = None,
    lockstep: Callable[[bool], bool] | None = None,
) -> list[Completion]:
    """Continue each of `prompts` (token ids, none empty) by up to `maximum_tokens` tokens within `context`
    positions, one forward per position: over the new tokens with a key/value cache from `new_cache`, over the
    whole prefix when it is None (recompute). Logits beyond `vocab_size` (padding rows) are never chosen.
    `stop(row, tokens)`, when given, ends a row once it says so of the row's tokens so far (stop sequences).
    `generator` may be one generator a row, so that a row's samples depend on its own stream only (online RL
    samples the same completions of a prompt whatever else is in the batch): each row draws a uniform number for
    each token it may choose, up front, and takes the token where its cumulative probability passes the number
    (inverse-CDF sampling, one vectorised choice a position for the whole batch). `entropies`, when given, receives
    one list a row: the entropy of each of its chosen tokens' distributions (the logits divided by the
    temperature, before top-k and top-p). `lockstep(more)`, when given, tells whether any of the processes that generate
    together has more to do: this one runs a forward without effect until none has, so processes whose model
    gathers its weights in each forward (ZeRO-3) run the same number of forwards."""
    if not prompts:
        return []
    lengths = [len(prompt) for prompt in prompts]
    if min(lengths) == 0:
        raise ModelConfigError(
            "generation: expected a prompt of at least one token (an empty prompt starts "
            "from the end-of-document token), found an empty one"
        )
    if max(lengths) >= context:
        raise ModelConfigError(
            f"generation: a prompt of {max(lengths)} tokens leaves no room in the model's context "
            f"of {context} positions; expected at most {context - 1} tokens"
        )
    rows, width = len(prompts), min(context, max(lengths) + maximum_tokens)
    tokens = torch.full((rows, width), end_id, dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        tokens[row, : len(prompt)] = torch.tensor(list(prompt), dtype=torch.long)
    completions = [Completion([], False, [] if return_logits else None) for _ in prompts]
    warpers = None if sampling.greedy else sampling.warpers()
    cache = new_cache() if new_cache is not None else None
    fed, position = 0, min(lengths)
    drawn: list[list[float]] = [[] for _ in prompts]
    live = list(range(rows)) if maximum_tokens > 0 else []
    """The rows still in the batch, by their place in `prompts` (the batch's row i is prompt live[i])."""
    uniforms = None
    if warpers is not None and isinstance(generator, Sequence):  # each row's draws, one per token it may choose
        draws = max(maximum_tokens, 1)
        uniforms = torch.stack([torch.rand(draws, generator=g, dtype=torch.float64, device=device) for g in generator])
    while True:
        more = position < width and bool(live)
        if lockstep is not None and lockstep(more) and not more:
            step(tokens[:1, :1], torch.zeros((1, 1), dtype=torch.long, device=device), None)  # its part of theirs
            continue
        if not more:
            break
        start = fed if cache is not None else 0
        batch = tokens[live] if len(live) < rows else tokens
        positions = torch.arange(start, position, device=device).expand(len(live), -1)
        logits = whole_logits(step(batch[:, start:position], positions, cache))[:, -1, :vocab_size].float()
        fed = position
        if entropies is not None:
            tempered = torch.log_softmax(logits / (sampling.temperature or 1.0), dim=-1)
            entropy = (-(tempered.exp() * tempered).sum(-1)).tolist()
        if warpers is not None:
            logits = warpers(batch[:, :position], logits)
            probabilities = torch.softmax(logits, dim=-1)
            if uniforms is not None:  # a stream a row: its k-th token from its k-th draw, by the inverse CDF
                drawn_at = torch.tensor([len(completions[row].tokens) for row in live], device=device)
                chosen = _inverse_cdf(probabilities, uniforms[live, drawn_at.clamp(max=draws - 1)])
            else:
                chosen = torch.multinomial(probabilities, 1, generator=generator).view(-1)
        else:
            chosen = logits.argmax(dim=-1)
        for place, (row, token) in enumerate(zip(live, chosen.tolist(), strict=True)):
            if position < lengths[row]:
                continue
            completion = completions[row]
            tokens[row, position] = token
            if entropies is not None:
                drawn[row].append(entropy[place])
            if completion.logits is not None:
                completion.logits.append(logits[place].tolist())
            if token == end_id:
                completion.finished = True
            else:
                completion.tokens.append(token)
                completion.stopped = stop is not None and stop(row, completion.tokens)
        position += 1
        staying = [place for place, row in enumerate(live) if not _ended(completions[row], maximum_tokens)]
        if len(staying) < len(live):
            if cache is not None and staying:
                cache.reorder_cache(torch.tensor(staying, dtype=torch.long, device=device))
            live = [live[place] for place in staying]
    if entropies is not None:
        entropies.extend(drawn)
    return completions


def _inverse_cdf(probabilities: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the first token whose cumulative probability exceeds its uniform draw (scaled by the row's total, so
    rounding never runs past the vocabulary); a token of zero probability is never chosen."""
    cumulative = probabilities.double().cumsum(-1)
    chosen = torch.searchsorted(cumulative, (uniforms * cumulative[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    chosen = chosen.clamp(max=probabilities.shape[-1] - 1)
    possible = probabilities.gather(-1, chosen.unsqueeze(-1)).squeeze(-1) > 0
    return torch.where(possible, chosen, probabilities.argmax(-1))


def _ended(completion: Completion, maximum_tokens: int) -> bool:
    return completion.finished or completion.stopped or len(completion.tokens) >= maximum_tokens
