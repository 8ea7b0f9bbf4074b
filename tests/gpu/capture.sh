#!/usr/bin/env bash
# Records real PyTorch workloads in raw mode as compact fixtures for CI (issue 19, part 2):
# healthy at two sizes, a host stall (a real GC pause) every step on one rank of two, a stray
# torch.cuda.synchronize(), a slow DataLoader, an un-aligned GEMM shape, a CUDA-graph step and a
# torch.compile model. Each scenario: the kit's hook in FLARE_MODE=raw, the spool exported and
# gzip'd per rank, the loop's own step counts and times, the expected diagnosis; metadata.json
# with the GPU, driver, CUDA, PyTorch and Flare versions. Layout: tests/fixtures/gpu/README.md.
# Total at most 5 MB (checked; lower --steps if not). About 3 minutes on one H100; fits beside
# tests/gpu/acceptance.sh in one GPU session, or runs on its own.
#
# Usage (repository or kit root):
#   FLARE_BUILD_DIR=KIT OUT=/some/dir tests/gpu/capture.sh [--steps 30] [--only a,b] [--budget-s 240]
#   then copy $OUT into tests/fixtures/gpu/ and commit it.
# Sim mode (FLARE_CAPTURE_SIM=1, or automatic without PyTorch and a CUDA GPU): the simulated
# Python workload on the simulated CUDA stack, same layout (for the tests of what consumes
# fixtures); CUDA graphs and torch.compile are listed as skipped.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp/flare-fixtures}
if [ -n "${FLARE_KIT:-${FLARE_BUILD_DIR:-}}" ]; then
  kit=${FLARE_KIT:-$FLARE_BUILD_DIR}
elif [ -d "$root/wheel" ] || [ -f "$root/INSTALLED" ]; then
  kit=$root
else
  kit=$root/.gpukit
fi
# Flare from the kit's wheel, installed on first use (tests/gpu/kit-env.sh); no fallback.
. "$here/kit-env.sh"
flare_use_kit "$kit" || exit 2
kit=$FLARE_BUILD_DIR
py=${PYTHON:-python3}
sim=${FLARE_CAPTURE_SIM:-auto}
if [ "$sim" = auto ]; then
  if timeout 90 "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    sim=0
  else
    sim=1
  fi
fi
flags=()
[ "$sim" = 1 ] && flags=(--sim)
mkdir -p "$OUT"
echo "capture: $([ "$sim" = 1 ] && echo simulated || echo gpu) mode, kit $kit, fixtures in $OUT" >&2
exec "$py" "$here/capture.py" --kit "$kit" --out "$OUT" "${flags[@]}" "$@"
