"""The four pluggable parts of the loop, and the target they drive.

A strategy is a choice of one implementation per Protocol (see ``configs/``); the engine in
``ddtree.engine`` never asks which strategy it runs.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch
from torch import Tensor

from ddtree.types import Draft, TargetOutput, Tree, Verification, VerifyInputs


@runtime_checkable
class Drafter(Protocol):
    """Proposes per-depth distributions for the tokens after the bonus token."""

    # Target hidden taps the drafter conditions on (see ddtree.types.FINAL_NORM); may be empty.
    hidden_layers: Sequence[int]

    def reset(self, prompt: TargetOutput) -> None:
        """Start a new sequence: the draft prefill over the prompt's taps."""

    def draft(self, root_token: int) -> Draft:
        """Distributions for depths 1..L below ``root_token``, given everything accepted."""

    def accept(self, verification: Verification, context: TargetOutput) -> None:
        """Keep the accepted path; ``context`` holds the verify's rows for every tree node."""


@runtime_checkable
class TreeBuilder(Protocol):
    def build(self, draft: Draft, root_token: int) -> Tree:
        """A pure function of the draft: which continuations to verify."""


@runtime_checkable
class MaskCompiler(Protocol):
    def to(self, device: torch.device, dtype: torch.dtype) -> "MaskCompiler":
        """Build masks on this device and dtype (where the target's first layer reads them)."""

    def compile(self, tree: Tree, past_length: int) -> VerifyInputs:
        """Token ids, positions ``past_length + depth`` and the ancestor-only attention mask."""


@runtime_checkable
class Verifier(Protocol):
    def verify(self, tree: Tree, logits: Tensor, generator: torch.Generator | None) -> Verification:
        """Walk the tree with the target's own decoding rule; ``logits`` is ``[n, vocab]``."""


@runtime_checkable
class Target(Protocol):
    """A causal LM seen as prefill, tree forward and commit (``ddtree.models``)."""

    vocab_size: int
    max_length: int  # context length the model supports
    past_length: int  # committed tokens in the cache
    dtype: torch.dtype
    input_device: torch.device  # where token ids and masks go in
    output_device: torch.device  # where logits come out

    def set_taps(self, layers: Sequence[int]) -> None: ...

    def prefill(self, input_ids: Tensor) -> TargetOutput: ...  # [T] -> logits of the last row

    def forward_tree(self, inputs: VerifyInputs) -> TargetOutput: ...  # logits [n, vocab]

    def commit(self, path: Sequence[int]) -> None: ...  # keep prefix + the accepted nodes
