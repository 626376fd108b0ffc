"""Prompt turns to model input ids, the way the benchmark protocol prompts the target.

The protocol renders the conversation with the tokenizer's chat template,
``apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False)``, and decodes
from the end of the generation prompt. Multi-turn prompts (MT-Bench) ask turn k after the
model's own replies to turns 1..k-1, so those replies are an input here, not part of the dataset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# How turns are joined for a tokenizer that has no chat template (a base model).
PLAIN_TURN_SEPARATOR = "\n\n"


def chat_messages(user: str, history: Sequence[tuple[str, str]] = ()) -> list[dict[str, str]]:
    """The chat messages for one turn: earlier (user, assistant) pairs, then the new user turn.

    >>> chat_messages("And 3 + 3?", history=[("2 + 2?", "4")])[1]
    {'role': 'assistant', 'content': '4'}
    """
    messages = []
    for pair in history:
        if len(pair) != 2:
            raise ValueError(f"history holds (user, assistant) pairs, got {pair!r}")
        messages.append({"role": "user", "content": pair[0]})
        messages.append({"role": "assistant", "content": pair[1]})
    messages.append({"role": "user", "content": user})
    return messages


def encode_turn(
    tokenizer: "PreTrainedTokenizerBase",
    user: str,
    history: Sequence[tuple[str, str]] = (),
    *,
    enable_thinking: bool = False,
) -> list[int]:
    """Token ids [T] of the prompt for one user turn, ending where the model starts to answer.

    With a chat template: the template's text for ``history`` plus ``user`` with the generation
    prompt appended (``enable_thinking`` goes to templates that read it, as Qwen3's does; others
    ignore it), encoded without adding special tokens, since the template writes any BOS itself.
    For Qwen3 these are the ids the papers' harness feeds (its extra ``encode`` special tokens
    are none for Qwen3).

    Without a chat template (base-model tokenizers): the earlier user and assistant texts and
    ``user`` joined with blank lines, encoded with the tokenizer's special tokens (e.g. BOS).
    There is no generation prompt then, and the model continues the text.

    Args:
        tokenizer: a Hugging Face tokenizer.
        user: the user turn, e.g. ``prompt.turns[k]``.
        history: (user, assistant) pairs of the earlier turns, e.g. MT-Bench's turn 1 and the
            model's reply to it when encoding turn 2.
        enable_thinking: the protocol decodes with thinking off.

    Example:
        >>> first = encode_turn(tokenizer, prompt.turns[0])                      # doctest: +SKIP
        >>> reply = tokenizer.decode(new_ids, skip_special_tokens=True)         # doctest: +SKIP
        >>> second = encode_turn(tokenizer, prompt.turns[1], [(prompt.turns[0], reply)])  # doctest: +SKIP
    """
    messages = chat_messages(user, history)
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=enable_thinking,
        )
        return list(tokenizer.encode(text, add_special_tokens=False))
    text = PLAIN_TURN_SEPARATOR.join(message["content"] for message in messages)
    return list(tokenizer.encode(text, add_special_tokens=True))
