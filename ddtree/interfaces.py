"""The four pluggable parts of the loop, and the target they drive.

A strategy is a choice of one implementation per Protocol (see ``configs/``); the engine in
``ddtree.engine`` never asks which strategy it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

import torch
from torch import Tensor, nn

from ddtree.types import Draft, TargetOutput, Tree, Verification, VerifyInputs

if TYPE_CHECKING:  # only ddtree.models imports transformers
    from transformers import PretrainedConfig


@runtime_checkable
class Drafter(Protocol):
    """Proposes per-depth distributions for the tokens after the bonus token."""

    # Target hidden taps the drafter conditions on (see ddtree.types.FINAL_NORM); may be empty.
    hidden_layers: Sequence[int]

    def reset(self, prompt: TargetOutput) -> None:
        """Start a new sequence: the draft prefill over the prompt's taps.

        Optional: a drafter with ``prompt_sink()`` (returning a callable, or None) can take the
        prompt's taps chunk by chunk while the target prefills (``Target.prefill(..., taps_sink=)``),
        so the prompt's taps are never held whole; ``reset`` then gets the output without taps."""

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
    """Optionally also ``for_target(target) -> MaskCompiler``: the engine then keeps the compiler it
    returns for its target (``AutoMaskCompiler``: the tree block alone for the fast targets)."""

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
    """A causal LM seen as prefill, tree forward and commit (``ddtree.models``).

    Everything a part reads from a target is declared here: the engine drives the three calls
    and the bookkeeping above them; drafters borrow the embeddings and the LM head, check their
    shapes against ``config``/``layers``/``vocab_size``, and size their caches by ``max_length``;
    drafters built from the target's own weights (random test drafters, the oracle) read ``model``.
    """

    model: nn.Module  # the wrapped transformers model (batch 1, eval mode)
    config: PretrainedConfig  # its text config (hidden_size, num_hidden_layers, ...)
    layers: Sequence[nn.Module]  # the decoder layers; hidden tap i is the output of layers[i]
    vocab_size: int  # rows of the LM head: logits are [n, vocab_size]
    max_length: int  # context length the model supports
    past_length: int  # committed tokens in the cache
    dtype: torch.dtype  # of the input embeddings (masks are built in it)
    input_device: torch.device  # where token ids and masks go in
    output_device: torch.device  # where logits (and taps) come out

    def set_taps(self, layers: Sequence[int]) -> None: ...  # capture these layers on every forward

    def embed(self, token_ids: Tensor) -> Tensor: ...  # [..., t] -> [..., t, hidden], on the embedding's device

    def lm_head(self, hidden: Tensor) -> Tensor: ...  # [..., hidden] -> [..., vocab], on output_device

    def prefill(self, input_ids: Tensor) -> TargetOutput: ...  # [T] -> logits of the last row
    # Optional keyword ``taps_sink``: a callable given every prompt row's taps in order, in one or
    # more ``[c, n_taps * hidden]`` chunks, instead of the output's ``taps`` (then None).

    def forward_tree(self, inputs: VerifyInputs) -> TargetOutput: ...  # logits [n, vocab]

    def commit(self, path: Sequence[int]) -> None: ...  # keep prefix + the accepted nodes
