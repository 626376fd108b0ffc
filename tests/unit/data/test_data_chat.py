"""Turns to input ids with a tiny in-process tokenizer (a word-level vocabulary, no downloads)."""

from __future__ import annotations

import pytest

from ddtree.data import chat_messages, encode_turn

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

WORDS = ["<unk>", "<bos>", "<eos>", "<user>", "<assistant>", "<end>", "<nothink>",
         "hi", "there", "what", "is", "two", "plus", "four"]
VOCAB = {word: i for i, word in enumerate(WORDS)}

# A Qwen3-like template in miniature: the generation prompt, and a marker when thinking is off.
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} <end> {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% if not enable_thinking %}<nothink> {% endif %}{% endif %}"
)


def make_tokenizer(chat_template: str | None) -> "transformers.PreTrainedTokenizerFast":
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel(VOCAB, unk_token="<unk>"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    # Plain encoding adds a BOS, as base-model tokenizers do.
    core.post_processor = tokenizers.processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", VOCAB["<bos>"])]
    )
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    tok.chat_template = chat_template
    return tok


def ids(text: str) -> list[int]:
    return [VOCAB[word] for word in text.split()]


def test_first_turn_uses_the_chat_template_with_thinking_off() -> None:
    tok = make_tokenizer(TEMPLATE)
    # No BOS from encode: the template writes the whole prompt itself.
    expected = ids("<user> what is two plus two <end> <assistant> <nothink>")
    assert encode_turn(tok, "what is two plus two") == expected
    assert encode_turn(tok, "hi", enable_thinking=True) == ids("<user> hi <end> <assistant>")


def test_second_turn_conditions_on_the_first_reply() -> None:
    tok = make_tokenizer(TEMPLATE)
    got = encode_turn(tok, "what is two plus two", history=[("hi", "hi there")])
    assert got == ids(
        "<user> hi <end> <assistant> hi there <end> <user> what is two plus two <end> <assistant> <nothink>"
    )


def test_tokenizer_without_chat_template_encodes_plain_text() -> None:
    tok = make_tokenizer(None)
    assert encode_turn(tok, "what is four") == ids("<bos> what is four")
    assert encode_turn(tok, "what is four", history=[("hi", "there")]) == ids("<bos> hi there what is four")


def test_chat_messages_and_bad_history() -> None:
    assert chat_messages("what", history=[("hi", "there")]) == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "there"},
        {"role": "user", "content": "what"},
    ]
    with pytest.raises(ValueError, match="pairs"):
        chat_messages("what", history=[("hi",)])  # type: ignore[list-item]
