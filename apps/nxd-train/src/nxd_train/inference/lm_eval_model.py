"""lm-eval's model interface over a loaded nxd run.

`NxdLM` is an lm-eval `TemplateLM`, so lm-eval splits contexts and continuations, builds rolling windows and
prompts exactly as for its own Hugging Face model (`HFLM`); nxd scores them (`loglikelihood`,
`loglikelihood_rolling`) in batches of similar length, cut to the context from the left as HFLM cuts them, and
generates (`generate_until`) with nxd-models' generation and its key/value cache.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from nxd_models.decoding import whole_logits
from nxd_models.generation import Sampling, generate

from nxd_train.inference.loading import LoadedRun


class NxdLM(TemplateLM):
    """lm-eval's view of a loaded nxd run."""

    def __init__(self, run: LoadedRun, batch_size: int = 8, seed: int = 1234):
        super().__init__()
        self.run, self.batch_size = run, batch_size
        self.generator = torch.Generator(device=run.fabric.device).manual_seed(seed)
        """Draws of sampled generate_until requests (lm-eval's do_sample), seeded by the run's seed."""

    @property
    def eot_token_id(self) -> int:
        return self.run.tokenizer.eod_id

    @property
    def prefix_token_id(self) -> int:
        return self.run.tokenizer.begin_id

    @property
    def max_length(self) -> int:
        return self.run.context

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.run.tokenizer.encode([string])[0]

    def tok_decode(self, tokens: list[int]) -> str:
        return self.run.tokenizer.decode(tokens)

    def _loglikelihood_tokens(
        self,
        requests: list[tuple[Any, list[int], list[int]]],
        disable_tqdm: bool = False,
        override_bs: int | None = None,
    ) -> list[tuple[float, bool]]:
        """Sum of the continuation's log-probabilities and whether greedy decoding gives it, per request; the
        whole input cut to the model's context from the left, as HFLM cuts it; longest first, in batches."""
        size = override_bs or self.batch_size
        if (longest := max((len(continuation) for _, _, continuation in requests), default=0)) > self.max_length:
            raise ValueError(
                f"a continuation of {longest} tokens is longer than the model's context of {self.max_length} positions"
            )
        inputs = [(context + continuation)[-(self.max_length + 1) :][:-1] for _, context, continuation in requests]
        order = sorted(range(len(requests)), key=lambda i: -len(inputs[i]))
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        for start in range(0, len(order), size):
            batch = order[start : start + size]
            width = len(inputs[batch[0]])
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            for row, index in enumerate(batch):
                ids[row, : len(inputs[index])] = torch.tensor(inputs[index])
            positions = torch.arange(width).expand(len(batch), -1)
            logits = self.run.logits(ids, positions, None)
            logits = whole_logits(logits)
            if logits.shape[-1] != self.run.vocab_size:  # the output layer's padding rows
                logits = logits[..., : self.run.vocab_size]
            log_probs = torch.log_softmax(logits.float(), dim=-1).cpu()
            for row, index in enumerate(batch):
                continuation, length = requests[index][2], len(inputs[index])
                span = log_probs[row, length - len(continuation) : length]
                target = torch.tensor(continuation)
                greedy = bool((span.argmax(dim=-1) == target).all())
                results[index] = (float(span.gather(1, target[:, None]).sum()), greedy)
        return results  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Each string's log-likelihood over disjoint windows of the context (lm-eval's own windows), the windows
        of every request scored together."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        windows, owners = [], []
        for number, request in enumerate(requests):
            for window in get_rolling_token_windows(
                token_list=self.tok_encode(request.args[0]),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            ):
                windows.append((None, *make_disjoint_window(window)))
                owners.append(number)
        totals = [0.0] * len(requests)
        for owner, (score, _) in zip(owners, self._loglikelihood_tokens(windows), strict=True):
            totals[owner] += score
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Each context continued until one of its stop strings (or the end-of-document token, or max_gen_toks);
        requests with the same generation settings run batch_size at a time, longest context first."""
        texts: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for number, request in enumerate(requests):
            groups.setdefault(repr(sorted((request.args[1] or {}).items())), []).append(number)
        for numbers in groups.values():
            options = dict(requests[numbers[0]].args[1] or {})
            until = options.pop("until", None) or []
            until = [stop for stop in ([until] if isinstance(until, str) else until) if stop]
            tokens = int(options.pop("max_gen_toks", 256))
            do_sample = bool(options.get("do_sample", False))
            temperature = float(options.get("temperature", 1.0 if do_sample else 0.0))
            sampling = (
                Sampling()
                if not do_sample or temperature == 0
                else Sampling(temperature, int(options.get("top_k") or 0), float(options.get("top_p") or 0.0))
            )
            room = max(1, self.max_length - tokens)  # as HFLM: the context keeps room for max_gen_toks
            contexts = {n: self.tok_encode(requests[n].args[0])[-room:] or [self.prefix_token_id] for n in numbers}
            order = sorted(numbers, key=lambda n: -len(contexts[n]))
            stopped = partial(self._stopped, until)
            for start in range(0, len(order), self.batch_size):
                batch = order[start : start + self.batch_size]
                completions = generate(
                    self.run.logits,
                    self.run.new_cache,
                    [contexts[n] for n in batch],
                    maximum_tokens=tokens,
                    context=self.max_length,
                    end_id=self.eot_token_id,
                    vocab_size=self.run.vocab_size,
                    sampling=sampling,
                    generator=self.generator,
                    device=self.run.fabric.device,
                    stop=stopped if until else None,
                )
                for number, completion in zip(batch, completions, strict=True):
                    text = self.tok_decode(completion.tokens)
                    for stop in until:
                        text = text.split(stop)[0]
                    texts[number] = text
        return texts  # type: ignore[return-value]

    def _stopped(self, until: list[str], row: int, generated: list[int]) -> bool:
        """Whether a stop string appeared in a row's text (lm-eval's until)."""
        text = self.tok_decode(generated)
        return any(stop in text for stop in until)
