"""Loading real targets and tokenizers: a local directory or a hub name, safetensors only.

    >>> target = HFTarget(load_causal_lm("Qwen/Qwen3-8B", dtype="bfloat16", device_map="cuda"))  # doctest: +SKIP
    >>> tokenizer = load_tokenizer("Qwen/Qwen3-8B")                                               # doctest: +SKIP

Configs name dtypes as strings ("bfloat16"); ``as_dtype`` turns them into ``torch.dtype``.
"""

from __future__ import annotations

from pathlib import Path

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def as_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """``"bfloat16"`` -> ``torch.bfloat16``; a dtype or None passes through.

    >>> as_dtype("bf16")
    torch.bfloat16
    """
    if name is None or isinstance(name, torch.dtype):
        return name
    key = str(name).removeprefix("torch.")
    if key not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use one of {', '.join(_DTYPES)}")
    return _DTYPES[key]


# A directory holding any of these has a tokenizer that ``AutoTokenizer`` can read.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def _missing(name_or_path: str | Path, what: str, err: Exception) -> FileNotFoundError:
    return FileNotFoundError(
        f"could not load the {what} {str(name_or_path)!r} ({type(err).__name__}: {err}). Pass a local "
        "directory or a hub name; for a hub name check the spelling, your network and HF_HUB_OFFLINE."
    )


def load_causal_lm(
    name_or_path: str | Path,
    dtype: str | torch.dtype = "auto",
    device_map: str | dict | None = None,
    attn_implementation: str = "sdpa",
):
    """``AutoModelForCausalLM.from_pretrained`` as the protocol loads a target.

    SDPA attention (the tree verify passes a 4-D float mask, which FlashAttention-2 cannot
    take), weights from safetensors only, ``dtype="auto"`` keeps the checkpoint's dtype.
    ``device_map`` is a device (``"cuda:0"``) or an accelerate map (``"auto"`` spreads a large
    target over the visible GPUs).
    """
    from transformers import AutoModelForCausalLM

    if name_or_path is None:
        raise ValueError("no target checkpoint given: set target.path to a local directory or a hub name")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(name_or_path),
            dtype=dtype if dtype == "auto" else as_dtype(dtype),
            device_map=device_map,
            attn_implementation=attn_implementation,
            use_safetensors=True,
        )
    except OSError as err:
        raise _missing(name_or_path, "target model", err) from err
    return model.eval()


def load_tokenizer(name_or_path: str | Path):
    """The target's tokenizer (its chat template and eos token define the protocol's prompts)."""
    from transformers import AutoTokenizer

    if name_or_path is None:
        raise ValueError("no tokenizer given: set target.path to a local directory or a hub name")
    folder = Path(str(name_or_path)).expanduser()
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        sibling = folder.parent / "tokenizer"
        where = f" ({sibling} holds one, as in a model pair)" if sibling.is_dir() else ""
        raise FileNotFoundError(
            f"{folder} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}){where}: set "
            f"target.tokenizer.name_or_path={sibling if sibling.is_dir() else 'DIR'}, or load a pair directory "
            "with target=pair target.dir=DIR")
    try:
        return AutoTokenizer.from_pretrained(str(name_or_path))
    except OSError as err:
        raise _missing(name_or_path, "tokenizer", err) from err


def check_vocabularies(tokenizer, target) -> None:
    """A tokenizer whose ids the target cannot embed fails here, naming both sizes and where each came from.

    A model's embedding may be padded larger than its tokenizer (Qwen3: 151,936 rows for 151,669
    tokens); only a tokenizer larger than the model's vocabulary is an error.
    """
    tokens, rows = len(tokenizer), int(target.vocab_size)
    if tokens > rows:
        model = getattr(getattr(getattr(target, "model", None), "config", None), "_name_or_path", None) or "the target"
        source = getattr(tokenizer, "name_or_path", None) or "the tokenizer"
        raise ValueError(
            f"the tokenizer ({source}) has {tokens} tokens but the target model ({model}) has a vocabulary of "
            f"{rows}: its ids would fall outside the model's embedding. Use the tokenizer saved with that "
            "model (target.tokenizer.name_or_path=DIR)")
