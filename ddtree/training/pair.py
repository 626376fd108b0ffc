"""The shipped model pair: a small target, its DFlash drafter and MTP head, in one directory.

    pair/
      README.md              model card, rendered from metrics.json
      metrics.json           what the training pipeline measured
      heldout_prompts.jsonl  code prefixes from held-out modules ({"id", "text"} per line)
      tokenizer/             tokenizer.json (byte-level BPE; <|endoftext|>, <|pad|>, <|mask|>)
      target/                a transformers Qwen3ForCausalLM or Qwen3_5ForCausalLM (config.json, model.safetensors)
      dflash/                z-lab DFlash layout (DFlashDraftModel.from_pretrained)
      mtp/                   mtp.* layout (MTPHead.from_pretrained); a hybrid pair keeps these
                             tensors in target/model.safetensors instead, as Qwen3.5/3.6 ship them

Every part loads with the decoding side's own loaders; nothing here converts weights.

    >>> pair = load_pair("assets/pair")                       # doctest: +SKIP
    >>> pair.target.config.num_hidden_layers                  # doctest: +SKIP
    6
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from ddtree.models.dflash import DFlashDraftModel
from ddtree.training.tokenizer import load_tokenizer

TARGET, DFLASH, MTP, TOKENIZER = "target", "dflash", "mtp", "tokenizer"
PROMPTS, METRICS, CARD = "heldout_prompts.jsonl", "metrics.json", "README.md"


@dataclass
class Pair:
    target: torch.nn.Module  # a transformers causal LM
    tokenizer: PreTrainedTokenizerFast
    dflash: DFlashDraftModel | None
    mtp: torch.nn.Module | None  # ddtree.models.mtp.MTPHead
    prompts: list[dict]  # held-out code prefixes
    metrics: dict


def load_pair(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> Pair:
    """Load every part present in ``path`` (drafters that are absent are None)."""
    path = Path(path)
    if not (path / TARGET / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} is not a model pair directory (no {TARGET}/config.json); the shipped pair is "
            "assets/pair, built by experiments/make_shipped_pair.sh"
        )
    target = AutoModelForCausalLM.from_pretrained(str(path / TARGET), dtype=dtype, attn_implementation="sdpa",
                                                  use_safetensors=True)
    target = target.to(device).eval()
    dtype = target.get_input_embeddings().weight.dtype
    dflash = None
    if (path / DFLASH / "config.json").is_file():
        dflash = DFlashDraftModel.from_pretrained(path / DFLASH, dtype=dtype, device=device)
    mtp = None
    if (where := mtp_location(path)) is not None:
        from ddtree.models.mtp import MTPHead

        mtp = MTPHead.from_pretrained(where, dtype=dtype, device=device)
    return Pair(target, load_tokenizer(path / TOKENIZER), dflash, mtp, read_prompts(path / PROMPTS),
                read_json(path / METRICS))


def mtp_location(path: str | Path) -> Path | None:
    """The directory whose safetensors hold the pair's ``mtp.*`` tensors: ``mtp/``, or ``target/``
    when the target checkpoint carries its own MTP layer (``mtp_num_hidden_layers`` in its config)."""
    path = Path(path)
    if (path / MTP / "config.json").is_file():
        return path / MTP
    config = read_json(path / TARGET / "config.json")
    return path / TARGET if config.get("mtp_num_hidden_layers") else None


def save_pair(path: str | Path, target, tokenizer, dflash: DFlashDraftModel | None = None, mtp=None,
              prompts: list[dict] = (), metrics: dict | None = None, mtp_in_target: bool = False) -> Path:
    """Write a pair directory in the layout above (weights in their current dtype); ``mtp_in_target``
    writes the MTP head into the target's checkpoint, as a Qwen3.5/3.6 checkpoint carries it."""
    path = Path(path)
    target.save_pretrained(str(path / TARGET))
    tokenizer.save_pretrained(str(path / TOKENIZER))
    if dflash is not None:
        dflash.save_pretrained(path / DFLASH)
    if mtp is not None and mtp_in_target:
        mtp.save_into(path / TARGET)
    elif mtp is not None:
        mtp.save_pretrained(path / MTP)
    write_prompts(list(prompts), path / PROMPTS)
    if metrics is not None:
        write_json(metrics, path / METRICS)
        (path / CARD).write_text(render_card(metrics))
    return path


