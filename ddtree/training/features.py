"""Target features for drafter training, captured exactly as the decoding side captures them.

``HFTarget.set_taps`` hooks decoder layer outputs (tap i = output of decoder layer i, HF's
``hidden_states[i + 1]``) and the final norm (``FINAL_NORM``). Training uses the same hooks on a
batched forward of the frozen target, so a drafter never trains on features it will not see.

    >>> model = tiny_target("qwen3")                                  # doctest: +SKIP
    >>> target_features(model, ids, (1, 2)).shape                     # doctest: +SKIP
    torch.Size([B, S, 2 * hidden])
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from ddtree.types import FINAL_NORM


@torch.no_grad()
def target_features(model: nn.Module, input_ids: Tensor, layers: Sequence[int],
                    attention_mask: Tensor | None = None) -> Tensor:
    """The taps ``layers`` of ``model`` over ``input_ids`` ``[B, S]``, concatenated: ``[B, S, len(layers) * H]``.

    Runs the decoder only (no LM head). Causal attention makes each position's features depend
    on its prefix alone, so padding after a sequence's end changes nothing before it.
    """
    decoder = model.get_decoder()
    captured: dict[int, Tensor] = {}

    def capture(layer: int):
        def hook(module: nn.Module, args, output) -> None:
            captured[layer] = output[0] if isinstance(output, tuple) else output

        return hook

    hooks = [(decoder.norm if layer == FINAL_NORM else decoder.layers[layer]).register_forward_hook(capture(layer))
             for layer in dict.fromkeys(layers)]
    try:
        device = model.get_input_embeddings().weight.device
        decoder(input_ids=input_ids.to(device), attention_mask=attention_mask, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.cat([captured[layer] for layer in layers], dim=-1)


def freeze(model: nn.Module) -> nn.Module:
    """Eval mode and no gradients: the target (embedding and LM head included) never trains."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
