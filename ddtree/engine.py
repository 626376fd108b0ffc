"""The one decoding loop. AR, MTP, DFlash and DDTree are choices of its four parts.

    state: committed tokens, the bonus token b (sampled by the target, not yet fed to it),
           the target's cache and the drafter's own state.

    1. draft    Drafter.draft(b)                -> Draft    q_1..q_L              [L, vocab]
    2. tree     TreeBuilder.build(draft, b)     -> Tree     node 0 = b
    3. layout   MaskCompiler.compile(tree, len) -> VerifyInputs
    4. verify   Target.forward_tree + Verifier  -> accepted path, next bonus
    5. commit   keep only the accepted path in every cache
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
from torch import Tensor

from ddtree.interfaces import Drafter, MaskCompiler, Target, TreeBuilder, Verifier
from ddtree.metrics.accounting import Accounting, ExactAccounting
from ddtree.metrics.timer import StageTimer
from ddtree.types import Draft, GenerationResult, Tree, Verification


class ContextLengthError(ValueError):
    """The prompt plus ``max_new_tokens`` does not fit the target's context."""


@dataclass(frozen=True)
class RoundRecord:
    """One round, kept when ``generate(record=True)``: enough to draw the tree afterwards."""

    draft: Draft
    tree: Tree
    verification: Verification


