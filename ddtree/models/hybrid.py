"""A hybrid Gated DeltaNet / full-attention LM (Qwen3.5, Qwen3.6) as the loop's target.

A plain forward commits every token it sees into a GDN layer's recurrent state and conv
window, and nothing rolls that back: ``DynamicCache.crop`` trims K/V and conv windows but leaves
the recurrent state holding the rejected tokens, without raising. So the tree forward runs the
GDN layers in a no-commit verify mode (``gdn_tree_forward``: each node sees only its root path)
and keeps what the commit needs; ``commit`` then writes, per GDN layer, the state a sequential
forward over the accepted path would have left, and keeps the path's K/V rows in the attention
layers. Full-attention layers see the ancestor mask and positions ``past + depth`` as in
``HFTarget``; ``Qwen3_5TextModel`` takes the mask as a dict keyed by layer type and broadcasts
2-D position ids to its mRoPE streams (both checked in transformers 5.17 and 5.24).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel
from transformers.cache_utils import DynamicLayer, LinearAttentionLayer

from ddtree.masks.tree import additive_tree_mask
from ddtree.models.gdn_tree import TreeTables
from ddtree.models.gdn_tree_layer import (
    GDNTreeVerify,
    commit_gdn_path,
    gdn_tree_forward,
    read_gdn_state,
    write_gdn_state,
)
from ddtree.models.target import HFTarget
from ddtree.types import TargetOutput, VerifyInputs

GDN = "linear_attention"
ATTENTION = "full_attention"
_CACHE_LAYER = {GDN: LinearAttentionLayer, ATTENTION: DynamicLayer}
# What gdn_tree_forward reads from a Qwen3_5GatedDeltaNet (Qwen3-Next fuses its projections: not this).
_GDN_PARTS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "conv1d", "A_log", "dt_bias", "norm", "out_proj")


class HybridTarget(HFTarget):
    """``HFTarget`` for Qwen3.5/3.6-style models: GDN layers verified without committing.

    Between ``forward_tree`` and ``commit`` the attention layers hold the prefix plus every
    tree node (as in ``HFTarget``) and the GDN layers still hold the committed prefix only; the
    per-layer ``GDNTreeVerify`` stash carries what the commit needs. ``commit(path)`` leaves the
    cache a sequential forward over the accepted path would have built. Works for
    ``Qwen3_5ForCausalLM`` and for ``Qwen3_5ForConditionalGeneration`` (text model nested at
    ``model.model.language_model``; ``get_decoder()`` returns it in both cases).

    >>> target = HybridTarget(Qwen3_5ForCausalLM.from_pretrained(name, use_safetensors=True))  # doctest: +SKIP
    """

    def __init__(self, model: PreTrainedModel, max_length: int | None = None) -> None:
        super().__init__(model, max_length)
        self.layer_types: tuple[str, ...] = tuple(getattr(self.config, "layer_types", None) or ())
        if len(self.layer_types) != len(self.layers):
            raise ValueError(f"config.layer_types has {len(self.layer_types)} entries for {len(self.layers)} layers")
        unknown = sorted(set(self.layer_types) - set(_CACHE_LAYER))
        if unknown:
            raise NotImplementedError(
                f"layer types {unknown} are not supported: HybridTarget handles only {sorted(_CACHE_LAYER)} "
                "layers (their state could not be rolled back exactly)"
            )
        self.gdn_modules: dict[int, nn.Module] = {}
        for i, kind in enumerate(self.layer_types):
            if kind != GDN:
                continue
            module = getattr(self.layers[i], "linear_attn", None)
            missing = [p for p in _GDN_PARTS if not hasattr(module, p)]
            if missing:
                raise NotImplementedError(
                    f"layer {i} is {kind!r} but its token mixer {type(module).__name__} lacks {missing}: "
                    "HybridTarget verifies Qwen3.5/3.6 Qwen3_5GatedDeltaNet layers only"
                )
            self.gdn_modules[i] = module
        if not self.gdn_modules:
            raise ValueError("the model has no Gated DeltaNet layers: use ddtree.models.HFTarget")
        self._pending: dict[int, GDNTreeVerify] | None = None  # stash of the uncommitted tree
        self._pending_parents: list[int] = []

    # -- the three calls the loop makes ------------------------------------------------------
    def prefill(self, input_ids: Tensor, taps_sink: Callable[[Tensor], None] | None = None) -> TargetOutput:
        """A normal forward over the prompt: it commits every prompt token, which is right."""
        self._pending = None
        return super().prefill(input_ids, taps_sink)

    def forward_tree(self, inputs: VerifyInputs) -> TargetOutput:
        """Logits ``[n, vocab]`` (and taps) for every node; the GDN cache is not touched."""
        if self.cache is None:
            raise RuntimeError("forward_tree before prefill: there is no committed prefix to verify against")
        if self._pending is not None:
            raise RuntimeError(
                "forward_tree called twice without commit: the cache still holds the previous tree's "
                "nodes, and a second tree would be verified against rejected tokens"
            )
        if inputs.past_length != self.past_length:
            raise ValueError(
                f"the tree was laid out after {inputs.past_length} tokens, the cache holds {self.past_length}"
            )
        self._check_cache()
        mask = {ATTENTION: additive_tree_mask(inputs.attention_mask, inputs.past_length, self.dtype), GDN: None}
        stash: dict[int, GDNTreeVerify] = {}
        try:
            with gdn_verify_mode(self.gdn_modules, self.cache, inputs.parents, stash):
                out = self._forward(inputs.input_ids, inputs.position_ids, mask, logits_to_keep=0)
            if stash.keys() != self.gdn_modules.keys():
                missing = sorted(self.gdn_modules.keys() - stash.keys())
                self.cache = None  # those layers may have committed the tree: nothing is trustworthy
                raise RuntimeError(
                    f"GDN layers {missing} did not run in verify mode (did the model bypass "
                    "linear_attn.forward?); their state may hold tree tokens, so the cache was dropped: "
                    "prefill again"
                )
        except BaseException:
            self._drop_tree_rows()
            raise
        self._pending, self._pending_parents = stash, inputs.parents.tolist()
        return out

    def commit(self, path: Sequence[int]) -> None:
        """Keep the accepted root path: GDN states from the stash, attention K/V rows by index."""
        if self._pending is None:
            raise RuntimeError("commit without a pending forward_tree: nothing to commit")
        path = [int(node) for node in path]
        self._check_path(path)
        on_device: dict[torch.device, Tensor] = {}  # one host-to-device copy per device, not per layer
        for i, verify in self._pending.items():
            device = verify.conv_inputs.device
            if device not in on_device:
                on_device[device] = torch.tensor(path, dtype=torch.long, device=device)
            write_gdn_state(self.cache, i, commit_gdn_path(verify, on_device[device]), tokens=len(path))
        self._pending = None
        super().commit(path)

    def _check_path(self, path: list[int]) -> None:
        parents = self._pending_parents
        for k, node in enumerate(path):
            if not 0 <= node < len(parents) or parents[node] != (path[k - 1] if k else -1):
                raise ValueError(f"path {path} is not a root path of the verified tree (parents {parents})")

    # -- cache bookkeeping -------------------------------------------------------------------
    def _kv_layers(self) -> list:
        return [layer for layer, kind in zip(self.cache.layers, self.layer_types) if kind == ATTENTION]

    def _drop_tree_rows(self) -> None:
        """After a failed tree forward: back to the committed prefix (attention rows only were added)."""
        self._pending = None
        if self.cache is None:
            return
        for layer in self._kv_layers():
            if getattr(layer, "is_initialized", False) and layer.keys.shape[-2] > self.past_length:
                layer.keys = layer.keys[..., : self.past_length, :]
                layer.values = layer.values[..., : self.past_length, :]

    def _check_cache(self) -> None:
        # Exact types: a subclass (e.g. LinearAttentionAndFullAttentionLayer) holds state we do not commit.
        layers = self.cache.layers
        if len(layers) != len(self.layer_types):
            raise NotImplementedError(f"the cache has {len(layers)} layers, the model {len(self.layer_types)}")
        for i, (layer, kind) in enumerate(zip(layers, self.layer_types)):
            if type(layer) is not _CACHE_LAYER[kind]:
                raise NotImplementedError(
                    f"cache layer {i} ({kind}) is a {type(layer).__name__}, not a {_CACHE_LAYER[kind].__name__}: "
                    "HybridTarget cannot commit it exactly"
                )


@contextmanager
def gdn_verify_mode(
    modules: dict[int, nn.Module],  # layer index -> Qwen3_5GatedDeltaNet
    cache,
    parents: Tensor,  # [n] long, parents[i] < i, -1 for the root
    stash: dict[int, GDNTreeVerify],
) -> Iterator[None]:
    """Within the block, each GDN module's forward is the no-commit tree forward.

    The module reads its committed state from ``cache`` (never writes it) and leaves its
    ``GDNTreeVerify`` in ``stash[layer]``. The original forwards (including any instance-level
    wrapper, e.g. an accelerate hook) are restored on exit, also after an exception.
    """
    on_device: dict[torch.device, TreeTables] = {}  # the tree's tables, once per device
    with patched_forwards(modules, lambda i, module: _tree_forward(module, i, cache, parents, on_device, stash)):
        yield


@contextmanager
def patched_forwards(modules: dict[int, nn.Module], forward_for) -> Iterator[None]:
    """Within the block, ``modules[i].forward`` is ``forward_for(i, modules[i])``; the original forwards
    (including any instance-level wrapper, e.g. an accelerate hook) come back on exit, also after
    an exception."""
    saved: dict[int, object] = {}
    try:
        for i, module in modules.items():
            saved[i] = module.__dict__.get("forward")
            module.forward = forward_for(i, module)
        yield
    finally:
        for i, original in saved.items():
            if original is None:
                del modules[i].forward  # back to the class's forward
            else:
                modules[i].forward = original


def _tree_forward(module: nn.Module, layer_idx: int, cache, parents: Tensor, on_device: dict, stash: dict):
    kernel_size = module.conv_kernel_size

    def forward(hidden_states: Tensor, *args, **kwargs) -> Tensor:  # [1, n, D] -> [1, n, D]
        if layer_idx in stash:
            raise RuntimeError(f"GDN layer {layer_idx} ran twice in one tree forward")
        device = hidden_states.device
        if device not in on_device:  # the tree's tables, built once per device, not once per layer
            on_device[device] = TreeTables.of(parents.to(device), kernel_size)
        tables = on_device[device]
        state = read_gdn_state(cache, layer_idx, kernel_size)
        out, verify = gdn_tree_forward(module, hidden_states, tables.parents, state, tables)
        stash[layer_idx] = verify
        return out

    return forward
