"""Drafter training, and the small trained model pair the repository ships.

Training only: decoding a pair and measuring it are the presets' and ``eval/``'s work, and the
pipeline that builds the shipped pair from these parts is ``experiments/pair_pipeline.py``.

    corpus      the stdlib code corpus with its fixed held-out modules
    tokenizer   byte-level BPE with <|endoftext|>, <|pad|>, <|mask|>
    lm          the small Qwen3 target, trained from scratch
    sequences   prompts continued by the target itself (the drafters' data)
    features    target taps for training, captured as the decoding side captures them
    dflash      DFlash drafter training (the paper's recipe)
    mtp         MTP head training (next-next-token loss, chained steps)
    loop        AdamW, warmup + cosine, grad clip, step/time budgets
    pair        the pair directory: save, load, model card

    >>> from ddtree.training import Budget, DFlashTrainConfig, new_dflash, train_dflash
    >>> drafter = new_dflash(target_model, mask_token_id=2)                          # doctest: +SKIP
    >>> train_dflash(drafter, target_model, data, DFlashTrainConfig(), Budget(max_steps=1000))  # doctest: +SKIP
"""

from ddtree.training.dflash import DFlashTrainConfig, new_dflash, train_dflash
from ddtree.training.loop import Budget, OptimConfig, train_loop
from ddtree.training.mtp import MTPTrainConfig, train_mtp
from ddtree.training.pair import Pair, load_pair, save_pair
from ddtree.training.sequences import SequenceSet, regenerate

__all__ = [
    "Budget",
    "DFlashTrainConfig",
    "MTPTrainConfig",
    "OptimConfig",
    "Pair",
    "SequenceSet",
    "load_pair",
    "new_dflash",
    "regenerate",
    "save_pair",
    "train_dflash",
    "train_loop",
    "train_mtp",
]
