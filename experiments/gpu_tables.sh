#!/usr/bin/env bash
# The GPU checks and speed tables behind README's "Speed on a GPU", as named steps under one deadline.
#
#   OUT=results bash experiments/gpu_tables.sh suite-hybrid 27b-512             # one GPU, bf16, random weights
#   OUT=results DEADLINE=570 bash experiments/gpu_tables.sh suite-long suite-mtp profile-27b
#
# Each step writes $OUT/<step>.log (and its .json where the tool writes one) and gets the time left
# before the deadline (DEADLINE seconds from the start, default 570, less a 10-s margin); a step cut by it
# keeps what it wrote (speed.py and round_profile.py write after every row). The steps run in the order
# given and stop at the deadline. Hydra must be importable (speed.py is a Hydra app); PYTHON (python3)
# runs everything, NW (8) is the GPU suite's pytest-xdist workers. PRINT=1 prints each step's command
# line and runs nothing (the CPU tests check those lines parse).
#
# A baseline in the same call (timings compare only on one machine): carry the older package as an
# ignored folder (git archive REV ddtree | tar -x -C .base) and run the step again with it first on the
# path and this checkout's configs (the Hydra apps look for configs/ beside the package otherwise):
#   PYTHONPATH=$PWD/.base:$PYTHONPATH DDTREE_CONFIGS=$PWD/configs OUT=results/base bash experiments/gpu_tables.sh 8b-long
#
# Kernel forms against the library's, in one call (speed.yaml's keys in FORMS; the other steps ignore it):
#   OUT=results/off bash experiments/gpu_tables.sh 27b-8192-forms
#   OUT=results/on FORMS="gdn_push=true split_block=true prefix_tile_256=[128,32,8,2,128]" bash experiments/gpu_tables.sh 27b-8192-forms
# or with the forms the benches found fastest (experiments/pick_forms.py reads their JSON):
#   OUT=results bash experiments/gpu_tables.sh gdn-push prefix-forms 27b-8192-forms
#   FORMS="$(python3 experiments/pick_forms.py results)" OUT=results/on bash experiments/gpu_tables.sh 27b-8192-forms
#
# Steps:
#   suite-fast suite-hybrid suite-long suite-mtp   tests/gpu/test_{fast_path_exact,hybrid_fast_path,long_context,mtp_graph}.py
#   suite-tree           tests/gpu/test_tree_topk.py (the tree stage's graphed top-k)
#   27b-512 27b-8192     Qwen3.6-27B geometry: AR, MTP k=3, DFlash, DDTree-64/256 (issue #16's table), one length each
#   8b-long 8b-128k      Qwen3-8B geometry: 512/8192/32768, then 131072 (issue #19's table)
#   profile-27b          round_profile.py at 8192: verifies of 1/65/257 nodes, both drafters, whole rounds by stage
#   profile-8b           the same for Qwen3-8B at 32768
#   gdn-bench            gdn_kernel_bench.py at the 27B's GDN sizes (1/65/257 nodes)
#   gdn-push             gdn_kernel_bench.py --rule-only: the split rule against its right-looking form (push)
#   prefix-forms         prefix_tiles_bench.py, 27B heads at 8192: more tiles (--more) and the block in the prefix launch (--fused)
#   27b-8192-forms       27b-8192's AR and DDTree-64 with the kernel forms in $FORMS (above; unset: the library's)
set -uo pipefail
set -f  # the commands' overrides ('budgets=[64,256]') are words, never file patterns
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder that receives the logs}"
[[ "$OUT" != *" "* ]] || { echo "OUT must be a path without spaces, got '$OUT'" >&2; exit 2; }
mkdir -p "$OUT"
PY=${PYTHON:-python3}
NW=${NW:-8}
END=$(( $(date +%s) + ${DEADLINE:-570} - 10 ))
export PYTHONUNBUFFERED=1

