#!/bin/bash
# The daemon-ingest figure of docs/benchmarks.md: flared pinned to core 0, flare-loadgen (its
# generator processes) pinned to core 1, loopback, a fresh SQLite store.
#
#   tools/bench/daemon_load.sh BUILD_DIR RANKS [LOADGEN_FLAGS...] [-- FLARED_FLAGS...]
#   e.g. tools/bench/daemon_load.sh build 10000 --duration-s 20 -- --diagnose-interval-s 0
# Then times GET /api/v1/jobs/loadgen-0/{report,diagnoses} three times each on the loaded daemon.
set -euo pipefail
BUILD=$1
RANKS=$2
shift 2
LG=()
while [[ $# -gt 0 && $1 != "--" ]]; do LG+=("$1"); shift; done
[[ $# -gt 0 ]] && shift
DB=$(mktemp -d)/flared.db
taskset -c 0 "$BUILD/bin/flared" --db "$DB" --listen 127.0.0.1:17272 --http 127.0.0.1:19666 \
  --max-streams-per-peer 0 --hello-timeout-ms 60000 "$@" \
  >"$DB.log" 2>&1 &
D=$!
trap 'kill $D 2>/dev/null || true; sleep 1; kill -9 $D 2>/dev/null || true; rm -rf "$(dirname "$DB")"' EXIT
sleep 1
taskset -c 1 "$BUILD/bin/flare-loadgen" --target 127.0.0.1:17272 --http-port 19666 \
  --daemon-pid $D --ranks "$RANKS" --warmup-s 5 "${LG[@]}"
# Query latency of the per-job report and of the detectors run on demand, on the loaded daemon
# (its job holds every rank's window now). FLARE_LOAD_QUERIES=0 skips it.
if [[ ${FLARE_LOAD_QUERIES:-1} != 0 ]]; then
  for path in report diagnoses; do
    for i in 1 2 3; do
      t=$(curl -s -o "$DB.q" -w '%{http_code} %{time_total}' \
        "http://127.0.0.1:19666/api/v1/jobs/loadgen-0/$path")
      echo "query /api/v1/jobs/loadgen-0/$path #$i: HTTP ${t% *}, ${t#* } s, $(wc -c <"$DB.q") bytes"
    done
  done
fi
