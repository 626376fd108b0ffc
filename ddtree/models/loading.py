"""Checkpoint resolution: a local directory, or a hub name for users who have hub access."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file


def resolve_checkpoint(name_or_path: str | Path, patterns: tuple[str, ...] = ("*.json", "*.safetensors")) -> Path:
    """A local directory as is; otherwise a hub snapshot (weights in safetensors only)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.exists() or str(name_or_path).startswith((".", "/", "~")):
        raise FileNotFoundError(f"checkpoint directory {str(name_or_path)!r} does not exist")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(name_or_path), allow_patterns=list(patterns)))
    except Exception as err:  # offline, unknown repo, no access: all need the same advice
        raise FileNotFoundError(
            f"could not find checkpoint {str(name_or_path)!r}: it is not a local directory and the hub "
            f"download failed ({type(err).__name__}: {err}). Pass a local path, or check the name and "
            "your network / HF_HUB_OFFLINE setting."
        ) from err


def read_json(path: Path) -> dict[str, Any]:
    file = path / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"{path} has no config.json")
    return json.loads(file.read_text())


def read_safetensors(path: Path) -> dict:
    """Every tensor of every ``*.safetensors`` file in the directory (pickles are never read)."""
    files = check_safetensors(path)
    if not files:
        raise FileNotFoundError(f"{path} holds no *.safetensors file (other weight formats are not read)")
    state = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def check_safetensors(path: Path) -> list[Path]:
    """The directory's ``*.safetensors`` files, each header read (no tensor is loaded).

    A truncated or corrupt file fails here, naming it, before any weights load: safetensors
    checks that the header's offsets cover the file exactly.
    """
    files = sorted(Path(path).glob("*.safetensors"))
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                f.keys()
        except SafetensorError as err:
            raise ValueError(f"{file} is not a readable safetensors file ({err}): it is truncated or corrupt; "
                             "copy or download it again") from err
    return files
