"""MTP head training: the next-next-token loss, with optional chained steps.

Step 1 at origin s reads the target's post-norm hidden h_s and the embedding of x_{s+1}, at
position s, and predicts x_{s+2}. Chained step j (as ``MTPDrafter`` drafts) reads step j-1's
output h' and the token x_{s+j}, at position s+j-1, and predicts x_{s+j+1}. Each step attends
as it does at draft time: to the step-1 rows of origins <= s (the committed pairs, the root's
pair last) and to its own chain's earlier steps. The next tokens are the true ones (teacher
forcing); at draft time they are the head's own top-1, which is the same token whenever the
draft is accepted, the only case that matters.

    >>> head = MTPHead.for_target(target_model).float()                         # doctest: +SKIP
    >>> train_mtp(head, target_model, data, MTPTrainConfig(), Budget(max_steps=300))  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import DynamicCache

from ddtree.training.features import freeze, target_features
from ddtree.training.loop import Budget, OptimConfig, TrainResult, autocast, train_loop
from ddtree.training.sequences import SequenceSet
from ddtree.types import FINAL_NORM


def chain_mask(counts: list[int], dtype: torch.dtype, device: torch.device) -> Tensor:  # [1, 1, m, sum(counts)]
    """Additive mask for step ``len(counts)``, whose keys are all steps' rows so far.

    ``counts[i]`` rows of step i + 1 (origins 0..counts[i]-1). A query of origin s sees step 1's
    rows at origins <= s and every later step's row of origin s.

    >>> (chain_mask([3, 2], torch.float32, torch.device("cpu"))[0, 0] == 0).int().tolist()
    [[1, 0, 0, 1, 0], [1, 1, 0, 0, 1]]
    """
    origins = [torch.arange(c, device=device) for c in counts]
    query = origins[-1][:, None]
    allowed = torch.cat([origins[0][None] <= query] + [o[None] == query for o in origins[1:]], dim=1)
    return ((~allowed).to(dtype) * torch.finfo(dtype).min)[None, None]


def chained_states(head, target_model, ids: Tensor, depth: int) -> list[Tensor]:
    """The head's outputs for steps 1..depth at every origin: step j is ``[B, n - j, H]``.

    Row s of step j is what drafting computes at depth j below the root x_{s+1} when the
    committed text is x_0..x_s and the earlier draft tokens are the true x_{s+2}..x_{s+j}.
    """
    b, n = ids.shape
    dtype = next(head.parameters()).dtype
    # The additive mask in the dtype attention runs in (bf16 under autocast on a GPU).
    mask_dtype = torch.get_autocast_dtype(ids.device.type) if torch.is_autocast_enabled(ids.device.type) else dtype
    hidden = target_features(target_model, ids, (FINAL_NORM,)).to(dtype)  # [B, n, H] post-norm
    with torch.no_grad():
        embeds = target_model.get_input_embeddings()(ids).to(dtype)  # [B, n, H]
    cache, h, states = DynamicCache(), hidden[:, :-1], []
    for j in range(1, min(depth, n - 1) + 1):
        m = n - j  # rows of step j: origins 0..m-1
        mask = chain_mask([n - 1 - i for i in range(j)], mask_dtype, ids.device)
        positions = (torch.arange(m, device=ids.device) + j - 1)[None].expand(b, -1)
        h = head(embeds[:, j:], h[:, :m], positions, cache, attention_mask=mask)  # [B, m, H]
        states.append(h)
    return states


def mtp_losses(head, target_model, data: SequenceSet, depth: int) -> list[Tensor]:
    """Mean cross-entropy of each chained step ``1..depth`` over its labelled rows.

    The last origin of step j has its label x_{s+j+1} past the sequence: it is context only.
    """
    ids, loss_mask = data.ids, data.loss_mask
    lm_head, losses = target_model.get_output_embeddings(), []
    for j, h in enumerate(chained_states(head, target_model, ids, min(depth, ids.shape[1] - 2)), start=1):
        logits = lm_head(h[:, :-1]).float()  # [B, m - 1, vocab], origins with a label
        labels, weight = ids[:, j + 1 :], loss_mask[:, j + 1 :].float()  # [B, m - 1]
        ce = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")  # [B, m - 1]
        losses.append((ce * weight).sum() / weight.sum().clamp(min=1.0))
    return losses


@dataclass(frozen=True)
class MTPTrainConfig:
    batch_size: int = 32
    depth: int = 3  # chained steps trained (1: the plain next-next-token loss)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, weight_decay=0.0))
    seed: int = 0
    log_every: int = 100


def train_mtp(head, target_model, data: SequenceSet, cfg: MTPTrainConfig, budget: Budget,
              log: Callable[[str], None] | None = print) -> TrainResult:
    """Train ``head`` in place (mean of the steps' losses); the target stays frozen."""
    freeze(target_model)
    device = next(head.parameters()).device
    data = data.to(device)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    order: list[Tensor] = []
    per_step: dict[str, list[Tensor]] = {"last": []}
    head.train()

    def loss_fn(step: int) -> Tensor:
        if not order:
            order.extend(torch.randperm(len(data), generator=generator, device=device).split(cfg.batch_size))
        with autocast(device):
            losses = mtp_losses(head, target_model, data.batch(order.pop(0)), cfg.depth)
        per_step["last"] = losses
        return torch.stack(losses).mean()

    def report(step: int, loss: float) -> None:
        if log:
            log("  per-step loss " + " ".join(f"{float(x.detach()):.3f}" for x in per_step["last"]))

    result = train_loop(head.parameters(), loss_fn, budget, cfg.optim, cfg.log_every, log, report)
    head.eval()
    return result