TINY_TEXTS = [
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n        self.items.append(x)\n",
    "import os\n\n\ndef walk(root):\n    for name in os.listdir(root):\n        yield os.path.join(root, name)\n",
]


def tiny_pair(path: str | Path, seed: int = 0, hybrid: bool = False) -> Path:
    """A pair directory of tiny random-weight models and a tiny tokenizer (tests, examples); ``hybrid``:
    a Qwen3.5-layout Gated DeltaNet target carrying its MTP head in its own checkpoint.

    >>> load_pair(tiny_pair(tmp_path)).dflash.config.block_size        # doctest: +SKIP
    8
    """
    from ddtree.models.mtp import MTPHead
    from ddtree.training.dflash import new_dflash
    from ddtree.training.lm import HybridTargetSpec, TargetSpec, build_target
    from ddtree.training.tokenizer import train_tokenizer

    tok = train_tokenizer(TINY_TEXTS * 4, vocab_size=300)
    spec = (HybridTargetSpec if hybrid else TargetSpec).tiny(len(tok))
    target = build_target(spec, tok.eos_token_id, tok.pad_token_id, seed=seed).eval()
    dflash = new_dflash(target, tok.mask_token_id, block_size=8, num_layers=1, num_taps=2, seed=seed).eval()
    mtp = MTPHead.for_target(target, seed=seed)
    prompts = [{"id": f"tiny:{i}", "text": text} for i, text in enumerate(TINY_TEXTS)]
    return save_pair(path, target, tok, dflash, mtp, prompts, mtp_in_target=hybrid)


