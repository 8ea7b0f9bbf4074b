#!/usr/bin/env bash
# Flare's GPU acceptance run (issue 19, part 1): one prepared, time-boxed run of at most 8
# minutes on one GPU, from a kit (tools/gpu-kit/make-kit.sh) carried to a bare GPU machine.
#
#   part  what                                                               budget (s)
#   env   nvidia-smi, driver, CUDA, PyTorch, kit version (run_device.sh env)          15
#   a     pytest tests/gpu (run_device.sh checks)                                    100
#   b     end to end through flared, summary and raw mode, 1 and 4 ranks            110
#         (e2e_flared.py: no rejection, every step, GEMM TFLOPS, a detector fires)
#   c     accuracy: per-kernel durations vs CUPTI (run_device.sh accuracy)            45
#   d     overhead: bare / summary / raw / torch.profiler (run_device.sh overhead)   140
#   e     coverage: CUDA graphs and torch.compile's Triton kernels (coverage.py)      50
#                                                                      total budget  460
# plus ~10 s to detect PyTorch and ~2 s to write the summary: under 8 minutes.
# Each part runs under `timeout` with its own budget, so a part that runs long still leaves the
# others their time and their results; budgets are overridable (FLARE_ACCEPTANCE_BUDGET_A=...).
#
# Results in $OUT (default /tmp/flare-acceptance): summary.md and summary.json (each part's
# status, seconds and budget, and each part's own tables), nvidia-smi.txt, and details.tar.gz
# with everything else (logs, per-run reports, per-part JSON).
#
# Simulated mode: without PyTorch and a CUDA GPU (or with FLARE_ACCEPTANCE_SIM=1) the parts that
# need them are reported "skipped: needs PyTorch+GPU", and part b runs the simulated Python
# workload (src/sim/workload/train.py) through flared on the simulated CUDA stack, with the same
# checks (FLARE_ACCEPTANCE_SIM_WORKLOAD=pytorch-like: flare-sim-train --pytorch-like instead).
# tests/python/test_acceptance_script.py runs it that way in CI. FLARE_ACCEPTANCE_SIM=0 forces
# the real mode.
#
# Usage, on the GPU machine (from the repository root, or from the kit's root: the kit carries
# tests/gpu):  FLARE_BUILD_DIR=KIT OUT=/some/dir tests/gpu/acceptance.sh
# The kit: FLARE_KIT, else FLARE_BUILD_DIR, else the kit this script sits in, else ./.gpukit.
# Flare runs from the kit's wheel, installed into KIT/venv on first use (tests/gpu/kit-env.sh):
# every part uses the installed flare, flared, tools and hook; a kit without its wheel is an
# error (exit 2), never a fallback to another Flare.
# FLARE_ACCEPTANCE_PARTS=b,c runs only those parts (the others are listed as skipped), e.g. to
# rerun one part; FLARE_ACCEPTANCE_SIM=0 on the GPU machine skips the PyTorch probe (~10 s).
# Exit status: 0 when every part passed or was skipped, 1 otherwise.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp/flare-acceptance}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if [ -n "${FLARE_KIT:-${FLARE_BUILD_DIR:-}}" ]; then
  kit=${FLARE_KIT:-$FLARE_BUILD_DIR}
elif [ -d "$root/wheel" ] || [ -f "$root/INSTALLED" ]; then
  kit=$root
else
  kit=$root/.gpukit
fi
. "$here/kit-env.sh"
flare_use_kit "$kit" || exit 2
kit=$FLARE_BUILD_DIR
export OUT PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

# Which mode: real needs PyTorch with a CUDA GPU.
sim=${FLARE_ACCEPTANCE_SIM:-auto}
if [ "$sim" = auto ]; then
  if timeout 90 "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    sim=0
  else
    sim=1
  fi
fi
mode=$([ "$sim" = 1 ] && echo simulated || echo gpu)

budget() {  # budget PART DEFAULT
  local var="FLARE_ACCEPTANCE_BUDGET_$1"
  echo "${!var:-$2}"
}
B_ENV=$(budget ENV 15); B_A=$(budget A 100); B_B=$(budget B 110); B_C=$(budget C 45)
B_D=$(budget D 140); B_E=$(budget E 50)
total=$((B_ENV + B_A + B_B + B_C + B_D + B_E))
echo "acceptance: $mode mode, kit $kit, results in $OUT; budget $total s" \
  "(env $B_ENV, a $B_A, b $B_B, c $B_C, d $B_D, e $B_E)" >&2
