#!/usr/bin/env bash
# The build as `make demo` and `make wheel` run it: install what is missing, configure, build,
# with every line of output in BUILD_DIR/build.log instead of the terminal. One line says where
# the log is; when a step fails, its last lines are printed and the exit code is non-zero.
# (`make build` stays verbose, for developers.)
#
# Usage: tools/quiet-build.sh BUILD_DIR JOBS [CMAKE_FLAGS ...]
set -uo pipefail
build=$1 jobs=$2
shift 2
mkdir -p "$build"
log="$build/build.log"
start=$(date +%s)
if ! { bash deploy/install-deps.sh &&
       cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" &&
       cmake --build "$build" -j "$jobs"; } >"$log" 2>&1; then
  echo "build failed; the last lines of $log:" >&2
  tail -n 60 "$log" >&2
  exit 1
fi
echo "build: done in $(( $(date +%s) - start )) s (output in $log)"
