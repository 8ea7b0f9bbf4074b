#!/usr/bin/env bash
# Runs the GPU checks and benchmarks on a GPU machine that has CUDA, PyTorch and cuda-gdb but not
# Flare's build dependencies: Flare comes as a kit made on the build machine
# (tools/gpu-kit/make-kit.sh build .gpukit) and carried along. Results go to $OUT (default
# /tmp/flare-gpu-out): nvidia-smi.txt, gpu-tests.log + gpu-junit.xml, accuracy.{md,json},
# overhead.{md,json}. docs/benchmarks.md quotes them with the GPU and the date.
#
# Usage (repo root): tests/gpu/run_device.sh checks|accuracy|overhead|all [overhead args...]
#   checks     pytest tests/gpu (hook, Python tracing, cuda-gdb inspection)   ~3-5 min
#   accuracy   Flare's durations vs torch.cuda.Event and torch.profiler          ~1-2 min
#   overhead   tests/gpu/bench/overhead.py (default: small,medium; 3 reps)      ~6-9 min
set -uo pipefail
what=${1:-all}
shift || true
OUT=${OUT:-/tmp/flare-gpu-out}
mkdir -p "$OUT"
kit=$(realpath "${FLARE_KIT:-.gpukit}")
[ -f "$kit/lib/libflare_hook.so" ] || { echo "run_device: no kit at $kit (tools/gpu-kit/make-kit.sh)" >&2; exit 2; }
export FLARE_BUILD_DIR=$kit PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
{
  date -u
  nvidia-smi || true
  ldd --version | head -1
  echo "kit needs: $(tr '\n' ' ' < "$kit/NEEDS")"
  strings "$(ldconfig -p | awk '/libstdc\+\+\.so\.6 /{print $NF; exit}')" | grep -c "^$(sed -n 2p "$kit/NEEDS")$" |
    sed 's/^1$/libstdc++: has it/; s/^0$/libstdc++: MISSING the kit'"'"'s GLIBCXX/'
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  command -v cuda-gdb nvcc
} > "$OUT/nvidia-smi.txt" 2>&1
rc=0
if [ "$what" = checks ] || [ "$what" = all ]; then
  python3 -m pytest -v -rs tests/gpu --junitxml="$OUT/gpu-junit.xml" > "$OUT/gpu-tests.log" 2>&1 || rc=1
  tail -25 "$OUT/gpu-tests.log"
fi
if [ "$what" = accuracy ] || [ "$what" = all ]; then
  python3 tests/gpu/bench/accuracy.py --build "$kit" --json "$OUT/accuracy.json" > "$OUT/accuracy.md" 2> "$OUT/accuracy.err" || rc=1
  cat "$OUT/accuracy.md"; tail -20 "$OUT/accuracy.err"
fi
if [ "$what" = overhead ] || [ "$what" = all ]; then
  [ $# -gt 0 ] || set -- --sizes small,medium --reps 3
  python3 tests/gpu/bench/overhead.py --build "$kit" --json "$OUT/overhead.json" "$@" > "$OUT/overhead.md" 2> "$OUT/overhead.err" || rc=1
  cat "$OUT/overhead.md"; tail -20 "$OUT/overhead.err"
fi
exit $rc
