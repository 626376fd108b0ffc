"""The DFlash block-diffusion drafter, in the z-lab checkpoint format.

A stack of Qwen3-style decoder layers over the block ``[b, m, ..., m]`` (b the bonus token, m
the mask token), with the target's hidden features injected as extra keys and values in every
layer. Features of the layers ``target_layer_ids`` are concatenated, fused by ``fc`` and
``hidden_norm`` once, and then pass each layer's ``k_proj``/``v_proj``/``k_norm`` and RoPE at
their absolute positions. Attention is non-causal. Output position k of the block predicts the
token k places after b (no shift). Embedding and LM head are the target's.

State-dict keys: ``fc``, ``hidden_norm``, ``norm``, ``layers.{i}.*``; nothing else.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor, nn

from ddtree.models.flex_attention import FlexLayout, attend
from ddtree.models.loading import read_json, read_safetensors, resolve_checkpoint


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    num_target_layers: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    block_size: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    extra: dict = field(default_factory=dict, compare=False)  # other keys, kept on save

    def __post_init__(self) -> None:
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers]
        if bad or not self.target_layer_ids:
            raise ValueError(
                f"DFlash target_layer_ids {list(self.target_layer_ids)} must be non-empty and within "
                f"0..{self.num_target_layers - 1} (num_target_layers={self.num_target_layers})"
            )
        if self.block_size < 2:
            raise ValueError(f"DFlash block_size must be >= 2, got {self.block_size}")

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config") -> "DFlashConfig":
        dflash = raw.get("dflash_config")
        if not isinstance(dflash, dict):
            raise ValueError(
                f"{source} has no 'dflash_config' section: not a DFlash drafter checkpoint (z-lab "
                "format: dflash_config.mask_token_id and dflash_config.target_layer_ids)"
            )
        if dflash.get("mask_token_id") is None:
            raise ValueError(f"{source}: dflash_config.mask_token_id is missing; the drafter needs its mask token id")
        layer_ids = dflash.get("target_layer_ids", raw.get("target_layer_ids"))
        if layer_ids is None:
            raise ValueError(f"{source}: dflash_config.target_layer_ids is missing")
        rope = raw.get("rope_parameters") or {}
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        extra = {k: v for k, v in raw.items() if k not in known and k != "dflash_config"}
        return cls(
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=raw["num_attention_heads"],
            num_key_value_heads=raw.get("num_key_value_heads", raw["num_attention_heads"]),
            head_dim=raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"],
            vocab_size=raw["vocab_size"],
            num_target_layers=raw["num_target_layers"],
            mask_token_id=int(dflash["mask_token_id"]),
            target_layer_ids=tuple(int(i) for i in layer_ids),
            block_size=int(raw.get("block_size", dflash.get("block_size", 16))),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(raw.get("rope_theta", rope.get("rope_theta", 1_000_000.0))),
            max_position_embeddings=raw.get("max_position_embeddings", 40960),
            extra=extra,
        )

    def to_dict(self) -> dict:
        """The z-lab ``config.json`` layout (a Qwen3 config plus the DFlash keys)."""
        out = {k: v for k, v in asdict(self).items() if k not in ("extra", "mask_token_id", "target_layer_ids")}
        out.update(
            architectures=["DFlashDraftModel"],
            auto_map={"AutoModel": "dflash.DFlashDraftModel"},
            model_type="qwen3",
            hidden_act="silu",
            attention_bias=False,
            tie_word_embeddings=False,
            dflash_config={"mask_token_id": self.mask_token_id, "target_layer_ids": list(self.target_layer_ids)},
        )
        return {**self.extra, **out}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Default (unscaled) RoPE tables for ``positions`` ``[T]`` (each ``[T, head_dim]``) or ``[B, T]``
    (each ``[B, 1, T, head_dim]``: one table per sequence, broadcast over the heads)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = positions.float()[..., None] * inv
    emb = torch.cat([angles, angles], dim=-1)
    if positions.ndim == 2:
        emb = emb[:, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:  # x [B, heads, T, d]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class DFlashAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.n_heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * d, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * d, bias=False)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def keys_values(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """K (normed, rotated) and V of ``x`` ``[B, T, H]``: each ``[B, n_kv, T, d]``."""
        b, t = x.shape[:2]
        k = self.k_norm(self.k_proj(x).view(b, t, self.n_kv, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def forward(self, x: Tensor, ctx_k: Tensor, ctx_v: Tensor, cos: Tensor, sin: Tensor,
                mask: Tensor | FlexLayout | None = None) -> Tensor:
        """``mask``: None (every key visible), an additive mask over context + block, or a
        ``FlexLayout`` of the block over the context buffers: the block's K/V are then written into
        ``ctx_k``/``ctx_v`` at its rows (``mask.rows``, past the committed ones, overwritten by the
        next absorb) and block-sparse FlexAttention reads the buffers, no copy and no mask."""
        b, t = x.shape[:2]  # x [B, T, H] normed block states; ctx_k/ctx_v [B, n_kv, C, d] (B = 1 decoding)
        q = self.q_norm(self.q_proj(x).view(b, t, self.n_heads, self.head_dim)).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k_blk, v_blk = self.keys_values(x, cos, sin)
        if isinstance(mask, FlexLayout):
            ctx_k.index_copy_(2, mask.rows, k_blk)
            ctx_v.index_copy_(2, mask.rows, v_blk)
            out = attend(q, ctx_k, ctx_v, mask.block_mask)  # [1, n_heads, T, d]
            return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))
        k, v = torch.cat([ctx_k, k_blk], dim=2), torch.cat([ctx_v, v_blk], dim=2)
        groups = self.n_heads // self.n_kv
        if mask is None or mask.shape[-2] == 1:
            # Every query row sees the same keys: fold the query heads of each K/V head into the
            # query length (head j * groups + i, row t -> row i * T + t) instead of copying K/V.
            folded = q.reshape(b, self.n_kv, groups * t, self.head_dim)
            out = F.scaled_dot_product_attention(folded, k, v, attn_mask=mask).reshape(b, self.n_heads, t, -1)
        else:  # row-dependent masks (training): expand K/V to every query head
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class DFlashMLP(nn.Module):
    """The gated SiLU MLP (the checkpoint's ``mlp.gate_proj`` / ``up_proj`` / ``down_proj``). A module
    of its own, with ``act_fn``, so that ``ddtree.models.fused`` can run its ``silu(gate) * up`` as one
    kernel inside the drafter's graph."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = DFlashMLP(h, i)

    def forward(self, x: Tensor, ctx_k: Tensor, ctx_v: Tensor, cos: Tensor, sin: Tensor,
                mask: Tensor | FlexLayout | None = None) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx_k, ctx_v, cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraftModel(nn.Module):
    """The drafter body. Context K/V are computed once per committed token and cached outside.

    >>> model = DFlashDraftModel.from_pretrained("z-lab/Qwen3-8B-DFlash-b16")   # doctest: +SKIP
    """

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, dtype)

    def context_kv(self, taps: Tensor, positions: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Per-layer K/V of target features ``taps`` ``[C, n_feat * H]`` at ``positions`` ``[C]``, or of
        a batch of sequences' ``[B, S, n_feat * H]`` (positions ``[S]`` or ``[B, S]``)."""
        fused = self.hidden_norm(self.fc(taps))
        fused = fused[None] if fused.ndim == 2 else fused  # [B, C, H]
        cos, sin = self.rope(positions, fused.dtype)
        return [layer.self_attn.keys_values(fused, cos, sin) for layer in self.layers]

    def forward(self, block: Tensor, positions: Tensor, context: list[tuple[Tensor, Tensor]],
                mask: Tensor | FlexLayout | None = None) -> Tensor:
        """Block embeddings ``[B, T, H]`` at ``positions`` ``[T]`` or ``[B, T]`` -> normed states ``[B, T, H]``
        (B = 1 when decoding; training runs a batch of sequences, each over its own context)."""
        cos, sin = self.rope(positions, block.dtype)
        x = block
        for layer, (ctx_k, ctx_v) in zip(self.layers, context):
            x = layer(x, ctx_k, ctx_v, cos, sin, mask)
        return self.norm(x)

    # -- z-lab checkpoint format -------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu") -> "DFlashDraftModel":
        path = resolve_checkpoint(name_or_path)
        model = cls(DFlashConfig.from_dict(read_json(path), source=str(path / "config.json")))
        state = read_safetensors(path)
        expected = set(model.state_dict())
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        if missing or unexpected:
            raise ValueError(
                f"DFlash checkpoint {path} does not match its config: missing keys {missing[:8]}, "
                f"unexpected keys {unexpected[:8]}"
            )
        model.load_state_dict(state, strict=True)
        return model.to(device=device, dtype=dtype or next(iter(state.values())).dtype).eval()

    def save_pretrained(self, directory: str | Path) -> None:
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(self.config.to_dict(), indent=2) + "\n")
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(out / "model.safetensors"))
