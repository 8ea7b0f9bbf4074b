#!/usr/bin/env bash
# The main job (`make demo`): an 8-rank simulated training job traced by Flare, healthy and then
# with one fault at a time, each followed by Flare's diagnosis.
#
# On a machine without a GPU this runs on the simulated GPU stack (src/sim): libflare_hook.so is
# preloaded into every rank exactly as on a real cluster, records go to a spool, and
# flare-diagnose runs the detectors the daemon runs.
set -euo pipefail
BUILD_DIR="${1:-build}"
TRAIN="$BUILD_DIR/bin/flare-sim-train"
DIAGNOSE="$BUILD_DIR/bin/flare-diagnose"
HOOK="$BUILD_DIR/lib/libflare_hook.so"
RANKS="${FLARE_DEMO_RANKS:-8}"
STEPS="${FLARE_DEMO_STEPS:-8}"
ARGS=(--ranks "$RANKS" --steps "$STEPS" --tp 2 --layers 4 --hidden 4096 --timeout 300 --quiet)
SPOOL="$(mktemp -d /tmp/flare-demo-XXXXXX)"
trap 'rm -rf "$SPOOL"' EXIT

scenario() {  # NAME TITLE [ENV=VALUE ...]
  local name="$1" title="$2"
  shift 2
  echo
  echo "-- $title"
  env "$@" LD_PRELOAD="$HOOK" FLARE_OUTPUT_DIR="$SPOOL" FLARE_JOB_ID="demo-$name" \
    "$TRAIN" "${ARGS[@]}" 2>/dev/null
  echo
  echo "   Flare's diagnosis:"
  "$DIAGNOSE" --input "$SPOOL" --job "demo-$name" | sed 's/^/   /' || true
}

echo "== Flare demo: $RANKS-rank transformer job on the simulated GPU stack =="
scenario healthy "1. healthy job"
scenario gpu "2. GPU 3 underclocked to 80% (FLARE_SIM_CLOCK_FACTOR=3:0.8): every step slows, \
only rank 3's kernels are slower" FLARE_SIM_CLOCK_FACTOR=3:0.8
scenario link "3. rank 5's network link at half bandwidth (FLARE_SIM_LINK_FACTOR=5:0.5)" \
  FLARE_SIM_LINK_FACTOR=5:0.5
scenario stall "4. rank 6's host stalls 5 ms in every forward pass, like a GC pause \
(FLARE_SIM_HOST_STALL=6:5)" FLARE_SIM_HOST_STALL=6:5

# 5. The same healthy job traced and streamed to the daemon (needs build/bin/flared).
FLARED="$BUILD_DIR/bin/flared"
if [ ! -x "$FLARED" ]; then
  echo
  echo "-- 5. (skipped: $FLARED not built)"
  exit 0
fi
echo
echo "-- 5. the healthy job traced by libflare_hook.so, every rank streaming to flared"
WORK="$(mktemp -d /tmp/flare-demo.XXXXXX)"
GRPC_PORT="${FLARE_DEMO_GRPC_PORT:-17070}"
HTTP_PORT="${FLARE_DEMO_HTTP_PORT:-19464}"
"$FLARED" --listen "127.0.0.1:$GRPC_PORT" --http "127.0.0.1:$HTTP_PORT" --db "$WORK/flared.db" \
  >"$WORK/flared.log" 2>&1 &
FLARED_PID=$!
trap 'kill $FLARED_PID 2>/dev/null; wait $FLARED_PID 2>/dev/null; rm -rf "$WORK" "$SPOOL"' EXIT
for _ in $(seq 50); do
  grep -q "gRPC on port" "$WORK/flared.log" 2>/dev/null && break
  sleep 0.1
done
FLARE_OUTPUT_DIR="$WORK/spool" "$BUILD_DIR/bin/flare" run --daemon "127.0.0.1:$GRPC_PORT" \
  --job-id "demo-$(date +%H%M%S)" -- env -u FLARE_SIM_CLOCK_FACTOR "$TRAIN" "${ARGS[@]}"
echo
echo "-- flare status (what flared received from each rank)"
"$BUILD_DIR/bin/flare" status --daemon-http "127.0.0.1:$HTTP_PORT" --all
