"""The benchmark protocol over a list of prompts: one record per response, resumable.

For every prompt (this rank's share) and every user turn: render the turn with the chat
template (thinking off), decode with the engine (eos-only stop, ``max_new_tokens``), write the
record. Responses already in the run's records are not recomputed; a later turn reuses the
recorded reply of the earlier one (MT-Bench asks turn 2 after the model's own turn-1 answer).

A prompt that does not fit the target's context with ``max_new_tokens`` is skipped with a
warning naming it (its later turns too, since they would condition on the missing reply); the
summary lists what was skipped, and a rerun skips it again. Any other error stops the run,
with the prompt named.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import asdict, dataclass, field
from typing import Sequence

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ddtree.data import Prompt, encode_turn
from ddtree.engine import SpeculativeEngine
from ddtree.eval.records import RecordWriter, Shard, response_key
from ddtree.metrics.accounting import Accounting, ExactAccounting
from ddtree.metrics.rounds import round_traces
from ddtree.types import GenerationResult

log = logging.getLogger(__name__)

WARMUP_PROMPT = "Warmup"


@dataclass(frozen=True)
class RunSettings:
    """The protocol's knobs for one run (defaults: the papers' protocol)."""

    max_new_tokens: int = 2048
    seed: int = 0
    warmup_tokens: int = 16  # one short decode before timing; 0 skips it
    stop_after: int | None = None  # stop after this many new records (an interruption, for tests)
    progress: bool = True
    max_prompt_tokens: int | None = None  # keep only a prompt's last tokens (base models continuing text)
    accounting: Accounting = ExactAccounting()  # end of run and acceptance lengths (ddtree.metrics.accounting)
    record_rounds: bool = False  # store every round's tree and accepted path in the record (ddtree.metrics.rounds)

    def __post_init__(self) -> None:  # checked before any weights load
        for knob, least, optional in (("max_new_tokens", 1, False), ("warmup_tokens", 0, False),
                                      ("max_prompt_tokens", 1, True), ("stop_after", 0, True)):
            value = getattr(self, knob)
            if optional and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{knob} must be an integer >= {least}, got {value!r}: set {knob}=N with N >= {least}")


@dataclass
class RunSummary:
    computed: int = 0  # responses decoded by this call
    reused: int = 0  # responses found in the records
    skipped: list[str] = field(default_factory=list)  # "prompt id (turn k): reason"
    stopped_early: bool = False


def response_seed(seed: int, key: str) -> int:
    """A per-response sampling seed: the same whatever the sharding or the resume point."""
    return zlib.crc32(f"{seed}/{key}".encode())


def make_record(prompt: Prompt, turn: int, prompt_tokens: int, result: GenerationResult, text: str,
                seed: int, rank: int) -> dict:
    """One response as a JSON-ready dict (tokens, acceptance lengths, stage times, TPOT; the rounds
    as compact lists when the engine recorded them)."""
    rounds = {"rounds": [t.to_json() for t in round_traces(result)]} if result.rounds else {}
    return {
        "key": response_key(prompt.index, turn),
        "prompt_id": prompt.id,
        "index": prompt.index,
        "turn": turn,
        "dataset": prompt.dataset,
        "prompt_tokens": prompt_tokens,
        "tokens": result.tokens,
        "text": text,
        "acceptance_lengths": result.acceptance_lengths,
        "tau": result.mean_acceptance if result.acceptance_lengths else None,  # no round: no acceptance length
        "stage_times": asdict(result.stage_times),
        "time_to_first_token": result.time_to_first_token,
        "decode_time": result.decode_time,
        "tpot": result.time_per_output_token,
        "stopped_by": result.stopped_by,
        "seed": seed,
        "rank": rank,
        **rounds,
    }


def run_prompts(
    engine: SpeculativeEngine,
    tokenizer,
    prompts: Sequence[Prompt],
    writer: RecordWriter,
    done: dict[str, dict],
    settings: RunSettings = RunSettings(),
    shard: Shard = Shard(),
) -> RunSummary:
    """Decode this rank's share of ``prompts``, skipping the responses in ``done``."""
    mine = shard.select(prompts)
    summary = RunSummary()
    todo = sum(response_key(p.index, t) not in done for p in mine for t in range(len(p.turns)))
    if todo and settings.warmup_tokens > 0:
        engine.generate(encode_turn(tokenizer, WARMUP_PROMPT), max_new_tokens=settings.warmup_tokens)
    bar = tqdm(mine, desc=f"rank {shard.rank}" if shard.world_size > 1 else "prompts",
               disable=not settings.progress, position=shard.rank, dynamic_ncols=True)
    with logging_redirect_tqdm():
        for prompt in bar:
            if not run_prompt(engine, tokenizer, prompt, writer, done, settings, shard, summary):
                summary.stopped_early = True
                break
    bar.close()
    return summary


def run_prompt(engine, tokenizer, prompt: Prompt, writer, done, settings: RunSettings, shard: Shard,
                summary: RunSummary) -> bool:
    """All turns of one prompt; False when ``stop_after`` is reached."""
    history: list[tuple[str, str]] = []
    for turn, user in enumerate(prompt.turns):
        key = response_key(prompt.index, turn)
        if key in done:
            summary.reused += 1
            history.append((user, done[key]["text"]))
            continue
        if settings.stop_after is not None and summary.computed >= settings.stop_after:
            return False
        ids = encode_turn(tokenizer, user, history)
        if settings.max_prompt_tokens:
            ids = ids[-settings.max_prompt_tokens :]
        seed = response_seed(settings.seed, key)
        try:
            result = engine.generate(ids, max_new_tokens=settings.max_new_tokens, seed=seed,
                                     accounting=settings.accounting, record=settings.record_rounds)
        except ValueError as err:
            if len(ids) + settings.max_new_tokens <= engine.target.max_length:
                raise ValueError(f"prompt {prompt.id!r} (turn {turn}) of {prompt.dataset}: {err}") from err
            reason = f"{prompt.id} (turn {turn}): {err}"
            log.warning("skipping prompt %s", reason)
            summary.skipped.append(reason)
            return True  # later turns would condition on the missing reply
        text = tokenizer.decode(result.tokens, skip_special_tokens=True)
        writer.write(make_record(prompt, turn, len(ids), result, text, seed, shard.rank))
        summary.computed += 1
        history.append((user, text))
    return True
