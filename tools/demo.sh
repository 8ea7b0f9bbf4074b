#!/usr/bin/env bash
# The main job (`make demo`): an 8-rank simulated training job, healthy and then with one
# underclocked GPU, printing every rank's step times and its GEMM times.
#
# On a machine without a GPU this runs on the simulated GPU stack (src/sim). Later parts of
# Flare trace the same job through flared and print diagnoses.
set -euo pipefail
BUILD_DIR="${1:-build}"
TRAIN="$BUILD_DIR/bin/flare-sim-train"
RANKS="${FLARE_DEMO_RANKS:-8}"
STEPS="${FLARE_DEMO_STEPS:-10}"
ARGS=(--ranks "$RANKS" --steps "$STEPS" --tp 2 --hidden 8192 --timeout 300 --quiet)

echo "== Flare demo: $RANKS-rank transformer job on the simulated GPU stack =="
echo
echo "-- 1. healthy job"
env -u FLARE_SIM_CLOCK_FACTOR "$TRAIN" "${ARGS[@]}"
echo
echo "-- 2. the same job with GPU 3 underclocked to 80% (FLARE_SIM_CLOCK_FACTOR=3:0.8)"
echo "      every rank waits for rank 3 at each collective, so every step slows;"
echo "      only rank 3's own GEMMs are slower:"
FLARE_SIM_CLOCK_FACTOR=3:0.8 "$TRAIN" "${ARGS[@]}"

# 3. The same healthy job traced and streamed to the daemon (needs build/bin/flared).
FLARED="$BUILD_DIR/bin/flared"
if [ ! -x "$FLARED" ]; then
  echo
  echo "-- 3. (skipped: $FLARED not built)"
  exit 0
fi
echo
echo "-- 3. the healthy job traced by libflare_hook.so, every rank streaming to flared"
WORK="$(mktemp -d /tmp/flare-demo.XXXXXX)"
GRPC_PORT="${FLARE_DEMO_GRPC_PORT:-17070}"
HTTP_PORT="${FLARE_DEMO_HTTP_PORT:-19464}"
"$FLARED" --listen "127.0.0.1:$GRPC_PORT" --http "127.0.0.1:$HTTP_PORT" --db "$WORK/flared.db" \
  >"$WORK/flared.log" 2>&1 &
FLARED_PID=$!
trap 'kill $FLARED_PID 2>/dev/null; wait $FLARED_PID 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 50); do
  grep -q "gRPC on port" "$WORK/flared.log" 2>/dev/null && break
  sleep 0.1
done
FLARE_OUTPUT_DIR="$WORK/spool" "$BUILD_DIR/bin/flare" run --daemon "127.0.0.1:$GRPC_PORT" \
  --job-id "demo-$(date +%H%M%S)" -- env -u FLARE_SIM_CLOCK_FACTOR "$TRAIN" "${ARGS[@]}"
echo
echo "-- flare status (what flared received from each rank)"
"$BUILD_DIR/bin/flare" status --daemon-http "127.0.0.1:$HTTP_PORT" --all