rm -rf "$OUT/parts"
mkdir -p "$OUT/logs"

# part NAME TITLE BUDGET NEEDS_TORCH CMD...: runs CMD under timeout, records status and time.
part() {
  local name=$1 title=$2 limit=$3 needs=$4
  shift 4
  if [ -n "${FLARE_ACCEPTANCE_PARTS:-}" ] && [ "$name" != env ] &&
     ! [[ ",$FLARE_ACCEPTANCE_PARTS," == *",$name,"* ]]; then
    "$py" "$here/acceptance_summary.py" part "$OUT" "$name" "$title" skipped 0 0 "$limit" \
      "skipped: not in FLARE_ACCEPTANCE_PARTS"
    return
  fi
  if [ "$needs" = torch ] && [ "$sim" = 1 ]; then
    "$py" "$here/acceptance_summary.py" part "$OUT" "$name" "$title" skipped 0 0 "$limit" \
      "skipped: needs PyTorch+GPU (simulated mode)"
    echo "acceptance: part $name ($title): skipped: needs PyTorch+GPU" >&2
    return
  fi
  local t0 t1 rc status reason=""
  t0=$(date +%s.%N)
  ( cd "$root" && timeout --kill-after=10 "$limit" "$@" ) > "$OUT/logs/$name.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  case $rc in
    0) status=passed ;;
    124 | 137) status=timeout; reason="ran past its ${limit} s budget" ;;
    *) status=failed; reason="exit $rc (logs/$name.log)" ;;
  esac
  # Simulated mode: pytest ran and every GPU test skipped itself (pytest's last line says only
  # "N skipped"; run_device.sh exits 1 on pytest's 5 when module-level skips leave nothing
  # collected); anything failed or errored stays a failure.
  if [ "$needs" = sim-skips ] && [ "$sim" = 1 ] && [ "$status" != timeout ] &&
     grep -Eq '^=+ [0-9]+ skipped in ' "$OUT/gpu-tests.log" 2>/dev/null; then
    status=skipped; reason="skipped: needs PyTorch+GPU (pytest ran; every test skipped itself)"
  fi
  local secs
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b - a}')
  "$py" "$here/acceptance_summary.py" part "$OUT" "$name" "$title" "$status" "$rc" "$secs" \
    "$limit" "$reason"
  echo "acceptance: part $name ($title): $status in $secs s${reason:+ ($reason)}" >&2
}

sim_flag=()
[ "$sim" = 1 ] && sim_flag=(--sim --sim-workload "${FLARE_ACCEPTANCE_SIM_WORKLOAD:-python}")
part env "environment" "$B_ENV" any "$here/run_device.sh" env
part a "GPU tests (pytest tests/gpu)" "$B_A" sim-skips "$here/run_device.sh" checks
# FLARE_ACCEPTANCE_E2E_RUNS: which runs part b makes (default summary:1,raw:1,summary:4,raw:4).
part b "end to end through flared (summary, raw; 1 and 4 ranks)" "$B_B" any \
  "$py" "$here/e2e_flared.py" --kit "$kit" --out "$OUT" --budget-s "$((B_B - 15))" \
  --runs "${FLARE_ACCEPTANCE_E2E_RUNS:-summary:1,raw:1,summary:4,raw:4}" "${sim_flag[@]}"
# FLARE_ACCEPTANCE_ACCURACY_TIMINGS: the FLARE_TIMING of each accuracy run (default pair; e.g.
# "pair end": the second writes accuracy-end.{md,json}).
read -r -a accuracy_timings <<< "${FLARE_ACCEPTANCE_ACCURACY_TIMINGS:-pair}"
part c "accuracy vs CUPTI" "$B_C" torch "$here/run_device.sh" accuracy "${accuracy_timings[@]}"
# FLARE_ACCEPTANCE_OVERHEAD_ARGS: more overhead.py arguments (e.g. --workloads launch-bound,gpt-small).
read -r -a overhead_args <<< "${FLARE_ACCEPTANCE_OVERHEAD_ARGS:-}"
part d "overhead (bare, summary, raw, torch.profiler)" "$B_D" torch \
  "$here/run_device.sh" overhead --budget-s "$((B_D - 15))" --window-s 0.5 "${overhead_args[@]}"
part e "coverage (CUDA graphs, torch.compile)" "$B_E" torch \
  "$py" "$here/coverage.py" --kit "$kit" --out "$OUT" --budget-s "$((B_E - 5))"
"$py" "$here/acceptance_summary.py" finish "$OUT" "$mode" "$total"
