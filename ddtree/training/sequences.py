"""Drafter training data: prompts continued by the target itself (DFlash's "regenerated" responses).

A drafter should predict what *this* target says, so the responses are the target's own
samples. Prompts are equal-length token windows, which makes batched generation need no
padding on the left; a response ends after its first eos and the rest is padding that no
loss sees.

    >>> data = regenerate(model, prompts, new_tokens=64, eos_token_id=0, pad_token_id=1)   # doctest: +SKIP
    >>> data.ids.shape, data.loss_mask.shape                                                 # doctest: +SKIP
    (torch.Size([N, P + 64]), torch.Size([N, P + 64]))
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor


@dataclass(frozen=True)
class SequenceSet:
    """Token sequences and where the loss applies (the response tokens, eos included)."""

    ids: Tensor  # [N, S] long
    loss_mask: Tensor  # [N, S] bool

    def __post_init__(self) -> None:
        if self.ids.ndim != 2 or self.ids.shape != self.loss_mask.shape:
            raise ValueError(f"ids {tuple(self.ids.shape)} and loss_mask {tuple(self.loss_mask.shape)} must be equal [N, S]")

    def __len__(self) -> int:
        return self.ids.shape[0]

    def to(self, device: torch.device | str) -> "SequenceSet":
        return SequenceSet(self.ids.to(device), self.loss_mask.to(device))

    def batch(self, index: Tensor) -> "SequenceSet":
        return SequenceSet(self.ids[index], self.loss_mask[index])

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        save_file({"ids": self.ids.to(torch.int32).cpu().contiguous(),
                   "loss_mask": self.loss_mask.to(torch.uint8).cpu().contiguous()}, str(path))

    @staticmethod
    def load(path: str | Path) -> "SequenceSet":
        state = load_file(str(path))
        return SequenceSet(state["ids"].long(), state["loss_mask"].bool())

    @staticmethod
    def from_tokens(ids: Tensor, prompt_length: int) -> "SequenceSet":
        """Every token after the first ``prompt_length`` is response (no eos handling)."""
        mask = torch.zeros_like(ids, dtype=torch.bool)
        mask[:, prompt_length:] = True
        return SequenceSet(ids, mask)


def response_mask(ids: Tensor, prompt_length: int, eos_token_id: int | None) -> Tensor:  # [N, S] bool
    """Response positions up to and including each row's first eos.

    >>> response_mask(torch.tensor([[5, 6, 0, 1, 1]]), 1, eos_token_id=0).tolist()
    [[False, True, True, False, False]]
    """
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, prompt_length:] = True
    if eos_token_id is not None:
        is_eos = (ids == eos_token_id) & mask
        after = (is_eos.cumsum(dim=1) - is_eos.long()) > 0  # strictly after the first eos
        mask &= ~after
    return mask


def prompt_windows(stream: Tensor, count: int, length: int, seed: int = 0) -> Tensor:
    """``[count, length]`` windows of a token stream at seeded random offsets (the prompts)."""
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, stream.numel() - length, (count, 1), generator=generator)
    return stream.cpu()[starts + torch.arange(length)]


@torch.no_grad()
def regenerate(model, prompts: Tensor, new_tokens: int, eos_token_id: int | None, pad_token_id: int,
               batch_size: int = 256, temperature: float = 0.0, max_seconds: float = float("inf"),
               log: Callable[[str], None] | None = print) -> SequenceSet:
    """Continue each prompt ``[N, P]`` by ``new_tokens`` with ``model.generate`` (batched).

    ``temperature`` 0 is greedy, otherwise plain sampling from softmax(logits / T) (no top-k or
    top-p). Stops early, keeping the finished batches, once ``max_seconds`` have passed.
    """
    device = model.get_input_embeddings().weight.device
    sampling = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature,
                                                                "top_k": 0, "top_p": 1.0}
    start, chunks = time.perf_counter(), []
    for i in range(0, prompts.shape[0], batch_size):
        if time.perf_counter() - start > max_seconds:
            if log:
                log(f"  time limit: kept {i} of {prompts.shape[0]} sequences")
            break
        x = prompts[i : i + batch_size].to(device)
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                             min_new_tokens=1, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                             **sampling)
        width = prompts.shape[1] + new_tokens
        if out.shape[1] < width:  # every row stopped early: generate returns a shorter batch
            out = torch.cat([out, out.new_full((out.shape[0], width - out.shape[1]), pad_token_id)], dim=1)
        chunks.append(out.cpu())
        if log:
            log(f"  generated {i + x.shape[0]} / {prompts.shape[0]}  {time.perf_counter() - start:6.1f}s")
    ids = torch.cat(chunks) if chunks else prompts.new_zeros((0, prompts.shape[1] + new_tokens))
    return SequenceSet(ids, response_mask(ids, prompts.shape[1], eos_token_id))