class SpeculativeEngine:
    """Runs the round loop for one configuration of parts.

    The mask compiler defaults to ``AutoMaskCompiler`` (the tree block alone for a target that reads it
    as it is, the fast targets; a dense mask for the others) and the verifier to greedy (T = 0). A mask
    compiler with a ``for_target`` method is replaced by the compiler it returns for the target.

    >>> engine = SpeculativeEngine(target, NullDrafter(), ChainTreeBuilder())  # doctest: +SKIP
    >>> engine.generate(prompt_ids, max_new_tokens=64).tokens                 # doctest: +SKIP
    """

    def __init__(
        self,
        target: Target,
        drafter: Drafter,
        tree_builder: TreeBuilder,
        mask_compiler: MaskCompiler | None = None,
        verifier: Verifier | None = None,
        stop_token_ids: Sequence[int] = (),
        timer_sync: bool | None = None,
        tokenizer=None,
    ) -> None:
        if mask_compiler is None:
            from ddtree.masks import AutoMaskCompiler

            mask_compiler = AutoMaskCompiler()
        if hasattr(mask_compiler, "for_target"):
            mask_compiler = mask_compiler.for_target(target)
        if verifier is None:
            from ddtree.verifiers import GreedyVerifier

            verifier = GreedyVerifier()
        self.target, self.drafter = target, drafter
        self.tokenizer = tokenizer  # optional: lets generate() take text
        self.tree_builder, self.mask_compiler, self.verifier = tree_builder, mask_compiler, verifier
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        self.timer_sync = timer_sync
        target.set_taps(drafter.hidden_layers)
        mask_compiler.to(target.input_device, target.dtype)

    def _token_ids(self, prompt) -> Tensor:
        """Token ids from ids ``[T]``/``[1, T]``, what a tokenizer returns (``BatchEncoding`` or a
        dict with ``input_ids``), or text (encoded as is by the engine's tokenizer)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer: build the engine with tokenizer= (ddtree.load "
                                 "does) or pass token ids")
            prompt = self.tokenizer(prompt)
        if isinstance(prompt, Mapping) or hasattr(prompt, "input_ids") and not isinstance(prompt, Tensor):
            if "input_ids" not in prompt:
                raise ValueError(f"a mapping prompt needs 'input_ids', got keys {sorted(prompt)}")
            prompt = prompt["input_ids"]
        try:
            return torch.as_tensor(prompt, dtype=torch.long)
        except (TypeError, ValueError) as err:
            raise ValueError(f"input_ids must be token ids, text or a tokenizer's output, got "
                             f"{type(prompt).__name__} ({err})") from None

    def _check(self, input_ids, max_new_tokens: int) -> Tensor:
        ids = self._token_ids(input_ids)
        if ids.ndim == 2:
            if ids.shape[0] != 1:
                raise ValueError(
                    f"batch size {ids.shape[0]} is not supported yet: pass one prompt at a time "
                    "(input_ids of shape [T] or [1, T])"
                )
            ids = ids[0]
        if ids.ndim != 1 or ids.numel() == 0:
            raise ValueError(f"input_ids must be a non-empty [T] or [1, T] sequence, got shape {tuple(ids.shape)}")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if ids.numel() + max_new_tokens > self.target.max_length:
            raise ContextLengthError(
                f"the prompt has {ids.numel()} tokens and max_new_tokens is {max_new_tokens}: together "
                f"longer than the target's context of {self.target.max_length} tokens; shorten the "
                "prompt or lower max_new_tokens"
            )
        if int(ids.max()) >= self.target.vocab_size or int(ids.min()) < 0:
            raise ValueError(f"input_ids hold ids outside the target's vocabulary [0, {self.target.vocab_size})")
        return ids

    def _kept(self, tokens: list[int], max_new_tokens: int) -> list[int]:
        """The response: up to the first stop token, at most ``max_new_tokens`` (a last round may
        have gone past either under ``ReferenceAccounting``)."""
        for i, token in enumerate(tokens[:max_new_tokens]):
            if token in self.stop_token_ids:
                return tokens[: i + 1]
        return tokens[:max_new_tokens]

    @torch.inference_mode()
    def generate(
        self,
        input_ids: Tensor | Sequence[int] | Mapping | str,
        max_new_tokens: int = 256,
        seed: int = 0,
        record: bool = False,
        accounting: Accounting = ExactAccounting(),
    ) -> GenerationResult:
        """Decode one prompt: token ids ``[T]`` or ``[1, T]``, a tokenizer's output, or text (with
        the engine's tokenizer). Tokens stop after the first stop token or ``max_new_tokens``.

        ``accounting`` decides how the run ends and what a round's acceptance length counts
        (``ddtree.metrics.accounting``: exact, or as the published DDTree code); the tokens are
        the same under both."""
        ids = self._check(input_ids, max_new_tokens)
        target, drafter, timer = self.target, self.drafter, StageTimer(self.timer_sync)
        target.set_taps(drafter.hidden_layers)  # engines may share a target: taps are per drafter
        generator = torch.Generator(device=target.output_device).manual_seed(seed)

        # Prefill, and the first token by the target's own rule (a root-only verify).
        start = timer.now()
        sink = _prompt_sink(target, drafter)
        prompt = target.prefill(ids) if sink is None else target.prefill(ids, taps_sink=sink)
        bonus = self.verifier.verify(Tree.root(int(ids[-1])), prompt.logits[-1:], generator).bonus
        time_to_first_token = timer.now() - start
        drafter.reset(prompt)  # the draft prefill is not decode time, as in the papers
        decode_start = timer.now()

        tokens, lengths, rounds, round_ends = [bonus], [], [], []
        stopped = bonus in self.stop_token_ids
        while accounting.wants_round(len(tokens), max_new_tokens, stopped, len(lengths)):
            # 1. draft (as deep as the accounting wants, never past the target's context)
            with timer.stage("draft"):
                draft = accounting.limit(drafter.draft(bonus), len(tokens), max_new_tokens)
                draft = draft.truncate(target.max_length - target.past_length - 1)
            # 2. tree
            with timer.stage("tree"):
                tree = self.tree_builder.build(draft, bonus)
            # 3. layout
            with timer.stage("layout"):
                inputs = self.mask_compiler.compile(tree, target.past_length)
            # 4. verify
            with timer.stage("verify"):
                out = target.forward_tree(inputs)
                verification = self.verifier.verify(tree, out.logits, generator)
            # 5. commit
            with timer.stage("commit"):
                target.commit(verification.path)
                drafter.accept(verification, out)

            new = [*verification.tokens[1:], verification.bonus]
            for i, token in enumerate(new):
                if token in self.stop_token_ids:
                    new, stopped = new[: i + 1], True
                    break
            tokens += new
            lengths.append(accounting.round_length(len(new), verification))
            bonus = verification.bonus
            timer.end_round()
            round_ends.append(timer.now() - decode_start)
            if record:
                rounds.append(RoundRecord(draft, tree, verification))

        decode_time = timer.now() - decode_start
        tokens = self._kept(tokens, max_new_tokens)
        return GenerationResult(
            tokens=tokens,
            acceptance_lengths=lengths,
            stage_times=timer.result(),
            time_to_first_token=time_to_first_token,
            decode_time=decode_time,
            stopped_by="stop_token" if tokens[-1] in self.stop_token_ids else "max_new_tokens",
            round_ends=round_ends,
            round_stage_times=timer.rounds,
            rounds=rounds,
        )


def _prompt_sink(target: Target, drafter: Drafter):
    """The drafter's ``prompt_sink()`` where it has one and the target's prefill takes a
    ``taps_sink`` (both optional parts of their protocols), else None."""
    make = getattr(drafter, "prompt_sink", None)
    if make is None or "taps_sink" not in inspect.signature(target.prefill).parameters:
        return None
    return make()
