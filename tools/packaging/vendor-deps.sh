#!/usr/bin/env bash
# Vendors the shared libraries that some ELF files link into one folder, the way auditwheel's
# `repair` does, so that the files run on a machine without Flare's build dependencies (gRPC,
# protobuf, abseil, SQLite, libpq, ...) and without LD_PRELOAD or LD_LIBRARY_PATH tricks:
#   - every library ldd resolves for the files, outside the base system (glibc, libstdc++ and
#     libgcc_s: what manylinux policies let a wheel take from the machine) and the CUDA
#     libraries (a GPU machine brings its own; the hook resolves the real ones at run time), is
#     copied into DEPS_DIR and stripped of debug information;
#   - each FILE gets the RUNPATH $ORIGIN/<path from its folder to DEPS_DIR>, each copied library
#     $ORIGIN, so that the tree can be moved anywhere as a whole.
# With --rename, as auditwheel does, each copied library is renamed after a hash of its content
# (libprotobuf.so.32 -> libprotobuf-1a2b3c4d.so.32), its soname set to that name and every
# DT_NEEDED that named it rewritten: libflare_hook.so is preloaded into PyTorch processes, and a
# vendored library must neither be taken for, nor replaced by, another copy of the same library
# that the process loads (the system's, another wheel's).
# Used by tools/packaging/make-wheel.sh (the wheel, which the GPU kit of tools/gpu-kit/make-kit.sh
# carries).
# Needs patchelf, ldd, strip and sha256sum.
#
# Usage: vendor-deps.sh [--rename] DEPS_DIR FILE...
set -euo pipefail
rename=0
if [ "${1:-}" = "--rename" ]; then rename=1; shift; fi
[ $# -ge 2 ] || { echo "usage: vendor-deps.sh [--rename] DEPS_DIR FILE..." >&2; exit 2; }
deps=$1
shift
command -v patchelf >/dev/null || { echo "vendor-deps: patchelf is needed (apt-get install patchelf)" >&2; exit 1; }
mkdir -p "$deps"
deps=$(cd "$deps" && pwd)
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libutil\.so|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libnccl|libcupti)'
# ldd lists the whole closure (libraries of libraries), so one pass over the files finds all.
# A library ldd cannot find is an error here rather than a broken tree there.
declare -A copied=()
for f in "$@"; do
  missing=$(ldd "$f" 2>/dev/null | awk '/=> not found/{print $1}' | grep -Ev "$skip" || true)
  [ -z "$missing" ] || { echo "vendor-deps: $f needs libraries ldd cannot find: $missing" >&2; exit 1; }
  while read -r name path; do
    [ -n "$name" ] || continue
    if ! [[ $name =~ $skip ]] && [ -z "${copied[$name]:-}" ]; then
      cp -L "$path" "$deps/$name"
      chmod u+w "$deps/$name"
      copied[$name]=$name
    fi
  done < <(ldd "$f" 2>/dev/null | awk '/=> \//{print $1, $3}')
done
for name in "${!copied[@]}"; do strip --strip-debug "$deps/$name" 2>/dev/null || true; done
if [ "$rename" = 1 ] && [ ${#copied[@]} -gt 0 ]; then
  replace=()
  for name in "${!copied[@]}"; do
    hash=$(sha256sum "$deps/$name" | cut -c1-8)
    stem=${name%%.so*}
    new="$stem-$hash${name#"$stem"}"
    mv "$deps/$name" "$deps/$new"
    patchelf --set-soname "$new" "$deps/$new"
    copied[$name]=$new
    replace+=(--replace-needed "$name" "$new")
  done
  # One patchelf call per file; a name the file does not need is left alone.
  for f in "$@"; do patchelf "${replace[@]}" "$f"; done
  for name in "${!copied[@]}"; do patchelf "${replace[@]}" "$deps/${copied[$name]}"; done
fi
for f in "$@"; do
  rel=$(realpath --relative-to="$(dirname "$(realpath "$f")")" "$deps")
  patchelf --set-rpath "\$ORIGIN/$rel" "$f"
done
for name in "${!copied[@]}"; do patchelf --set-rpath '$ORIGIN' "$deps/${copied[$name]}"; done
