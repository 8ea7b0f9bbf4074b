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
