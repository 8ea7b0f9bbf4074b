#!/usr/bin/env bash
# Packs what the GPU checks need from a build made here into one folder that can travel to a GPU
# machine without Flare's build dependencies (gRPC, protobuf, SQLite are not installed there):
#   KIT/bin     flared, flare-export, flare-diagnose, flare-timeline (stripped; the `flare` CLI runs from python/)
#   KIT/lib     libflare_hook.so, libflare_exporter.so, libflare_hang_capture_test.so (stripped)
#   KIT/deps    the shared libraries those link that are not part of glibc or libstdc++, found
#               through RUNPATH ($ORIGIN/../deps), so that no LD_LIBRARY_PATH is needed
# Use it there as FLARE_BUILD_DIR=KIT (tests/gpu/run_device.sh).
# The binaries need glibc 2.34 or newer (checked below) and the machine's own libstdc++.
#
# Usage: tools/gpu-kit/make-kit.sh [BUILD_DIR] [KIT_DIR]   (defaults: build .gpukit)
set -euo pipefail
build=${1:-build}
kit=${2:-.gpukit}
[ -f "$build/lib/libflare_hook.so" ] || { echo "make-kit: $build/lib/libflare_hook.so not found (make build first)" >&2; exit 1; }
rm -rf "$kit"
mkdir -p "$kit/bin" "$kit/lib" "$kit/deps"
bins=(flared flare-export flare-diagnose flare-timeline)
libs=(libflare_hook.so libflare_exporter.so libflare_hang_capture_test.so)
for b in "${bins[@]}"; do [ -f "$build/bin/$b" ] && cp "$build/bin/$b" "$kit/bin/"; done
for l in "${libs[@]}"; do [ -f "$build/lib/$l" ] && cp "$build/lib/$l" "$kit/lib/"; done
strip --strip-debug "$kit"/bin/* "$kit"/lib/*.so
# Dependencies: everything ldd resolves outside glibc, libstdc++/libgcc and the CUDA libraries
# (the GPU machine brings its own CUDA; the hook resolves the real ones at run time).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libutil\.so|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libnccl|libcupti)'
for f in "$kit"/bin/* "$kit"/lib/*.so; do
  ldd "$f" | awk '/=> \//{print $1, $3}' | while read -r name path; do
    if ! [[ $name =~ $skip ]] && [ ! -f "$kit/deps/$name" ]; then cp -L "$path" "$kit/deps/$name"; fi
  done
done
strip --strip-debug "$kit"/deps/* 2>/dev/null || true
# RUNPATHs, so that nothing needs LD_LIBRARY_PATH there (it would leak these libraries into
# PyTorch and every child process): binaries and libraries find deps/ relative to themselves.
command -v patchelf >/dev/null || { echo "make-kit: patchelf is needed (apt-get install patchelf)" >&2; exit 1; }
for f in "$kit"/bin/* "$kit"/lib/*.so; do patchelf --set-rpath '$ORIGIN/../deps' "$f"; done
for f in "$kit"/deps/*; do patchelf --set-rpath '$ORIGIN' "$f"; done
# glibc floor: the newest GLIBC_ symbol version any file needs.
need=$(for f in "$kit"/bin/* "$kit"/lib/*.so "$kit"/deps/*; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2 -n | tail -1)
cxx=$(for f in "$kit"/bin/* "$kit"/lib/*.so "$kit"/deps/*; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBCXX_3\.4\.[0-9]*' | sort -t. -k3 -n | tail -1)
printf '%s\n%s\n' "$need" "$cxx" > "$kit/NEEDS"
du -sh "$kit" | awk -v n="$need" -v c="$cxx" '{print "make-kit: " $2 " is " $1 "; needs " n " and " c " or newer"}'
