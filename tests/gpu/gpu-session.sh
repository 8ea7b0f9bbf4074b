#!/usr/bin/env bash
# One GPU session's whole device call: the acceptance run (acceptance.sh, at most ~8 minutes),
# then the fixture capture (capture.sh, time-boxed), packed so that what comes back fits the
# device tool's limits (a handful of files, at most two folders down):
#   $OUT/acceptance/{summary.md,summary.json,nvidia-smi.txt,details.tar.gz}
#   $OUT/fixtures.tar.gz   capture.sh's output (tests/fixtures/gpu/ layout), $OUT/capture.log
#   $OUT/session.log       this script's own progress, with times
#   $OUT/launch-cost.json  KIT/bin/launch_cost bare, and under the hook in summary and raw mode
#                          and in summary mode with FLARE_TIMING=end, with FLARE_SAMPLE_KERNELS
#                          (FLARE_SESSION_SAMPLE_KERNELS, default 32), and with that N for
#                          FLARE_SAMPLE_CALLS too (summary-sampled-all: the memset row untimed);
#                          FLARE_SESSION_LAUNCH_COST_ROUNDS interleaved rounds (default 5),
#                          gathered by bench/launch_cost_rounds.py
# Budgets: FLARE_ACCEPTANCE_BUDGET_* as acceptance.sh reads them; FLARE_CAPTURE_BUDGET_S (90)
# and FLARE_CAPTURE_ARGS (--steps 12) for the capture; FLARE_SESSION_SKIP_CAPTURE=1 skips it.
#
# Usage, from the repository root with the kit at .gpukit (tools/gpu-kit/make-kit.sh build .gpukit):
#   OUT=/some/dir tests/gpu/gpu-session.sh
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-/tmp/flare-gpu-session}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
log() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$OUT/session.log" >&2; }
t0=$(date +%s)
# Flare from the kit's wheel, installed into KIT/venv first (tests/gpu/kit-env.sh): launch_cost,
# acceptance.sh and capture.sh all run the installed hook and programs. No wheel: exit 2.
. "$here/kit-env.sh"
kit=${FLARE_BUILD_DIR:-$PWD/.gpukit}
flare_use_kit "$kit" 2>> "$OUT/session.log" || { log "session: no usable kit at $kit (see above)"; tail -5 "$OUT/session.log" >&2; exit 2; }
log "session: kit $kit ($(cat "$FLARE_BUILD_DIR/VERSION" 2>/dev/null)), Flare from $(sed -n 2p "$FLARE_BUILD_DIR/INSTALLED" 2>/dev/null || echo "$FLARE_BUILD_DIR")"
# The per-call cost of a launch, bare and under the hook (tests/gpu/bench/launch_cost.cu, built
# into the kit by make-kit.sh where nvcc is), before anything else loads the GPU.
lc=$FLARE_BUILD_DIR/bin/launch_cost
if [ -x "$lc" ] && [ "${FLARE_SESSION_SKIP_LAUNCH_COST:-0}" != 1 ]; then
  spool=$(mktemp -d /tmp/flare-lc.XXXXXX)
  runs=$(mktemp -d /tmp/flare-lc-runs.XXXXXX)
  # FLARE_SESSION_LAUNCH_COST_ROUNDS rounds (default 5, ~0.5 s per run), each arm once per round
  # in a shuffled order: arm-to-arm differences of ~1 µs were run-to-run noise when each arm
  # ran once (2026-11-27), so every hook arm is paired with the same round's bare run.
  # summary-sampled: 1-in-N timing of plain launches (FLARE_SAMPLE_KERNELS, default 32 here):
  # its launch row is the untimed launch's cost plus 1/N of a timed one's.
  rounds=${FLARE_SESSION_LAUNCH_COST_ROUNDS:-5}
  # Simulated mode (FLARE_ACCEPTANCE_SIM=1, as CI runs this script): on the kit's simulated runtime.
  lc_path=${LD_LIBRARY_PATH:-}
  if [ "${FLARE_ACCEPTANCE_SIM:-auto}" = 1 ] && [ -d "$FLARE_BUILD_DIR/lib/sim" ]; then
    lc_path=$FLARE_BUILD_DIR/lib/sim${lc_path:+:$lc_path}
  fi
  for round in $(seq "$rounds"); do
    for arm in $(printf '%s\n' bare summary raw summary-end summary-sampled summary-sampled-all |
                 shuf); do  # launch_cost has no steps
      echo "$arm" >> "$runs/order"
      if [ "$arm" = bare ]; then
        LD_LIBRARY_PATH=$lc_path timeout 60 "$lc" > "$runs/out" 2>> "$OUT/session.log" ||
          echo null > "$runs/out"
      else
        timing=pair sample=1 calls=1
        [ "$arm" = summary-end ] && timing=end
        [ "${arm#summary-sampled}" != "$arm" ] && sample=${FLARE_SESSION_SAMPLE_KERNELS:-32}
        [ "$arm" = summary-sampled-all ] && calls=$sample
        LD_PRELOAD=$FLARE_BUILD_DIR/lib/libflare_hook.so FLARE_MODE=${arm%%-*} \
          FLARE_TIMING=$timing FLARE_SAMPLE_KERNELS=$sample FLARE_SAMPLE_CALLS=$calls \
          FLARE_OUTPUT_DIR=$spool FLARE_JOB_ID=launch-cost-$arm-$round LD_LIBRARY_PATH=$lc_path \
          timeout 60 "$lc" > "$runs/out" 2>> "$OUT/session.log" || echo null > "$runs/out"
      fi
      line=$(tail -n 1 "$runs/out")
      echo "${line:-null}" >> "$runs/$arm.jsonl"
    done
  done
  python3 "$here/bench/launch_cost_rounds.py" "$runs" --order "$runs/order" --table \
    > "$OUT/launch-cost.json" 2>> "$OUT/session.log"
  log "launch cost: $rounds rounds (the table above; $OUT/launch-cost.json)"
  rm -rf "$spool" "$runs"
fi
OUT=$OUT/acceptance bash "$here/acceptance.sh" >> "$OUT/session.log" 2>&1
log "acceptance: exit $? after $(($(date +%s) - t0)) s"
if [ "${FLARE_SESSION_SKIP_CAPTURE:-0}" != 1 ]; then
  cap=$(mktemp -d /tmp/flare-fixtures.XXXXXX)
  budget=${FLARE_CAPTURE_BUDGET_S:-90}
  read -r -a cap_args <<< "${FLARE_CAPTURE_ARGS:---steps 12}"
  OUT=$cap timeout --kill-after=10 $((budget + 20)) bash "$here/capture.sh" --budget-s "$budget" \
    "${cap_args[@]}" > "$OUT/capture.log" 2>&1
  log "capture: exit $? after $(($(date +%s) - t0)) s"
  tar -C "$cap" -czf "$OUT/fixtures.tar.gz" .
fi
log "session: done in $(($(date +%s) - t0)) s"
