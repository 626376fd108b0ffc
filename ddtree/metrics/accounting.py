"""How a run ends and what its rounds count: the engine's end-of-run accounting.

Both policies return the same tokens, the first ``max_new_tokens`` of the target's own (up to
the first stop token); they differ only in the last rounds and in the acceptance lengths, so in
tau on short generations.

- ``ExactAccounting`` (default): the loop drafts no deeper than the tokens still wanted, stops
  at exactly ``max_new_tokens``, and a round counts the tokens the response keeps from it.
- ``ReferenceAccounting``: what the published DDTree and DFlash code does. It drafts full
  blocks to the end, runs a round while the tokens before the bonus are at most
  ``max_new_tokens`` (so one round more when the run has exactly ``max_new_tokens``), runs
  its first round before it looks for a stop token, and a round counts all its accepted
  drafts + 1, past ``max_new_tokens`` or a stop token included.

    >>> engine.generate(ids, max_new_tokens=96, accounting=ReferenceAccounting())   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ddtree.types import Draft, Verification


@runtime_checkable
class Accounting(Protocol):
    name: str  # recorded with a run (its identity): "exact" or "reference"

    def wants_round(self, generated: int, max_new_tokens: int, stopped: bool, rounds: int) -> bool:
        """Whether the loop runs another round, with ``generated`` tokens so far (bonus included)."""

    def limit(self, draft: Draft, generated: int, max_new_tokens: int) -> Draft:
        """The draft the round verifies."""

    def round_length(self, kept: int, verification: Verification) -> int:
        """The round's acceptance length; ``kept``: the tokens the response keeps from it."""


class ExactAccounting:
    """Draft only the tokens still wanted; a round counts what the response keeps."""

    name = "exact"

    def wants_round(self, generated: int, max_new_tokens: int, stopped: bool, rounds: int) -> bool:
        return not stopped and generated < max_new_tokens

    def limit(self, draft: Draft, generated: int, max_new_tokens: int) -> Draft:
        # the round adds accepted drafts + the bonus: at most max_new_tokens - generated
        return draft.truncate(max_new_tokens - generated - 1)

    def round_length(self, kept: int, verification: Verification) -> int:
        return kept


class ReferenceAccounting:
    """The published code's end of run: full drafts, one round more, every accepted draft counted."""

    name = "reference"

    def wants_round(self, generated: int, max_new_tokens: int, stopped: bool, rounds: int) -> bool:
        # its loop: `while start < max_length`, start being the bonus's index; the stop check
        # follows each round, the prefill's token included
        return (rounds == 0 or not stopped) and generated <= max_new_tokens

    def limit(self, draft: Draft, generated: int, max_new_tokens: int) -> Draft:
        return draft

    def round_length(self, kept: int, verification: Verification) -> int:
        return verification.accepted + 1
