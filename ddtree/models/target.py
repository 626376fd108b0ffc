"""A Hugging Face causal LM as the loop's target: prefill, tree forward, commit.

Works for decoder-only models whose attention layers take a 4-D mask and explicit position
ids (Qwen3, Llama, ...). The model may be spread over devices by an ``accelerate`` device map:
token ids go to the embedding's device, logits come from the LM head's device, and taps are
moved explicitly; nothing assumes one device.
"""

from __future__ import annotations

import inspect
from typing import Callable, Sequence

import torch
from torch import Tensor, nn
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from ddtree.masks.tree import additive_tree_mask
from ddtree.types import FINAL_NORM, TargetOutput, VerifyInputs


def to_sink(out: TargetOutput, taps_sink: Callable[[Tensor], None] | None) -> TargetOutput:
    """``out`` itself without a sink; else its taps handed to ``taps_sink`` and ``out`` without them."""
    if taps_sink is None or out.taps is None:
        return out
    taps_sink(out.taps)
    return TargetOutput(tokens=out.tokens, logits=out.logits, taps=None)


def _text_config(model: PreTrainedModel):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


class HFTarget:
    """Wraps a ``transformers`` causal LM (batch 1).

    After ``forward_tree`` the cache holds the prefix plus every tree node; ``commit`` keeps
    the prefix plus the accepted path's K/V rows, gathered into contiguous positions, which is
    exactly the cache a sequential forward over the path would have built.

    >>> target = HFTarget(AutoModelForCausalLM.from_pretrained(name, use_safetensors=True))  # doctest: +SKIP
    """

    def __init__(self, model: PreTrainedModel, max_length: int | None = None) -> None:
        self.model = model.eval()
        self.config = _text_config(model)
        self.decoder = model.get_decoder()
        self.layers: nn.ModuleList = self.decoder.layers
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_length = int(max_length or getattr(self.config, "max_position_embeddings", 1 << 30))
        self.dtype = model.get_input_embeddings().weight.dtype
        self.input_device = model.get_input_embeddings().weight.device
        self.output_device = model.get_output_embeddings().weight.device
        self.cache: DynamicCache | None = None
        self.past_length = 0
        self._taps: tuple[int, ...] = ()
        self._hooks: list = []
        self._captured: dict[int, Tensor] = {}
        # Newer transformers name the cache argument ``cache`` (``past_key_values`` is deprecated).
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    # -- hidden taps -------------------------------------------------------------------------
    def set_taps(self, layers: Sequence[int]) -> None:
        """Capture these layers' outputs on every forward (see ``ddtree.types.FINAL_NORM``)."""
        if tuple(layers) == self._taps and (self._hooks or not layers):
            return
        n_layers = len(self.layers)
        for layer in layers:
            if layer != FINAL_NORM and not 0 <= layer < n_layers:
                raise ValueError(
                    f"hidden tap {layer} is out of range: the target has {n_layers} decoder layers "
                    f"(valid taps 0..{n_layers - 1}, or {FINAL_NORM} for the final norm); is the "
                    "drafter made for this target?"
                )
        for hook in self._hooks:
            hook.remove()
        self._taps, self._hooks = tuple(layers), []
        for layer in dict.fromkeys(layers):
            module = self.decoder.norm if layer == FINAL_NORM else self.layers[layer]
            self._hooks.append(module.register_forward_hook(self._capture(layer)))

    def _capture(self, layer: int):
        def hook(module: nn.Module, args, output) -> None:
            self._captured[layer] = output[0] if isinstance(output, tuple) else output

        return hook

    def _taps_of(self) -> Tensor | None:
        if not self._taps:
            return None
        states = [self._captured[layer][0].to(self.output_device) for layer in self._taps]
        self._captured.clear()
        return torch.cat(states, dim=-1)  # [n, n_taps * hidden]

    # -- the three calls the loop makes ------------------------------------------------------
    def embed(self, token_ids: Tensor) -> Tensor:
        """The target's input embeddings (drafters borrow them)."""
        emb = self.model.get_input_embeddings()
        return emb(token_ids.to(emb.weight.device))

    def lm_head(self, hidden: Tensor) -> Tensor:
        head = self.model.get_output_embeddings()
        return head(hidden.to(head.weight.device))

    def _forward(self, ids: Tensor, positions: Tensor, mask, logits_to_keep: int) -> TargetOutput:
        out = self.model(
            input_ids=ids.to(self.input_device),
            position_ids=positions.to(self.input_device),
            attention_mask=mask,
            use_cache=True,
            **{self._cache_kwarg: self.cache},
            logits_to_keep=logits_to_keep,
        )
        return TargetOutput(tokens=ids[0], logits=out.logits[0], taps=self._taps_of())

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    def prefill(self, input_ids: Tensor, taps_sink: Callable[[Tensor], None] | None = None) -> TargetOutput:
        """Start a sequence: a fresh cache filled with the prompt. Logits of the last row only.
        With ``taps_sink`` the prompt's taps go to it (here in one chunk) instead of the output."""
        ids = input_ids.reshape(1, -1)
        self.cache, self.past_length = self.new_cache(), 0
        positions = torch.arange(ids.shape[1])[None]
        out = self._forward(ids, positions, None, logits_to_keep=1)
        self._check_cache()
        self.past_length = ids.shape[1]
        return to_sink(out, taps_sink)

    def forward_tree(self, inputs: VerifyInputs) -> TargetOutput:
        """One forward over the tree: logits ``[n, vocab]`` and taps for every node."""
        mask = additive_tree_mask(inputs.attention_mask, inputs.past_length, self.dtype)  # a bool tree block expanded
        return self._forward(inputs.input_ids, inputs.position_ids, mask, logits_to_keep=0)

    def commit(self, path: Sequence[int]) -> None:
        """Keep the prefix plus the accepted nodes' K/V rows, contiguous, in path order."""
        past = self.past_length
        keep = torch.cat([torch.arange(past), past + torch.as_tensor(path, dtype=torch.long)])
        for layer in self._kv_layers():
            idx = keep.to(layer.keys.device)
            layer.keys = layer.keys.index_select(-2, idx)
            layer.values = layer.values.index_select(-2, idx)
        self.past_length = past + len(path)

    def _kv_layers(self) -> list:
        """The cache layers that hold one K/V row per token (all of them here)."""
        return list(self.cache.layers)

    def _check_cache(self) -> None:
        # Only plain K/V layers can be rolled back by dropping rows. Anything with state that
        # summarises the past (GDN, Mamba, sliding windows) would silently keep rejected tokens.
        for i, layer in enumerate(self.cache.layers):
            if type(layer) is not DynamicLayer or isinstance(layer, DynamicSlidingWindowLayer):
                raise NotImplementedError(
                    f"cache layer {i} is a {type(layer).__name__}: HFTarget only commits plain "
                    "attention K/V. Use ddtree.models.HybridTarget for Gated DeltaNet models "
                    "(Qwen3.5/3.6), and disable sliding-window attention for others."
                )
