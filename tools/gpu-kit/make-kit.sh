#!/usr/bin/env bash
# Packs what a GPU run needs into one folder that travels to a GPU machine without Flare's build
# dependencies (gRPC, protobuf, SQLite are not installed there) and without network. Flare
# itself travels as the wheel `make wheel` builds (tools/packaging/make-wheel.sh): the GPU
# scripts install it there into a venv that sees the system's PyTorch and run the installed
# `flare`, `flared`, tools and hook (tests/gpu/kit-env.sh), so that a GPU run tests what users
# install. The kit adds only what the wheel cannot hold:
#   KIT/wheel/flare-*.whl   the wheel: the hook, its exporter, the Python tracing modules (one per
#                  CPython version built: the GPU machine's must be among them), flared,
#                  flare-export, flare-timeline, flare-diagnose, the CLI, vendored libraries
#   KIT/bin/launch_cost     tests/gpu/bench/launch_cost.cu, built with nvcc where it is here
#   KIT/sim/{bin,lib/sim,share}  the simulated CUDA stack and its workload (flare-sim-train,
#                  flare-sim-rank; a few MB), for the scripts' simulated mode
#                  (FLARE_ACCEPTANCE_SIM=1) and a sanity check on a GPU machine before the real
#                  run; never on any default search path
#   KIT/tools/cuda-gdb-scripts   what cuda-gdb runs to read a hung NCCL kernel
#   KIT/tests/gpu  the GPU tests, benchmarks and scripts (acceptance.sh, capture.sh,
#                  gpu-session.sh, run_device.sh, kit-env.sh)
#   KIT/VERSION    the commit the kit was made from (git describe --dirty)
#   KIT/NEEDS      the newest GLIBC_ and GLIBCXX_ symbol versions the wheel's binaries need
# Use it there as FLARE_BUILD_DIR=KIT (tests/gpu/acceptance.sh, run_device.sh, capture.sh,
# gpu-session.sh): on first use they install the wheel into KIT/venv and lay out
# KIT/installed (tests/gpu/kit-env.sh). The binaries need glibc 2.35 and the machine's own
# libstdc++ (NEEDS). Needs what `make wheel` needs (patchelf, setuptools, wheel, auditwheel).
#
# Usage: tools/gpu-kit/make-kit.sh [BUILD_DIR] [KIT_DIR]   (defaults: build .gpukit)
set -euo pipefail
build=${1:-build}
kit=${2:-.gpukit}
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)   # the repository this script is in
[ -f "$build/lib/libflare_hook.so" ] || { echo "make-kit: $build/lib/libflare_hook.so not found (make build first)" >&2; exit 1; }
command -v patchelf >/dev/null || { echo "make-kit: patchelf is needed (apt-get install patchelf)" >&2; exit 1; }
for b in flare-sim-train flare-sim-rank; do
  [ -x "$build/bin/$b" ] || { echo "make-kit: $build/bin/$b not built (the simulated stack)" >&2; exit 1; }
done
rm -rf "$kit"
mkdir -p "$kit/wheel" "$kit/bin" "$kit/sim/bin" "$kit/sim/lib/sim" "$kit/tools" "$kit/tests"
kit=$(cd "$kit" && pwd)
# The wheel, built from this build tree; its staging folder is scratch (the wheel checks the
# build's parts and says what is missing).
work=$(mktemp -d /tmp/flare-kit-wheel.XXXXXX)
trap 'rm -rf "$work"' EXIT
bash "$src/tools/packaging/make-wheel.sh" "$build" "$kit/wheel" "$work" >&2 ||
  { echo "make-kit: make-wheel.sh failed: no kit without the wheel" >&2; exit 1; }
# The simulated stack: its libraries keep their sonames (libcudart.so.13, ...); only
# flare-sim-train puts lib/sim on the ranks' LD_LIBRARY_PATH (found from its own path, so
# links to it work). They need nothing beyond glibc and libstdc++.
cp "$build/bin/flare-sim-train" "$build/bin/flare-sim-rank" "$kit/sim/bin/"
for f in "$build"/lib/sim/*.so*; do [ -e "$f" ] && cp -P "$f" "$kit/sim/lib/sim/"; done
[ -d "$build/share/flare" ] && mkdir -p "$kit/sim/share" && cp -r "$build/share/flare" "$kit/sim/share/"
chmod u+w -R "$kit/sim"
strip --strip-debug "$kit"/sim/bin/*
find "$kit/sim/lib/sim" -type f -exec strip --strip-debug {} +
patchelf --set-rpath '$ORIGIN/../lib/sim' "$kit/sim/bin/flare-sim-rank"
patchelf --remove-rpath "$kit/sim/bin/flare-sim-train"
for f in $(find "$kit/sim/lib/sim" -type f); do patchelf --set-rpath '$ORIGIN' "$f"; done
# What the GPU run executes besides Flare: cuda-gdb's scripts and the GPU tests, benchmarks and
# scripts (tests/gpu/*.sh), at the same relative paths as in the repository.
cp -r "$src/tools/cuda-gdb-scripts" "$kit/tools/"
tar -C "$src/tests" --exclude=__pycache__ -cf - gpu | tar -C "$kit/tests" -xf -
# The launch-cost microbenchmark (tests/gpu/bench/launch_cost.cu), where nvcc is: a CUDA 13
# program whose `<<<>>>` launches go through __cudaLaunchKernel, as PyTorch's do.
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ -x "$nvcc" ]; then
  "$nvcc" -O2 -std=c++17 -cudart shared -arch=sm_90 "$src/tests/gpu/bench/launch_cost.cu" \
    -o "$kit/bin/launch_cost" || echo "make-kit: launch_cost did not build (skipped)" >&2
fi
# Which Flare this is: the commit (and whether the tree had changes), for the results' headers.
{ git -C "$src" describe --always --dirty --abbrev=12 2>/dev/null || echo unknown; } > "$kit/VERSION"
# glibc floor: the newest GLIBC_ / GLIBCXX_ symbol versions any file of the wheel needs.
all=("$work"/stage/flare/bin/* "$work"/stage/flare/lib/*.so "$work"/stage/flare/lib/flare/*.so
  "$work"/stage/flare/lib/vendor/* "$kit"/sim/bin/* "$kit"/sim/lib/sim/*)
need=$(for f in "${all[@]}"; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2 -n | tail -1)
cxx=$(for f in "${all[@]}"; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBCXX_3\.4\.[0-9]*' | sort -t. -k3 -n | tail -1)
printf '%s\n%s\n' "$need" "$cxx" > "$kit/NEEDS"
du -sh "$kit" | awk -v n="$need" -v c="$cxx" -v w="$(basename "$kit"/wheel/flare-*.whl)" \
  '{print "make-kit: " $2 " is " $1 " (" w "); needs " n " and " c " or newer"}'