def read_prompts(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_prompts(prompts: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in prompts), encoding="utf-8")


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def write_json(data: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def weight_bytes(path: Path) -> int:
    """Bytes of every safetensors file under ``path``."""
    return sum(f.stat().st_size for f in Path(path).rglob("*.safetensors"))


def weight_dtype(path: Path) -> str:
    """The dtype the pair's weights are stored in ("bfloat16"; "mixed" if the files differ)."""
    from safetensors import safe_open

    dtypes = set()
    for file in sorted(Path(path).rglob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            dtypes.update(str(f.get_slice(k).get_dtype()) for k in f.keys())
    if len(dtypes) != 1:
        return "mixed" if dtypes else "n/a"
    (dtype,) = dtypes
    return {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}.get(dtype, dtype)


def _fmt(value, digits: int = 2) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return "n/a" if value is None else str(value)


def _per_temperature(reg: dict) -> str:
    """``"4096 at T = 0.0, 2048 at T = 1.0"`` (older records: the temperature list only)."""
    counts = reg.get("sequences_per_temperature")
    if not counts:
        return f"temperatures {_fmt(reg.get('temperatures'))}"
    return ", ".join(f"{n} at T = {t}" for t, n in counts.items())


def _docstrings(reg: dict) -> str:
    n = reg.get("docstring_prompts")
    if not n:
        return ""
    of = f" of the {reg['prompts']}" if reg.get("prompts") else ""
    return f"; {n}{of} prompts end just after a function's docstring, the rest are random windows"


def _steps(part: dict) -> tuple[str, str]:
    """The steps and seconds cells: ``"9841 + 12000"`` when training continued an earlier part."""
    earlier = part.get("continued_from")
    if not earlier:
        return _fmt(part.get("steps")), _fmt(part.get("seconds"), 1)
    return (f"{_fmt(earlier.get('steps'))} + {_fmt(part.get('steps'))}",
            f"{_fmt(earlier.get('seconds'), 1)} + {_fmt(part.get('seconds'), 1)}")


def _trained_on(m: dict) -> str:
    """The training stages' device, or each device with its stages where they differ (a continued
    build keeps the reused target's record and trains the drafters on another machine)."""
    stages: dict[str, list[str]] = {}
    for name in ("target", "regenerate", "dflash", "mtp"):
        device = m.get(name, {}).get("environment", {}).get("device")
        if device:
            stages.setdefault(device, []).append(name)
    if len(stages) < 2:
        return _fmt(m.get("environment", {}).get("device"))
    return ", ".join(f"{device} ({', '.join(names)})" for device, names in stages.items())


def _continuation(dfl: dict, mtp: dict) -> list[str]:
    earlier = dfl.get("continued_from") or mtp.get("continued_from")
    if not earlier:
        return []
    return [f"- The drafters continued from an earlier build's (steps and seconds: earlier + this run), which trained "
            f"on {_fmt(earlier.get('sequences'))} other responses of the same target."]


def _load_lines(hybrid: bool) -> list[str]:
    """How ddtree.load and the entry points reach a pair of this layout (its configs/target/ entry)."""
    if hybrid:
        return ["- `ddtree.load(\"ddtree\", overrides=[\"target=pair_hybrid\", \"target.dir=DIR\"])` (without "
                "`target.dir`: this pair in `assets/pair_hybrid`) builds any strategy on it;",
                "- `python experiments/run.py target=pair_hybrid target.dir=DIR` and "
                "`python experiments/main.py target=pair_hybrid target.dir=DIR`;"]
    return ["- `ddtree.load(\"ddtree\", target=\"DIR\")` (no target: this pair in `assets/pair`) builds any strategy on it;",
            "- `python experiments/run.py target=pair target.dir=DIR` and `python experiments/main.py target.dir=DIR`;"]


def render_card(m: dict) -> str:
    """The model card: every number comes from the pipeline's ``metrics.json``."""
    corpus, tgt, reg = m.get("corpus", {}), m.get("target", {}), m.get("regenerate", {})
    dfl, mtp, env = m.get("dflash", {}), m.get("mtp", {}), m.get("environment", {})
    evaluated_on = _fmt((m.get("evaluate_environment") or env).get("device"))
    title = ("# ddtree hybrid pair: a small Qwen3.5-layout code LM with its native MTP layer and a DFlash drafter"
             if mtp.get("in_target") else "# ddtree shipped pair: a small code LM with its DFlash drafter and MTP head")
    lines = [
        title,
        "",
        "A tiny target trained from scratch so that speculative decoding can be run and measured on",
        "a CPU with real (not random) models. It continues Python code; it does not solve tasks.",
        "",
        "## Load",
        "The tokenizer lives in `tokenizer/`, beside the target (`target/` holds no tokenizer files).",
        *_load_lines(bool(mtp.get("in_target"))),
        "- `target=hf target.path=DIR/target target.tokenizer.name_or_path=DIR/tokenizer` (drafter checkpoints:",
        f"  `target.drafters.dflash=DIR/dflash`, `target.drafters.mtp=DIR/{TARGET if mtp.get('in_target') else MTP}`);",
        "- `ddtree.training.pair.load_pair(DIR)` returns every part as a module (training and analysis).",
        "",
        "## Data",
        f"- Corpus: the Python standard library source ({_fmt(corpus.get('source'))}), tests and generated",
        f"  tables excluded; {_fmt(corpus.get('train_files'))} training files ({_fmt(corpus.get('train_tokens'))} tokens),",
        f"  {_fmt(corpus.get('heldout_files'))} held-out modules ({_fmt(corpus.get('heldout_tokens'))} tokens): every module",
        "  whose sha256(name) falls in a 5 % bucket (`ddtree.training.corpus.is_heldout`).",
        f"- Tokenizer: byte-level BPE, {_fmt(m.get('tokenizer', {}).get('vocab_size'))} tokens, trained on the training split.",
        f"- Drafter data: {_fmt(reg.get('sequences'))} responses regenerated by the target itself "
        f"({_fmt(reg.get('prompt_tokens'))}-token corpus prompts, {_fmt(reg.get('new_tokens'))} new tokens;",
        f"  {_per_temperature(reg)}){_docstrings(reg)}.",
        *_continuation(dfl, mtp),
        "",
        "## Models",
        "| part | parameters | steps | wall time (s) | final loss | format |",
        "|---|---|---|---|---|---|",
        f"| target ({tgt.get('architecture', 'Qwen3')}, {_fmt(tgt.get('layers'))} layers, hidden {_fmt(tgt.get('hidden_size'))}) | "
        f"{_fmt(tgt.get('parameters'))} | {_fmt(tgt.get('steps'))} | {_fmt(tgt.get('seconds'), 1)} | "
        f"{_fmt(tgt.get('final_loss'), 3)} | transformers |",
        f"| DFlash drafter (block {_fmt(dfl.get('block_size'))}, {_fmt(dfl.get('layers'))} layers, "
        f"taps {_fmt(dfl.get('taps'))}) | {_fmt(dfl.get('parameters'))} | {' | '.join(_steps(dfl))} | "
        f"{_fmt(dfl.get('final_loss'), 3)} | z-lab DFlash |",
        f"| MTP head ({_fmt(mtp.get('depth'))} chained steps trained) | {_fmt(mtp.get('parameters'))} | "
        f"{' | '.join(_steps(mtp))} | {_fmt(mtp.get('final_loss'), 3)} | "
        f"{'mtp.* in target/model.safetensors' if mtp.get('in_target') else 'mtp.*'} |",
        "",
        f"Held-out perplexity of the target: **{_fmt(tgt.get('heldout_perplexity'))}** "
        f"(windows of {_fmt(tgt.get('seq_len'))} tokens; kept step {_fmt(tgt.get('best_step'))}).",
        f"Weights: {_fmt(m.get('weight_megabytes'))} MB of {_fmt(m.get('weight_dtype'))} safetensors.",
        "",
        "## Measured acceptance (tau, bonus token included)",
        f"On {_fmt(m.get('tau_setup', {}).get('prompts'))} held-out prompts, "
        f"{_fmt(m.get('tau_setup', {}).get('max_new_tokens'))} new tokens, "
        f"{evaluated_on}:",
        "",
        "| strategy | T = 0 | T = 1 |",
        "|---|---|---|",
    ]
    taus: dict[str, dict[str, float]] = {}
    for row in m.get("tau", []):
        taus.setdefault(row["strategy"], {})[str(row["temperature"])] = row["tau"]
    for name, by_t in taus.items():
        lines.append(f"| {name} | {_fmt(by_t.get('0.0'))} | {_fmt(by_t.get('1.0'))} |")
    if "heldout_decode_tau" in dfl:
        before = dfl.get("heldout_decode_tau_before")
        lines += ["", f"DFlash decode tau on {_fmt(reg.get('decode_tau_sequences'))} greedy held-out continuations "
                  f"({_fmt(m.get('tau_setup', {}).get('max_new_tokens'))} tokens; T = 0 chain rounds read off teacher forcing, "
                  f"`ddtree.training.dflash.decode_tau`): {_fmt(dfl['heldout_decode_tau'])}"
                  + ("" if before is None else f" ({_fmt(before)} before this run's training)") + "."]
    lines += [
        "",
        f"Training wall time {_fmt(m.get('train_seconds', m.get('wall_seconds')), 1)} s on {_trained_on(m)} "
        f"(torch {_fmt(env.get('torch'))}, transformers {_fmt(env.get('transformers'))}); evaluation "
        f"{_fmt(m.get('evaluate_seconds'), 1)} s on {evaluated_on}.",
        "Rebuild: `experiments/make_shipped_pair.sh` (seeded; its header gives the stages and calls).",
        "",
    ]
    return "\n".join(lines)
