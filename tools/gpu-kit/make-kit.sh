#!/usr/bin/env bash
# Packs what a GPU run needs from a build made here into one folder that can travel to a GPU
# machine without Flare's build dependencies (gRPC, protobuf, SQLite are not installed there).
# The kit is a small tree shaped like the repository, so that it works from any directory, on its
# own or beside a checkout:
#   KIT/bin        flared, flare-export, flare-diagnose, flare-timeline (stripped), and `flare`,
#                  the CLI (a shell wrapper that runs KIT/python with KIT's hook library)
#   KIT/lib        libflare_hook.so, libflare_exporter.so, libflare_hang_capture_test.so (stripped)
#   KIT/lib/flare  the Python tracing modules, libflare_pyprof_cpXY.so, one per CPython version
#                  built; the hook dlopens them from flare/ beside itself (src/pyprof/README.md).
#                  Without them a kit run traces no Python at all.
#   KIT/deps       the shared libraries those link that are not part of glibc or libstdc++, found
#                  through RUNPATH ($ORIGIN/../deps), so that no LD_LIBRARY_PATH is needed
#   KIT/python     the `flare` Python package (CLI, client, report helpers), pure Python
#   KIT/tools/cuda-gdb-scripts   what cuda-gdb runs to read a hung NCCL kernel (FLARE_CUDA_GDB_SCRIPT)
#   KIT/tests/gpu  the GPU tests, benchmarks, tests/gpu/acceptance.sh and tests/gpu/capture.sh
#   KIT/bin/flare-sim-train, flare-sim-rank, KIT/lib/sim, KIT/share/flare
#                  the simulated CUDA stack and its workload (a few MB), so that the same kit runs
#                  the acceptance script's simulated mode (FLARE_ACCEPTANCE_SIM=1) and a sanity
#                  check on a GPU machine before the real run; never on any default search path
#   KIT/VERSION    the commit the kit was made from (git describe --dirty)
#   KIT/NEEDS      the newest GLIBC_ and GLIBCXX_ symbol versions the binaries need
# Use it there as FLARE_BUILD_DIR=KIT (tests/gpu/run_device.sh, tests/gpu/acceptance.sh).
# The binaries need glibc 2.34 or newer (checked below) and the machine's own libstdc++.
# Needs patchelf (Debian package patchelf; deploy/install-deps.sh installs it).
# The wheel (tools/packaging/make-wheel.sh, `make wheel`) carries the same binaries for a pip
# install; the kit adds the GPU tests, the simulated stack and cuda-gdb's scripts.
#
# Usage: tools/gpu-kit/make-kit.sh [BUILD_DIR] [KIT_DIR]   (defaults: build .gpukit)
set -euo pipefail
build=${1:-build}
kit=${2:-.gpukit}
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)   # the repository this script is in
[ -f "$build/lib/libflare_hook.so" ] || { echo "make-kit: $build/lib/libflare_hook.so not found (make build first)" >&2; exit 1; }
command -v patchelf >/dev/null || { echo "make-kit: patchelf is needed (apt-get install patchelf)" >&2; exit 1; }
ls "$build"/lib/flare/libflare_pyprof_cp*.so >/dev/null 2>&1 ||
  { echo "make-kit: no Python tracing module in $build/lib/flare (build target flare_pyprof)" >&2; exit 1; }
rm -rf "$kit"
mkdir -p "$kit/bin" "$kit/lib/flare" "$kit/lib/sim" "$kit/deps" "$kit/python" "$kit/tools" \
  "$kit/tests" "$kit/share"
bins=(flared flare-export flare-diagnose flare-timeline flare-sim-train flare-sim-rank)
libs=(libflare_hook.so libflare_exporter.so libflare_hang_capture_test.so)
for b in "${bins[@]}"; do [ -f "$build/bin/$b" ] && cp "$build/bin/$b" "$kit/bin/"; done
for l in "${libs[@]}"; do [ -f "$build/lib/$l" ] && cp "$build/lib/$l" "$kit/lib/"; done
cp "$build"/lib/flare/libflare_pyprof_cp*.so "$kit/lib/flare/"
# The simulated stack: its libraries keep their sonames (libcudart.so.13, ...); only
# flare-sim-train puts lib/sim on the ranks' LD_LIBRARY_PATH.
for f in "$build"/lib/sim/*.so*; do [ -e "$f" ] && cp -P "$f" "$kit/lib/sim/"; done
[ -d "$build/share/flare" ] && cp -r "$build/share/flare" "$kit/share/"
strip --strip-debug "$kit"/bin/flare* "$kit"/lib/*.so "$kit"/lib/flare/*.so
find "$kit/lib/sim" -type f -exec strip --strip-debug {} +
# Dependencies and RUNPATHs (tools/packaging/vendor-deps.sh, shared with the wheel): everything
# ldd resolves outside glibc, libstdc++/libgcc and the CUDA libraries (the GPU machine brings its
# own CUDA; the hook resolves the real ones at run time) goes to deps/, and binaries and libraries
# find it relative to themselves, so that nothing needs LD_LIBRARY_PATH there (it would leak these
# libraries into PyTorch and every child process).
elves=("$kit"/bin/flare* "$kit"/lib/*.so)
bash "$src/tools/packaging/vendor-deps.sh" "$kit/deps" "${elves[@]}" $(find "$kit/lib/sim" -type f)
# The simulated stack's libraries also find each other in lib/sim.
for f in $(find "$kit/lib/sim" -type f); do patchelf --set-rpath '$ORIGIN:$ORIGIN/../../deps' "$f"; done
# The CLI: the package, and a wrapper that finds the kit relative to itself (the build tree's
# bin/flare names absolute paths of the build machine).
tar -C "$src/python" --exclude=__pycache__ --exclude='*.so' -cf - flare | tar -C "$kit/python" -xf -
cat > "$kit/bin/flare" <<'EOF'
#!/bin/sh
# The flare CLI from this kit (tools/gpu-kit/make-kit.sh): KIT/python with KIT/lib's hook.
kit=$(cd "$(dirname "$0")/.." && pwd)
FLARE_HOOK_LIB="${FLARE_HOOK_LIB:-$kit/lib/libflare_hook.so}" PYTHONPATH="$kit/python${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m flare "$@"
EOF
chmod +x "$kit/bin/flare"
# What the GPU run executes besides the binaries: cuda-gdb's scripts and the GPU tests,
# benchmarks and scripts (tests/gpu/*.sh), at the same relative paths as in the repository.
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
# glibc floor: the newest GLIBC_ symbol version any file needs.
all=("$kit"/bin/flare-* "$kit"/bin/flared "$kit"/lib/*.so "$kit"/lib/flare/*.so "$kit"/deps/*)
need=$(for f in "${all[@]}"; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2 -n | tail -1)
cxx=$(for f in "${all[@]}"; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBCXX_3\.4\.[0-9]*' | sort -t. -k3 -n | tail -1)
printf '%s\n%s\n' "$need" "$cxx" > "$kit/NEEDS"
du -sh "$kit" | awk -v n="$need" -v c="$cxx" '{print "make-kit: " $2 " is " $1 "; needs " n " and " c " or newer"}'
