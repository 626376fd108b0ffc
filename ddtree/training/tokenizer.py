"""A byte-level BPE tokenizer for the small target, trained with the ``tokenizers`` library.

Special tokens take the first ids: ``<|endoftext|>`` (eos, also the document separator),
``<|pad|>`` and ``<|mask|>`` (the DFlash drafter's mask token; its embedding row is trained
with the target as an ordinary, never-seen row, as Qwen3's unused rows are). Byte-level BPE
encodes any text, so held-out code never meets an unknown token.

    >>> tok = train_tokenizer(["def f(x):\\n    return x\\n"] * 20, vocab_size=300)
    >>> tok.mask_token_id, tok.eos_token_id
    (2, 0)
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS, PAD, MASK = "<|endoftext|>", "<|pad|>", "<|mask|>"
SPECIAL_TOKENS = (EOS, PAD, MASK)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8192) -> PreTrainedTokenizerFast:
    """Train byte-level BPE on ``texts``; specials get ids 0, 1, 2 (eos, pad, mask)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return wrap(tok)


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """The ``transformers`` face of a raw tokenizer (no BOS; eos ends documents)."""
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, mask_token=MASK)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer directory written by ``save_pretrained`` (reads ``tokenizer.json``).

    Built from the raw file rather than ``AutoTokenizer`` so the same directory loads under
    every transformers 5.x release, whatever class name its ``tokenizer_config.json`` records.
    """
    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        raise FileNotFoundError(f"{path} has no tokenizer.json (train one with experiments/build_corpus.py)")
    return wrap(Tokenizer.from_file(str(file)))


def encode_documents(tok: PreTrainedTokenizerFast, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, each followed by eos (batched through the Rust tokenizer)."""
    raw: Tokenizer = tok.backend_tokenizer
    eos = tok.eos_token_id
    return [enc.ids + [eos] for enc in raw.encode_batch(texts, add_special_tokens=False)]