command_for() {
  local speed="$PY experiments/speed.py check_tokens=0 drafter_check=false paths=[fast] out=$OUT/$1.json"
  case "$1" in
    suite-fast) echo "$PY -m pytest -m gpu tests/gpu/test_fast_path_exact.py -n $NW -v -p no:cacheprovider" ;;
    suite-hybrid) echo "$PY -m pytest -m gpu tests/gpu/test_hybrid_fast_path.py -n $NW -v -p no:cacheprovider" ;;
    suite-long) echo "$PY -m pytest -m gpu tests/gpu/test_long_context.py -n $NW -v -p no:cacheprovider" ;;
    suite-mtp) echo "$PY -m pytest -m gpu tests/gpu/test_mtp_graph.py -n $NW -v -p no:cacheprovider" ;;
    suite-tree) echo "$PY -m pytest -m gpu tests/gpu/test_tree_topk.py -v -p no:cacheprovider" ;;
    27b-512|27b-8192)
      echo "$speed geometry=qwen3.6-27b rounds=10 prompt_lengths=[${1#27b-}] budgets=[64,256]" \
           "strategies=[ar,mtp,dflash,ddtree] mtp_steps=[3] max_length=9216 prefill_reps=1" ;;
    8b-long) echo "$speed prompt_lengths=[512,8192,32768] budgets=[64,256] max_length=33500 rounds=12 prefill_reps=1" ;;
    8b-128k) echo "$speed prompt_lengths=[131072] budgets=[64,256] max_length=131400 rounds=4 prefill_reps=1" ;;
    profile-27b) echo "$PY experiments/round_profile.py --prompt 8192 --sizes 1 65 257 --reps 10" \
                      "--drafters dflash mtp --loop 0 64 256 --out $OUT/$1.json" ;;
    profile-8b) echo "$PY experiments/round_profile.py --geometry qwen3-8b --prompt 32768 --sizes 1 65 257" \
                     "--reps 10 --drafters dflash --loop 0 64 256 --out $OUT/$1.json" ;;
    gdn-push) echo "$PY experiments/gdn_kernel_bench.py --rule-only --sizes 65 16 257 --blocks 16 32 --value-blocks 32" \
                   "--precisions tf32 --forms split push --out $OUT/$1.json" ;;
    prefix-forms) echo "$PY experiments/prefix_tiles_bench.py --heads 27b --pasts 8192 --sizes 65 16 257 1 --more" \
                       "--fused --seconds 85 --out $OUT/$1.json" ;;
    27b-8192-forms)
      echo "$speed geometry=qwen3.6-27b rounds=10 prompt_lengths=[8192] budgets=[64] strategies=[ar,ddtree]" \
           "max_length=9216 prefill_reps=1 ${FORMS:-}" ;;
    gdn-bench) echo "$PY experiments/gdn_kernel_bench.py --sizes 1 65 257 --blocks 16 32 --value-blocks 32" \
                    "--precisions tf32 --forms split --out $OUT/$1.json" ;;
    *) return 1 ;;
  esac
}

for step in "$@"; do
  cmd=$(command_for "$step") || { echo "unknown step '$step': see the list at the top of $0" >&2; exit 2; }
  if [[ -n "${PRINT:-}" ]]; then
    echo "$cmd"
    continue
  fi
  left=$(( END - $(date +%s) ))
  if (( left < 30 )); then
    echo "== $step: not run, ${left}s left before the deadline" | tee -a "$OUT/steps.log"
    continue
  fi
  echo "== $step (${left}s left): $cmd" | tee -a "$OUT/steps.log"
  start=$(date +%s)
  timeout --signal=INT --kill-after=15 "$left" $cmd > "$OUT/$step.log" 2>&1
  rc=$?
  echo "== $step: exit $rc after $(( $(date +%s) - start ))s" | tee -a "$OUT/steps.log"
  tail -n 3 "$OUT/$step.log"
done
