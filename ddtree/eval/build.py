"""From instantiated parts to an engine: the one place entry points assemble a strategy.

Entry points instantiate each config group (``hydra.utils.instantiate``) and hand the objects
here; the library never reads a config. A drafter that needs the target comes as a factory
(``_partial_: true`` in its config) and is called with ``target=`` once the target is loaded.

    >>> engine = build_engine(target, partial(DFlashDrafter, model=draft_model), BestFirstTreeBuilder(64),
    ...                       DenseMaskCompiler(), GreedyVerifier(), stop_token_ids=[eos])   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Callable, Sequence

from ddtree.engine import SpeculativeEngine
from ddtree.interfaces import Drafter, MaskCompiler, Target, TreeBuilder, Verifier


def bind_drafter(drafter: Drafter | Callable[..., Drafter], target: Target) -> Drafter:
    """A drafter as is, or a drafter factory called with the target it drafts for."""
    if isinstance(drafter, Drafter):
        return drafter
    if not callable(drafter):
        raise TypeError(f"expected a Drafter or a factory taking target=, got {type(drafter).__name__}")
    built = drafter(target=target)
    if not isinstance(built, Drafter):
        raise TypeError(f"the drafter factory returned a {type(built).__name__}, which is not a Drafter")
    return built


def eos_stop_tokens(tokenizer) -> list[int]:
    """The protocol stops on the tokenizer's eos token only."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError("the tokenizer has no eos_token_id, and the protocol stops on eos only")
    return [int(eos)]


def build_engine(
    target: Target,
    drafter: Drafter | Callable[..., Drafter],
    tree_builder: TreeBuilder,
    mask_compiler: MaskCompiler,
    verifier: Verifier,
    stop_token_ids: Sequence[int] = (),
    tokenizer=None,
) -> SpeculativeEngine:
    """The loop for one strategy. AR is ``NullDrafter`` with the chain: the same loop, timed alike.

    A ``tokenizer`` larger than the target's vocabulary fails here."""
    if tokenizer is not None:
        from ddtree.models.hub import check_vocabularies

        check_vocabularies(tokenizer, target)
    return SpeculativeEngine(target, bind_drafter(drafter, target), tree_builder, mask_compiler, verifier,
                             stop_token_ids=stop_token_ids, tokenizer=tokenizer)


def describe_parts(engine: SpeculativeEngine) -> dict:
    """What a run's engine is made of, for ``run.json`` and the tables (read off the objects)."""
    return {
        "target": type(engine.target).__name__,
        "drafter": type(engine.drafter).__name__,
        "tree": type(engine.tree_builder).__name__,
        "budget": getattr(engine.tree_builder, "budget", None),
        "mask": type(engine.mask_compiler).__name__,
        "verifier": type(engine.verifier).__name__,
        "temperature": float(getattr(engine.verifier, "temperature", 0.0)),
    }
