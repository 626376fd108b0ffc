"""Which target class a model needs: the one place that chooses between the four.

For a model with Gated DeltaNet layers (its recurrent state must be committed explicitly):
``StaticHybridTarget`` (static slabs, CUDA graphs) when it sits on one GPU, else ``HybridTarget``.
For a dense full-attention model: ``StaticTarget`` (static cache, CUDA graphs) on one GPU, else
``HFTarget`` (eager, dynamic cache). All four decode the same tokens; they differ in what they
can serve and how fast.
"""

from __future__ import annotations

from transformers import PreTrainedModel

from ddtree.models.hybrid import GDN, HybridTarget
from ddtree.models.hybrid_static import StaticHybridTarget
from ddtree.models.static_target import StaticTarget
from ddtree.models.target import HFTarget, _text_config

STATIC_LENGTH = 8192  # static-cache rows when no max_length is given (Qwen3-8B: 1.2 GB of bf16 K/V)


def is_hybrid(model: PreTrainedModel) -> bool:
    """True when the model's text config has Gated DeltaNet (``linear_attention``) layers."""
    return GDN in (getattr(_text_config(model), "layer_types", None) or ())


def graphable(config) -> bool:
    """True for a dense decoder of full-attention layers only: no sliding windows or recurrent
    state (the static cache holds plain K/V) and no mixture of experts (its routing picks
    experts by data-dependent indexing, which a CUDA graph cannot replay).

    >>> from transformers import Qwen3Config, Qwen3MoeConfig
    >>> graphable(Qwen3Config()), graphable(Qwen3MoeConfig())
    (True, False)
    """
    layer_types = set(getattr(config, "layer_types", None) or ("full_attention",))
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None) or 0
    return layer_types == {"full_attention"} and not experts


def fast_path_fits(model: PreTrainedModel) -> bool:
    """True when a static target with CUDA graphs can serve the model: all of it on one CUDA
    device, and a hybrid GDN model or ``graphable`` (``fast=true`` forces it anyway)."""
    devices = {p.device for p in model.parameters()}
    one_cuda = len(devices) == 1 and next(iter(devices)).type == "cuda"
    return one_cuda and (is_hybrid(model) or graphable(_text_config(model)))


def target_for(model: PreTrainedModel, max_length: int | None = None, fast: bool | str = "auto",
               fuse_projections: bool | None = None) -> HFTarget:
    """The target class a model needs: a static one (``StaticHybridTarget`` for a model with GDN
    layers, else ``StaticTarget``) when ``fast`` is True, or "auto" and the model fits it
    (``fast_path_fits``); otherwise ``HybridTarget`` or ``HFTarget``. Every choice decodes the same tokens.
    ``fuse_projections`` is handed to a static target (each layer's same-input projections as one GEMM;
    the model's weights become views, see ``fused.fuse_projections``; None: on with CUDA graphs); the
    eager targets ignore it.

    >>> target_for(tiny_hybrid_target()).__class__.__name__   # doctest: +SKIP
    'HybridTarget'
    """
    if fast not in (True, False, "auto"):
        raise ValueError(f"fast must be true, false or auto, got {fast!r}")
    static = fast is True or (fast == "auto" and fast_path_fits(model))
    if not static:
        return HybridTarget(model, max_length) if is_hybrid(model) else HFTarget(model, max_length)
    cls = StaticHybridTarget if is_hybrid(model) else StaticTarget
    return cls(model, max_length or STATIC_LENGTH, fuse_projections=fuse_projections)
