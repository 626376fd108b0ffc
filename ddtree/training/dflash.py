"""DFlash drafter training (the paper's recipe, B.8), on a frozen target.

For each sequence, random anchor positions are drawn among its response tokens. The block of an
anchor a is ``[x_a, m, ..., m]`` at positions a..a+bs-1 (m the mask token, embedded by the
target's own embedding); block position k predicts x_{a+k}, with no shift, exactly as drafting
does. The blocks of a sequence are concatenated into one drafter forward, batched over the
sequences of a step:

    queries: sequence b's blocks, A * bs rows
    keys:    sequence b's target features (S rows), then its A * bs block rows
    row (a, k) sees  feature s  iff  s < a    (the context before the anchor)
                     block row (a', k')  iff  a' == a   (bidirectional in-block)

A sequence's rows never see another sequence: each attends over its own batch entry. The target's
features of the whole data set are computed once before training when they fit
(``DFlashTrainConfig.feature_cache_gib``), so a step runs the drafter alone.

Loss: cross-entropy at k = 1..bs-1 weighted by w_k = exp(-(k-1)/gamma), a weighted mean
normalised by the weight sum. Only the drafter's own parameters train (fc, hidden_norm, layers,
norm); the target, its embedding and its LM head are frozen.

    >>> drafter = new_dflash(target_model, mask_token_id=2)                       # doctest: +SKIP
    >>> train_dflash(drafter, target_model, data, DFlashTrainConfig(), Budget(max_steps=500))  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
import time
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
               num_taps: int = 3, seed: int = 0, target_layer_ids: tuple[int, ...] | None = None) -> DFlashDraftModel:
    """A freshly initialised drafter shaped like the target's layers (float32, for training), tapping
    ``target_layer_ids`` or else ``num_taps`` layers spread by the paper's rule (``tap_layers``).

    >>> new_dflash(tiny_target("qwen3"), mask_token_id=95).config.target_layer_ids   # doctest: +SKIP
    (1,)
    """
    cfg = target_model.config
    dcfg = DFlashConfig(
        hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_hidden_layers=num_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        vocab_size=cfg.vocab_size, num_target_layers=cfg.num_hidden_layers, mask_token_id=mask_token_id,
        target_layer_ids=tuple(target_layer_ids or tap_layers(cfg.num_hidden_layers, num_taps)), block_size=block_size,
        rms_norm_eps=cfg.rms_norm_eps, rope_theta=_rope_theta(cfg),
        max_position_embeddings=cfg.max_position_embeddings,
    )
    with torch.random.fork_rng(devices=[]):  # seeded without disturbing the caller's RNG
        torch.manual_seed(seed)
        model = DFlashDraftModel(dcfg)
    with torch.no_grad():  # nn.Linear's default init; shrink residual writes so depth starts near identity
        for layer in model.layers:
            layer.self_attn.o_proj.weight.mul_(1.0 / math.sqrt(2 * num_layers))
            layer.mlp.down_proj.weight.mul_(1.0 / math.sqrt(2 * num_layers))
    return model.to(target_model.device)


@torch.no_grad()
def grow_dflash(drafter: DFlashDraftModel, num_layers: int, target_layer_ids: tuple[int, ...] | None = None,
                seed: int = 0) -> DFlashDraftModel:
    """``drafter`` with more layers and/or taps, computing exactly what it computed (a trained
    drafter continues training with more capacity instead of starting over).

    The new taps' columns of ``fc`` are zero, so the fused features are unchanged; the new layers
    come after the old ones with ``o_proj`` and ``down_proj`` zero, so each adds nothing to the
    residual stream until training moves them. ``target_layer_ids`` None keeps the drafter's taps.

    >>> grown = grow_dflash(drafter, 4, (1, 3, 5, 7))   # doctest: +SKIP
    """
    cfg = drafter.config
    taps = tuple(target_layer_ids or cfg.target_layer_ids)
    if num_layers < cfg.num_hidden_layers or not set(cfg.target_layer_ids) <= set(taps):
        raise ValueError(
            f"a grown drafter keeps what it has: {cfg.num_hidden_layers} layers and taps {list(cfg.target_layer_ids)} "
            f"cannot become {num_layers} layers and taps {list(taps)}"
        )
    new_cfg = dataclasses.replace(cfg, num_hidden_layers=num_layers, target_layer_ids=taps)
    param = next(drafter.parameters())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        grown = DFlashDraftModel(new_cfg).to(device=param.device, dtype=param.dtype)
    h = cfg.hidden_size
    fc = torch.zeros_like(grown.fc.weight)  # [H, len(taps) * H]
    for j, layer in enumerate(cfg.target_layer_ids):
        i = taps.index(layer)
        fc[:, i * h : (i + 1) * h] = drafter.fc.weight[:, j * h : (j + 1) * h]
    grown.fc.weight.copy_(fc)
    grown.hidden_norm.load_state_dict(drafter.hidden_norm.state_dict())
    grown.norm.load_state_dict(drafter.norm.state_dict())
    for i, layer in enumerate(grown.layers):
        if i < cfg.num_hidden_layers:
            layer.load_state_dict(drafter.layers[i].state_dict())
        else:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return grown.train(drafter.training)


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
    """All blocks of a step laid out for one drafter forward: B sequences of R = A * bs rows (T = B * R)."""

    ids: Tensor  # [B, R] anchor token then mask tokens
    positions: Tensor  # [B, R] absolute positions a..a+bs-1
    labels: Tensor  # [T] x_{a+k} (clamped inside the sequence where there is none), sequence-major
    weights: Tensor  # [T] loss weight, 0 where there is no loss
    mask: Tensor  # [B, R, S + R] bool, True where a block row may attend (its sequence's features, then its rows)


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

    r = a * block_size
    row_anchor = anchors.repeat_interleave(block_size, dim=1)  # [B, R]
    sees_ctx = torch.arange(s, device=device)[None, None] < row_anchor[..., None]  # [B, R, S]
    row_block = torch.arange(a, device=device).repeat_interleave(block_size)  # [R]
    sees_block = (row_block[:, None] == row_block[None]).expand(b, r, r)  # [B, R, R]
    return Blocks(block_ids.view(b, r), pos.view(b, r), labels.reshape(-1), weights.reshape(-1),
                  torch.cat([sees_ctx, sees_block], dim=2))


def dflash_forward(drafter: DFlashDraftModel, target_model, data: SequenceSet, blocks: Blocks,
                   features: Tensor | None = None) -> Tensor:
    """Drafter logits ``[T, vocab]`` for every block row (the target's features as context).

    ``features`` ``[B, S, F]``: the target's taps of ``data`` when computed beforehand (the
    feature cache); None runs the frozen target here.
    """
    cfg = drafter.config
    b, s = data.ids.shape
    dtype = next(drafter.parameters()).dtype
    if features is None:
        features = target_features(target_model, data.ids, cfg.target_layer_ids)
    context = drafter.context_kv(features.to(dtype), torch.arange(s, device=data.ids.device))  # [B, n_kv, S, d]
    with torch.no_grad():
        embeds = target_model.get_input_embeddings()(blocks.ids).to(dtype)  # [B, R, H]
    hidden = drafter(embeds, blocks.positions, context, mask=blocks.mask[:, None])  # [B, R, H]
    return target_model.get_output_embeddings()(hidden.reshape(-1, hidden.shape[-1]))  # [T, vocab]


def weighted_loss(logits: Tensor, blocks: Blocks) -> Tensor:
    """Sum_k w_k CE_k / sum_k w_k over the rows with a label."""
    ce = F.cross_entropy(logits.float(), blocks.labels, reduction="none")  # [T]
    return (ce * blocks.weights).sum() / blocks.weights.sum().clamp(min=1e-6)


@torch.no_grad()
def chain_acceptance(logits: Tensor, blocks: Blocks, block_size: int) -> Tensor:
    """Chain tau at T = 0 (accepted prefix + 1) averaged over blocks whose first label exists.

    Every anchor counts once, so a stretch the drafter gets right counts once per token in it;
    decoding passes it in one round. This mean overstates decoding's tau (``decode_tau`` walks the
    rounds instead), and serves to follow a run's progress, not to predict acceptance.
    """
    usable = (blocks.weights.view(-1, block_size)[:, 1] > 0).float()
    accepted = accepted_drafts(logits, blocks, block_size).float()
    return 1.0 + (accepted * usable).sum() / usable.sum().clamp(min=1.0)


def accepted_drafts(logits: Tensor, blocks: Blocks, block_size: int) -> Tensor:  # [blocks] long
    """Per block, how many of its drafted tokens (the argmax) a T = 0 chain accepts: the length of
    the prefix that matches the labels, stopping at the first position with no label."""
    correct = (logits.argmax(-1) == blocks.labels) & (blocks.weights > 0)
    return correct.view(-1, block_size)[:, 1:].long().cumprod(dim=1).sum(dim=1)  # over [blocks, bs - 1]


@torch.no_grad()
def anchor_acceptance(drafter: DFlashDraftModel, target_model, data: SequenceSet, chunk: int = 64) -> list[Tensor]:
    """Per sequence, the drafts a DFlash block anchored at each response token would get accepted at
    T = 0 against the sequence itself: ``[last - first]`` longs, from its first response position
    ``first`` to its last, ``last`` (eos included); a draft never runs past ``last``.

    The target's features are computed once per sequence; the anchors go through the training
    forward ``chunk`` at a time.
    """
    bs = drafter.config.block_size
    dtype = next(drafter.parameters()).dtype
    device = next(drafter.parameters()).device
    accepted = []
    for i in range(len(data)):
        mask = data.loss_mask[i]
        where = mask.nonzero().flatten()
        if where.numel() < 2:
            accepted.append(torch.zeros(0, dtype=torch.long))
            continue
        first, last = int(where[0]), int(where[-1])
        seq = SequenceSet(data.ids[i : i + 1, : last + 1], mask[None, : last + 1]).to(device)
        features = target_features(target_model, seq.ids, drafter.config.target_layer_ids).to(dtype)
        counts = []
        for start in range(first, last, chunk):
            anchors = torch.arange(start, min(start + chunk, last), device=device)[None]  # [1, A]
            blocks = layout_blocks(seq, anchors, torch.ones_like(anchors, dtype=torch.bool), bs,
                                   drafter.config.mask_token_id, gamma=1.0)
            logits = dflash_forward(drafter, target_model, seq, blocks, features)  # [A * bs, vocab]
            counts.append(accepted_drafts(logits, blocks, bs).cpu())
        accepted.append(torch.cat(counts))
    return accepted


def walk_rounds(accepted: Tensor) -> list[int]:
    """The acceptance lengths (bonus included) of a T = 0 chain decode of the sequence that
    ``accepted`` ``[last - first]`` was measured on (``anchor_acceptance``): the first round is
    anchored at the first response token (the prefill's token), each next one at the bonus of the
    last; a round keeps at most the tokens still to come (the exact accounting).

    >>> walk_rounds(torch.tensor([2, 0, 0, 1, 0, 0]))   # anchors 0..5 of a 7-token response
    [3, 2, 1]
    """
    rounds, pos, last = [], 0, accepted.numel()
    while pos < last:
        length = min(int(accepted[pos]) + 1, last - pos)
        rounds.append(length)
        pos += length
    return rounds


def decode_tau(drafter: DFlashDraftModel, target_model, data: SequenceSet, chunk: int = 64) -> float:
    """The tau (mean over sequences of the mean acceptance length, bonus included) that T = 0 chain
    decoding with ``drafter`` gets on ``data``, when ``data`` holds the target's own greedy
    continuations: each round's acceptance is read off the teacher-forced forward, no decoding.

    The mean over every anchor (``chain_acceptance``, the training log's block tau) counts an easy
    stretch once per token in it, while decoding passes it in one round: it overstates tau.
    """
    means = [sum(r) / len(r) for a in anchor_acceptance(drafter, target_model, data, chunk) if (r := walk_rounds(a))]
    return sum(means) / max(len(means), 1)


@dataclass(frozen=True)
class DFlashTrainConfig:
    batch_size: int = 16  # sequences per step
    anchors: int = 32  # blocks per sequence
    gamma: float | None = None  # None: the paper's value for the block size (7 for 16)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=6e-4, weight_decay=0.0))
    seed: int = 0
    log_every: int = 100
    feature_cache_gib: float = 0.0  # keep the target's features of the whole data set on the device when
    # they fit in this many GiB (computed once, before the clock starts eating the budget); 0: per step


@torch.no_grad()
def feature_cache(target_model, data: SequenceSet, layers: tuple[int, ...], max_gib: float,
                  batch_size: int = 64) -> Tensor | None:
    """The taps ``layers`` of every sequence of ``data`` ``[N, S, F]`` (on ``data``'s device, in the
    dtype a training step computes them in), or None when they would take more than ``max_gib``."""
    if max_gib <= 0:
        return None
    n, s = data.ids.shape
    device = data.ids.device
    with autocast(device):
        first = target_features(target_model, data.ids[:1], layers)
    if n * first[0].numel() * first.element_size() > max_gib * 2**30:
        return None
    cache = torch.empty((n, s, first.shape[-1]), dtype=first.dtype, device=device)
    for i in range(0, n, batch_size):
        with autocast(device):
            cache[i : i + batch_size] = target_features(target_model, data.ids[i : i + batch_size], layers)
    return cache


def train_dflash(drafter: DFlashDraftModel, target_model, data: SequenceSet, cfg: DFlashTrainConfig,
                 budget: Budget, log: Callable[[str], None] | None = print) -> TrainResult:
    """Train ``drafter`` in place on ``data`` (on the drafter's device); the target stays frozen.

    With ``cfg.feature_cache_gib`` the target's features are computed once first; that time comes
    out of ``budget.max_seconds``, so the whole call still ends on time.
    """
    freeze(target_model)
    device = next(drafter.parameters()).device
    data = data.to(device)
    block_size = drafter.config.block_size
    gamma = cfg.gamma or GAMMA.get(block_size, block_size / 2)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    order: list[Tensor] = []
    tau = {"sum": torch.zeros((), device=device), "count": 0}
    begin = time.perf_counter()
    cache = feature_cache(target_model, data, drafter.config.target_layer_ids, cfg.feature_cache_gib)
    if cache is not None:
        spent = time.perf_counter() - begin
        if math.isfinite(budget.max_seconds):
            budget = dataclasses.replace(budget, max_seconds=max(budget.max_seconds - spent, 1.0))
        if log:
            log(f"  target features of {len(data)} sequences cached ({cache.numel() * cache.element_size() / 2**30:.2f} GiB,"
                f" {spent:.1f}s)")
    drafter.train()

    def loss_fn(step: int) -> Tensor:
        if not order:  # a new epoch: a fresh permutation of the sequences
            order.extend(torch.randperm(len(data), generator=generator, device=device).split(cfg.batch_size))
        index = order.pop(0)
        batch = data.batch(index)
        anchors, real = sample_anchors(batch.loss_mask, cfg.anchors, generator)
        blocks = layout_blocks(batch, anchors, real, block_size, drafter.config.mask_token_id, gamma)
        with autocast(device):
            logits = dflash_forward(drafter, target_model, batch, blocks, None if cache is None else cache[index])
        tau["sum"] += chain_acceptance(logits, blocks, block_size)
        tau["count"] += 1
        return weighted_loss(logits, blocks)

    def report(step: int, loss: float) -> None:
        if log:
            mean = float(tau["sum"]) / max(tau["count"], 1)
            log(f"  step {step:6d}  block tau (T=0, teacher-forced, every anchor: above decoding's, see decode_tau;"
                f" mean of {tau['count']} steps) {mean:.2f}")
        tau["sum"].zero_()
        tau["count"] = 0

    result = train_loop(drafter.parameters(), loss_fn, budget, cfg.optim, cfg.log_every, log, report)
    drafter.eval()
    return result
