#!/usr/bin/env bash
# Fuzzing in `make test` (issue 22): builds the libFuzzer targets with clang in a separate build
# folder (the engine, the spool code and the generated protobuf code instrumented with
# -fsanitize=fuzzer-no-link,address,undefined) and runs each on its seed corpus for a bounded
# time. A crash, a leak or an undefined-behaviour report fails it, naming the saved input.
#
#   tools/fuzz/run.sh [SECONDS_PER_TARGET]      (default 8: three targets, under 30 s of fuzzing)
# Environment: FLARE_FUZZ_BUILD_DIR (default build-fuzz), JOBS (2). Longer runs:
#   build-fuzz/bin/flare_ingest_fuzz -max_total_time=3600 CORPUS_DIR tests/fuzz/ingest
# Targets and seeds: tests/fuzz/README.md. Results: docs/benchmarks.md "Fuzzing".
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${FLARE_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
SECS=${1:-${FLARE_FUZZ_SECONDS:-8}}
JOBS=${JOBS:-2}
if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz: clang++ is not installed (deploy/install-deps.sh installs it); fuzzing skipped"
  exit 0
fi
FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
if [[ ! -f $BUILD/CMakeCache.txt ]]; then
  mkdir -p "$BUILD"
  CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFLARE_FUZZ=ON -DFLARE_BUILD_TESTS=OFF -DFLARE_WITH_SIM=OFF \
    -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS" >"$BUILD/configure.log" 2>&1 ||
    { cat "$BUILD/configure.log"; exit 1; }
fi
TARGETS=(flare_ingest_fuzz flare_http_fuzz flare_spool_fuzz)
if ! cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" >"$BUILD/build.log" 2>&1; then
  tail -40 "$BUILD/build.log"
  echo "fuzz: building the fuzz targets failed (log: $BUILD/build.log)"
  exit 1
fi
LOGS="$BUILD/fuzz-logs"
mkdir -p "$LOGS"
status=0
for pair in flare_ingest_fuzz:ingest flare_http_fuzz:http_parse flare_spool_fuzz:spool; do
  target=${pair%%:*}
  seeds=$ROOT/tests/fuzz/${pair##*:}
  work=$(mktemp -d)  # new inputs land here, the checked-in seeds stay as they are
  set +e
  FLARE_LOG_LEVEL=off UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$BUILD/bin/$target" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$LOGS/$target-" "$work" "$seeds" \
    >"$LOGS/$target.log" 2>&1
  rc=$?
  set -e
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$LOGS/$target.log" | grep -o '[0-9]*$' || echo 0)
  cov=$(grep -o 'cov: [0-9]*' "$LOGS/$target.log" | tail -1 | grep -o '[0-9]*' || echo 0)
  if [[ $rc -ne 0 ]]; then
    status=1
    grep -E "ERROR|SUMMARY|Test unit written|runtime error" "$LOGS/$target.log" | head -20
    echo "fuzz: $target FAILED after $runs inputs (log: $LOGS/$target.log)"
  else
    echo "fuzz: $target ok: $runs inputs in ${SECS} s, coverage $cov edges, seeds $(ls "$seeds" | wc -l)"
  fi
  rm -rf "$work"
done
exit $status
