"""Conversations (`messages`: role/content lists) rendered with a tokenizer's chat template, and which
characters of the rendering are the assistant's turns (where the SFT loss is taken).

Rendering uses transformers' own chat-template machinery (`apply_chat_template`; install
`nxd-data[chat]`). The assistant spans come from rendering growing prefixes of the conversation: the
text before assistant turn i (with the generation prompt) and the text through it. A template must
render a conversation's prefix as a prefix of the whole (every common template does); one that does
not is refused rather than masked wrongly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer

from .errors import DataError
from .tokenizer import TextTokenizer

ROLES = ("system", "user", "assistant", "tool")


def message_problem(messages: Any, *, needs_assistant: bool = True) -> str | None:
    """Why `messages` is not a conversation nxd can train on (a prompt, without `needs_assistant`), or None."""
    if not isinstance(messages, list) or not messages:
        return f"expected messages to be a non-empty list of {{role, content}} objects, found {_shown(messages)}"
    for number, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            return f"messages[{number}]: expected an object with role and content, found {_shown(message)}"
        if message["role"] not in ROLES:
            return f"messages[{number}].role: expected one of {', '.join(ROLES)}, found {_shown(message['role'])}"
        if not isinstance(message["content"], str):
            return f"messages[{number}].content: expected a string, found {_shown(message['content'])}"
    if needs_assistant and not any(message["role"] == "assistant" for message in messages):
        return "messages: expected at least one assistant turn to learn from, found none"
    return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class ChatRenderer:
    """Renders conversations with `tokenizer`'s chat template."""

    def __init__(self, tokenizer: TextTokenizer):
        from transformers import PreTrainedTokenizerFast

        self.tokenizer = tokenizer
        self.renderer = PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer.from_str(tokenizer.tokenizer.to_str()),
            bos_token=tokenizer.token(tokenizer.begin_id),
            eos_token=tokenizer.token(tokenizer.eod_id),
        )
        self.renderer.chat_template = tokenizer.chat_template

    def render(self, messages: Sequence[dict[str, str]], generation_prompt: bool = False) -> str:
        return self.renderer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=generation_prompt
        )

    def assistant_spans(self, messages: Sequence[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the character spans of its assistant turns."""
        try:
            text = self.render(messages)
            spans = []
            for index, message in enumerate(messages):
                if message["role"] != "assistant":
                    continue
                before = self.render(messages[:index], generation_prompt=True) if index else ""
                through = self.render(messages[: index + 1])
                if not (text.startswith(through) and through.startswith(before)):
                    raise DataError(
                        "the chat template renders the conversation up to an assistant turn differently "
                        "from the start of the whole conversation, so its turns cannot be located"
                    )
                spans.append((len(before), len(through)))
        except DataError:
            raise
        except Exception as error:  # jinja raises its own types, templates raise what they like
            raise DataError(f"the chat template fails on this conversation: {error}") from None
        return text, spans

    def tokens(self, messages: Sequence[dict[str, str]]) -> tuple[list[int], list[bool]]:
        """The conversation's token ids and, per token, whether it belongs to an assistant turn."""
        text, spans = self.assistant_spans(messages)
        encoding = self.tokenizer.tokenizer.encode(text, add_special_tokens=False)
        trained = [
            any(start < end_span and end > start_span for start_span, end_span in spans)
            for start, end in encoding.offsets
        ]
        return encoding.ids, trained
