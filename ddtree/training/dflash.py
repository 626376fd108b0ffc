"""DFlash drafter training (the paper's recipe, B.8), on a frozen target.

For each sequence, random anchor positions are drawn among its response tokens. The block of an
anchor a is ``[x_a, m, ..., m]`` at positions a..a+bs-1 (m the mask token, embedded by the
target's own embedding); block position k predicts x_{a+k}, with no shift, exactly as drafting
does. Every block of every sequence in a step is concatenated into one drafter forward:

    queries: all blocks, T = B * A * bs rows
    keys:    the target features of all B sequences (C = B * S rows), then the T block rows
    row (b, a, k) sees  feature (b', s)  iff  b' == b and s < a    (the context before the anchor)
                        block row (b', a', k')  iff  (b', a') == (b, a)   (bidirectional in-block)

Loss: cross-entropy at k = 1..bs-1 weighted by w_k = exp(-(k-1)/gamma), a weighted mean
normalised by the weight sum. Only the drafter's own parameters train (fc, hidden_norm, layers,
norm); the target, its embedding and its LM head are frozen.

    >>> drafter = new_dflash(target_model, mask_token_id=2)                       # doctest: +SKIP
    >>> train_dflash(drafter, target_model, data, DFlashTrainConfig(), Budget(max_steps=500))  # doctest: +SKIP
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ddtree.models.dflash import DFlashConfig, DFlashDraftModel
from ddtree.training.features import freeze, target_features
from ddtree.training.loop import Budget, OptimConfig, TrainResult, autocast, train_loop
from ddtree.training.sequences import SequenceSet

GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}  # the paper's loss decay per block size


def tap_layers(num_target_layers: int, count: int) -> tuple[int, ...]:
    """``count`` taps spread uniformly from the second layer to the third-to-last (the paper's rule).

    >>> tap_layers(36, 5), tap_layers(6, 3), tap_layers(4, 2)
    ((1, 9, 17, 25, 33), (1, 2, 3), (1,))
    """
    lo = min(1, num_target_layers - 1)
    hi = max(num_target_layers - 3, lo)
    if count <= 1:
        return ((lo + hi) // 2,)
    return tuple(sorted({round(lo + i * (hi - lo) / (count - 1)) for i in range(count)}))


def _rope_theta(config) -> float:
    """The target's RoPE base (transformers 5 keeps it in ``rope_parameters``); the drafter uses the same."""
    rope = getattr(config, "rope_parameters", None) or {}
    return float(getattr(config, "rope_theta", None) or rope.get("rope_theta") or 1_000_000.0)


def new_dflash(target_model, mask_token_id: int, block_size: int = 16, num_layers: int = 2,
               num_taps: int = 3, seed: int = 0) -> DFlashDraftModel:
    """A freshly initialised drafter shaped like the target's layers (float32, for training).

    >>> new_dflash(tiny_target("qwen3"), mask_token_id=95).config.target_layer_ids   # doctest: +SKIP
    (1,)
    """
    cfg = target_model.config
    dcfg = DFlashConfig(
        hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_hidden_layers=num_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        vocab_size=cfg.vocab_size, num_target_layers=cfg.num_hidden_layers, mask_token_id=mask_token_id,
        target_layer_ids=tap_layers(cfg.num_hidden_layers, num_taps), block_size=block_size,
        rms_norm_eps=cfg.rms_norm_eps, rope_theta=_rope_theta(cfg),
        max_position_embeddings=cfg.max_position_embeddings,
    )
    with torch.random.fork_rng(devices=[]):  # seeded without disturbing the caller's RNG
        torch.manual_seed(seed)
        model = DFlashDraftModel(dcfg)
    with torch.no_grad():  # nn.Linear's default init; shrink residual writes so depth starts near identity
        for layer in model.layers:
            layer.self_attn.o_proj.weight.mul_(1.0 / math.sqrt(2 * num_layers))
            layer.mlp["down_proj"].weight.mul_(1.0 / math.sqrt(2 * num_layers))
    return model.to(target_model.device)


def loss_weights(block_size: int, gamma: float) -> Tensor:  # [block_size], 0 at the anchor
    """w_0 = 0 (the anchor is given), w_k = exp(-(k-1)/gamma) for k >= 1.

    >>> [round(w, 3) for w in loss_weights(4, 1.0).tolist()]
    [0.0, 1.0, 0.368, 0.135]
    """
    k = torch.arange(block_size, dtype=torch.float32)
    return torch.where(k == 0, torch.zeros(()), torch.exp(-(k - 1) / gamma))


def sample_anchors(loss_mask: Tensor, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``count`` anchors per row of ``loss_mask`` ``[B, S]``: a response token followed by one.

    Returns anchors ``[B, count]`` (sorted per row) and whether each is real ``[B, count]``: rows
    with fewer candidates repeat picks marked not real, so shapes stay static on the GPU.
    """
    candidates = loss_mask.clone()
    candidates[:, :-1] &= loss_mask[:, 1:]  # at least one label after the anchor
    candidates[:, -1] = False
    candidates[:, 0] = False  # no context at all: drafting never starts there
    scores = torch.rand(loss_mask.shape, generator=generator, device=loss_mask.device)
    scores = torch.where(candidates, scores, torch.full_like(scores, -1.0))
    top, anchors = scores.topk(min(count, loss_mask.shape[1]), dim=1)
    real = top >= 0
    order = anchors.sort(dim=1)
    return order.values, real.gather(1, order.indices)


@dataclass(frozen=True)
class Blocks:
    """All blocks of a step laid out for one drafter forward (T = B * A * bs rows)."""

    ids: Tensor  # [T] anchor token then mask tokens
    positions: Tensor  # [T] absolute positions a..a+bs-1
    labels: Tensor  # [T] x_{a+k} (clamped inside the sequence where there is none)
    weights: Tensor  # [T] loss weight, 0 where there is no loss
    mask: Tensor  # [T, C + T] bool, True where a block row may attend


def layout_blocks(data: SequenceSet, anchors: Tensor, real: Tensor, block_size: int, mask_token_id: int,
                  gamma: float) -> Blocks:
    """Blocks, labels, weights and the attention mask for anchors ``[B, A]`` of ``data``."""
    ids, loss_mask = data.ids, data.loss_mask
    b, s = ids.shape
    a = anchors.shape[1]
    device = ids.device
    k = torch.arange(block_size, device=device)
    pos = anchors[..., None] + k  # [B, A, bs]
    inside = pos.clone().clamp_(max=s - 1)
    labels = ids.gather(1, inside.view(b, -1)).view(b, a, block_size)
    has_label = (pos < s) & loss_mask.gather(1, inside.view(b, -1)).view(b, a, block_size) & real[..., None]
    weights = loss_weights(block_size, gamma).to(device) * has_label  # [B, A, bs]
    block_ids = torch.full_like(labels, mask_token_id)
    block_ids[..., 0] = labels[..., 0]  # the anchor itself is clean

    row_seq = torch.arange(b, device=device).repeat_interleave(a * block_size)  # [T]
    row_anchor = anchors.repeat_interleave(block_size, dim=1).reshape(-1)  # [T]
    row_block = torch.arange(b * a, device=device).repeat_interleave(block_size)  # [T]
    ctx_seq = torch.arange(b, device=device).repeat_interleave(s)  # [C]
    ctx_pos = torch.arange(s, device=device).repeat(b)  # [C]
    sees_ctx = (row_seq[:, None] == ctx_seq[None]) & (ctx_pos[None] < row_anchor[:, None])  # [T, C]
    sees_block = row_block[:, None] == row_block[None]  # [T, T]
    return Blocks(block_ids.reshape(-1), pos.reshape(-1), labels.reshape(-1), weights.reshape(-1),
                  torch.cat([sees_ctx, sees_block], dim=1))


def dflash_forward(drafter: DFlashDraftModel, target_model, data: SequenceSet, blocks: Blocks) -> Tensor:
    """Drafter logits ``[T, vocab]`` for every block row (the target's features as context)."""
    cfg = drafter.config
    b, s = data.ids.shape
    dtype = next(drafter.parameters()).dtype
    feats = target_features(target_model, data.ids, cfg.target_layer_ids).to(dtype)  # [B, S, F]
    ctx_positions = torch.arange(s, device=data.ids.device).repeat(b)  # [C]
    context = drafter.context_kv(feats.reshape(b * s, -1), ctx_positions)
    with torch.no_grad():
        embeds = target_model.get_input_embeddings()(blocks.ids)[None].to(dtype)  # [1, T, H]
    hidden = drafter(embeds, blocks.positions, context, mask=blocks.mask[None, None])[0]  # [T, H]
    return target_model.get_output_embeddings()(hidden)  # [T, vocab]


def weighted_loss(logits: Tensor, blocks: Blocks) -> Tensor:
    """Sum_k w_k CE_k / sum_k w_k over the rows with a label."""
    ce = F.cross_entropy(logits.float(), blocks.labels, reduction="none")  # [T]
    return (ce * blocks.weights).sum() / blocks.weights.sum().clamp(min=1e-6)


@torch.no_grad()
def chain_acceptance(logits: Tensor, blocks: Blocks, block_size: int) -> Tensor:
    """Expected chain tau at T = 0 (accepted prefix + 1) for blocks whose first label exists."""
    correct = (logits.argmax(-1) == blocks.labels) & (blocks.weights > 0)
    correct = correct.view(-1, block_size)[:, 1:]  # [blocks, bs - 1]
    usable = (blocks.weights.view(-1, block_size)[:, 1] > 0).float()
    accepted = correct.long().cumprod(dim=1).sum(dim=1).float()
    return 1.0 + (accepted * usable).sum() / usable.sum().clamp(min=1.0)


@dataclass(frozen=True)
class DFlashTrainConfig:
    batch_size: int = 16  # sequences per step
    anchors: int = 32  # blocks per sequence
    gamma: float | None = None  # None: the paper's value for the block size (7 for 16)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=6e-4, weight_decay=0.0))
    seed: int = 0
    log_every: int = 100


def train_dflash(drafter: DFlashDraftModel, target_model, data: SequenceSet, cfg: DFlashTrainConfig,
                 budget: Budget, log: Callable[[str], None] | None = print) -> TrainResult:
    """Train ``drafter`` in place on ``data`` (on the drafter's device); the target stays frozen."""
    freeze(target_model)
    device = next(drafter.parameters()).device
    data = data.to(device)
    block_size = drafter.config.block_size
    gamma = cfg.gamma or GAMMA.get(block_size, block_size / 2)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    order: list[Tensor] = []
    tau = {"last": torch.zeros(())}
    drafter.train()

    def loss_fn(step: int) -> Tensor:
        if not order:  # a new epoch: a fresh permutation of the sequences
            order.extend(torch.randperm(len(data), generator=generator, device=device).split(cfg.batch_size))
        batch = data.batch(order.pop(0))
        anchors, real = sample_anchors(batch.loss_mask, cfg.anchors, generator)
        blocks = layout_blocks(batch, anchors, real, block_size, drafter.config.mask_token_id, gamma)
        with autocast(device):
            logits = dflash_forward(drafter, target_model, batch, blocks)
        tau["last"] = chain_acceptance(logits, blocks, block_size)
        return weighted_loss(logits, blocks)

    def report(step: int, loss: float) -> None:
        if log:
            log(f"  step {step:6d}  block tau (T=0, teacher-forced) {float(tau['last']):.2f}")

    result = train_loop(drafter.parameters(), loss_fn, budget, cfg.optim, cfg.log_every, log, report)
    drafter.eval()
    return result
