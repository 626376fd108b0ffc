#!/usr/bin/env bash
# Build the shipped model pair on one GPU and pack it into $OUT (one H200: about 7 minutes).
#
#   bash experiments/make_shipped_pair.sh          # on the GPU machine; carry .corpus/stdlib.jsonl.xz, .corpus/stdlib.meta.json, .whl/
#
# The GPU image has no Hydra: the call carries the wheels in .whl/ (hydra-core 1.3.2, omegaconf 2.3.0,
# antlr4-python3-runtime 4.9.3) and installs them before anything else:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#       .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && bash experiments/make_shipped_pair.sh ...
#
# The device tool sends the tracked files (about 61.5 MiB with both pairs) plus what is carried, 64 MiB
# in all: carry the corpus compressed (`xz -k -9 .corpus/stdlib.jsonl`, 1.9 MB; unpacked here when
# $CORPUS is missing and $CORPUS.xz is there) and only the three Hydra wheels.
#
# The stages' budgets add up to more than one 10-minute device call, so a build from scratch
# takes two: first the target ('stages=[tokenizer,target]'), unpacked into assets/; then the
# drafters for it (reuse_target=assets/pair 'stages=[tokenizer,target,regenerate,dflash,mtp]').
# The evaluate stage runs anywhere, a CPU included ('stages=[evaluate]' device=cpu).
#
# Stages (each skipped when its record exists in $WORK, each with a time budget under one
# deadline): tokenizer (the committed one is copied), target, regenerate, dflash, mtp, evaluate.
# Environment: OUT (required: receives the pack), CORPUS (.corpus/stdlib.jsonl),
# WORK (.pair_work), PRESET (unset: the H200 sizes of configs/pipeline/shipped_pair.yaml; smoke:
# configs/pipeline/preset/smoke.yaml), DEADLINE (570 s), PYTHON (python3).
# Extra arguments are Hydra overrides for experiments/shipped_pair.py (e.g. target_budget.max_seconds=120,
# device=cpu, 'redo=[dflash]', reuse_target=assets/pair, continue_from=assets/pair, seed=1).
#
# The pair comes back as pair.tar.part-NN chunks of at most 15 MiB (the device tool returns
# at most 8 files of 16 MiB), plus README.md (the model card), metrics.json, the log and
# records.tar (the stage records: unpack into a work directory to resume or re-evaluate there).
# Unpack into the repository with:  cat pair.tar.part-* | tar -xf - -C assets/
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the folder that receives the packed pair}"
CORPUS=${CORPUS:-.corpus/stdlib.jsonl}
WORK=${WORK:-.pair_work}  # git-ignored; kept on a warm device machine, so a rerun resumes
mkdir -p "$OUT" "$WORK"
if [ ! -f "$CORPUS" ] && [ -f "$CORPUS.xz" ]; then xz -dc "$CORPUS.xz" > "$CORPUS"; fi

"${PYTHON:-python3}" experiments/shipped_pair.py "corpus=$CORPUS" "work=$WORK" \
    ${PRESET:+"pipeline/preset=$PRESET"} "deadline_seconds=${DEADLINE:-570}" "$@" 2>&1 | tee "$OUT/pipeline.log"

tar -C "$WORK" -cf - pair | split -b 15m -d - "$OUT/pair.tar.part-"
cp "$WORK/pair/README.md" "$WORK/pair/metrics.json" "$OUT/"
tar -C "$WORK" -cf "$OUT/records.tar" $(cd "$WORK" && ls stage_*.json)  # to resume or re-evaluate elsewhere
ls -l "$OUT"
echo "unpack with: cat pair.tar.part-* | tar -xf - -C assets/"
