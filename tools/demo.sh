#!/usr/bin/env bash
# The main job (`make demo`): an 8-rank simulated training job traced by Flare and streamed to
# the central daemon flared — healthy, then with one fault at a time — with the diagnoses flared
# raises, as an operator reads them (`flare alerts`).
#
# On a machine without a GPU this runs on the simulated GPU stack (src/sim): libflare_hook.so is
# preloaded into every rank (`flare run`) exactly as on a real cluster.
set -euo pipefail
BUILD_DIR="${1:-build}"
TRAIN="$BUILD_DIR/bin/flare-sim-train"
FLARE="$BUILD_DIR/bin/flare"
FLARED="$BUILD_DIR/bin/flared"
RANKS="${FLARE_DEMO_RANKS:-8}"
STEPS="${FLARE_DEMO_STEPS:-8}"
ARGS=(--ranks "$RANKS" --steps "$STEPS" --tp 2 --layers 4 --hidden 4096 --timeout 300 --quiet)
WORK="$(mktemp -d /tmp/flare-demo-XXXXXX)"
RUN_ID="$(date +%H%M%S)"

"$FLARED" --listen 127.0.0.1:0 --http 127.0.0.1:0 --db "$WORK/flared.db" \
  --diagnose-interval-s 1 --hang-timeout-s 3 >"$WORK/flared.log" 2>&1 &
FLARED_PID=$!
trap 'kill $FLARED_PID 2>/dev/null; wait $FLARED_PID 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do
  grep -q "gRPC on port" "$WORK/flared.log" 2>/dev/null && break
  sleep 0.1
done
PORTS="$(sed -n 's/.*gRPC on port \([0-9]*\).*HTTP on port \([0-9]*\).*/\1 \2/p' "$WORK/flared.log")"
if [ -z "$PORTS" ]; then
  echo "flared did not start:" >&2
  cat "$WORK/flared.log" >&2
  exit 1
fi
read -r GRPC_PORT HTTP_PORT <<<"$PORTS"

scenario() {  # NAME TITLE [ENV=VALUE ...] [-- TRAIN_ARGS ...]
  local name="$1" title="$2" job="demo-$1-$RUN_ID"
  shift 2
  local envs=() extra=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  [ $# -gt 0 ] && shift && extra=("$@")
  echo
  echo "-- $title"
  env "${envs[@]}" FLARE_OUTPUT_DIR="$WORK/spool" "$FLARE" run --quiet \
    --daemon "127.0.0.1:$GRPC_PORT" --job-id "$job" -- "$TRAIN" "${ARGS[@]}" "${extra[@]}" \
    2>/dev/null || echo "   (the job failed or was stopped by its --timeout)"
  sleep 2.2  # flared's detectors run every second over the job's last two minutes
  echo
  echo "   flare alerts --job $job:"
  # With none, flare alerts says so itself (and what it looked at).
  "$FLARE" alerts --daemon-http "127.0.0.1:$HTTP_PORT" --job "$job" | sed 's/^/   /'
}

echo "== Flare demo: $RANKS-rank transformer job on the simulated GPU stack, traced through flared =="
echo "   flared: gRPC 127.0.0.1:$GRPC_PORT, HTTP 127.0.0.1:$HTTP_PORT (/metrics, /api/v1/...)"
scenario healthy "1. healthy job"
scenario gpu "2. GPU 3 underclocked to 80% (FLARE_SIM_CLOCK_FACTOR=3:0.8): every step slows, \
only rank 3's kernels are slower" FLARE_SIM_CLOCK_FACTOR=3:0.8
scenario link "3. rank 5's network link at half bandwidth (FLARE_SIM_LINK_FACTOR=5:0.5)" \
  FLARE_SIM_LINK_FACTOR=5:0.5
scenario stall "4. rank 6's host stalls 5 ms in every forward pass, like a GC pause \
(FLARE_SIM_HOST_STALL=6:5)" FLARE_SIM_HOST_STALL=6:5
scenario odd "5. an FFN width of 16380 (--ffn): GEMMs with a dimension not a multiple of 128 bytes" \
  -- --ffn 16380
scenario hang "6. rank 3 never reaches step 4's collectives (FLARE_SIM_HANG=3:skip:4): every rank \
hangs; flared (--hang-timeout-s 3) collects stacks and collective counters from all ranks; \
the job is stopped by its own --timeout 10" FLARE_SIM_HANG=3:skip:4 -- --timeout 10
echo
echo "-- flare report --job demo-gpu-$RUN_ID (the per-job kernel report, the five metrics and the"
echo "   diagnoses; --html also writes a self-contained page with charts)"
"$FLARE" report --daemon-http "127.0.0.1:$HTTP_PORT" --job "demo-gpu-$RUN_ID" --top 8 --text \
  --quiet --html "$BUILD_DIR/demo-report.html" | sed 's/^/   /'
echo "   page: $BUILD_DIR/demo-report.html"
echo
echo "-- flare status (what flared received from each rank)"
"$FLARE" status --daemon-http "127.0.0.1:$HTTP_PORT" --all
