"""AR decoding as a drafter: it drafts nothing, so every round verifies the root alone."""

from __future__ import annotations

from ddtree.types import Draft, TargetOutput, Verification


class NullDrafter:
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, vocab_size: int = 1) -> None:
        self._empty = Draft.empty(vocab_size)

    @property
    def vocab_size(self) -> int:
        return self._empty.log_probs.shape[-1]

    def reset(self, prompt: TargetOutput) -> None:
        self._empty = Draft.empty(prompt.logits.shape[-1])

    def draft(self, root_token: int) -> Draft:
        return self._empty  # frozen, so one serves every round

    def accept(self, verification: Verification, context: TargetOutput) -> None:
        pass
