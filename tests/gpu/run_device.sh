#!/usr/bin/env bash
# Runs the GPU checks and benchmarks on a GPU machine that has CUDA, PyTorch and cuda-gdb but not
# Flare's build dependencies: Flare comes as a kit made on the build machine
# (tools/gpu-kit/make-kit.sh build .gpukit) and carried along. Results go to $OUT (default
# /tmp/flare-gpu-out): nvidia-smi.txt, gpu-tests.log + gpu-junit.xml, accuracy.{md,json},
# overhead.{md,json}. docs/benchmarks.md quotes them with the GPU and the date.
#
# tests/gpu/acceptance.sh runs the parts below, time-boxed, within one 8-minute run.
#
# Usage (repo root, or a kit's root): tests/gpu/run_device.sh env|checks|accuracy|overhead|all [args...]
#   env        nvidia-smi.txt and environment.json (GPU, driver, CUDA, PyTorch, kit); also written
#              by the first other action into an OUT that has none
#   checks     pytest tests/gpu (hook, Python tracing, cuda-gdb inspection)   ~1-2 min
#   accuracy   per-kernel durations vs CUPTI (torch.profiler) and torch.cuda.Event   ~40 s
#              per FLARE_TIMING named (accuracy [pair] [pair-uncorrected] [end]; default pair)
#   overhead   tests/gpu/bench/overhead.py [args] (default: every workload, --budget-s 540)
# The kit: FLARE_KIT, else FLARE_BUILD_DIR, else .gpukit. Flare runs from the kit's wheel,
# installed into KIT/venv on first use (tests/gpu/kit-env.sh); Python (pytest, the benchmarks)
# is that venv's, which sees the system's PyTorch. A kit without its wheel is an error.
set -uo pipefail
what=${1:-all}
shift || true
OUT=${OUT:-/tmp/flare-gpu-out}
mkdir -p "$OUT"
. "$(dirname "${BASH_SOURCE[0]}")/kit-env.sh"
flare_use_kit "${FLARE_KIT:-${FLARE_BUILD_DIR:-.gpukit}}" || exit 2
kit=$FLARE_BUILD_DIR
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
write_env() {
{
  date -u
  nvidia-smi || true
  ldd --version | head -1
  echo "kit needs: $(tr '\n' ' ' < "$kit/NEEDS" 2>/dev/null)"
  [ -f "$kit/INSTALLED" ] && echo "flare installed: $(sed -n 1p "$kit/INSTALLED" | cut -d' ' -f2) at $(sed -n 2p "$kit/INSTALLED") (with $(sed -n 4p "$kit/INSTALLED"))"
  strings "$(ldconfig -p | awk '/libstdc\+\+\.so\.6 /{print $NF; exit}')" | grep -c "^$(sed -n 2p "$kit/NEEDS")$" |
    sed 's/^1$/libstdc++: has it/; s/^0$/libstdc++: MISSING the kit'"'"'s GLIBCXX/'
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  command -v cuda-gdb nvcc
  echo "kit version: $(cat "$kit/VERSION" 2>/dev/null || echo unknown)"
} > "$OUT/nvidia-smi.txt" 2>&1
"$py" - "$OUT/environment.json" "$kit" <<'PY' 2>/dev/null || true
import json, os, platform, subprocess, sys
env = {"python": platform.python_version(), "glibc": " ".join(platform.libc_ver())}
try:
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=30).stdout.splitlines()
    if q:
        env["gpu"], env["driver"] = [x.strip() for x in q[0].split(",")[:2]]
except (OSError, subprocess.SubprocessError, ValueError):
    pass
try:
    import torch
    env["torch"] = torch.__version__
    env["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        env.setdefault("gpu", torch.cuda.get_device_name(0))
except Exception:  # noqa: BLE001 (no PyTorch: the simulated mode)
    pass
try:
    env["kit_version"] = open(os.path.join(sys.argv[2], "VERSION")).read().strip()
except OSError:
    pass
try:
    import flare
    env["flare_package"] = os.path.dirname(os.path.abspath(flare.__file__))
except ImportError:
    pass
json.dump(env, open(sys.argv[1], "w"), indent=1)
PY
}
if [ "$what" = env ] || [ "$what" = all ] || [ ! -f "$OUT/nvidia-smi.txt" ]; then write_env; fi
rc=0
if [ "$what" = checks ] || [ "$what" = all ]; then
  "$py" -m pytest -v -rs tests/gpu --junitxml="$OUT/gpu-junit.xml" > "$OUT/gpu-tests.log" 2>&1 || rc=1
  tail -25 "$OUT/gpu-tests.log"
fi
if [ "$what" = accuracy ] || [ "$what" = all ]; then
  # accuracy [pair|pair-uncorrected|end ...]: one run per timing (default pair); the first writes
  # accuracy.{md,json}, a later one accuracy-TIMING.{md,json}.
  [ "$what" = accuracy ] && [ $# -gt 0 ] || set -- pair
  first=1
  for timing in "$@"; do
    base=accuracy; [ $first = 1 ] || base=accuracy-$timing
    first=0
    "$py" tests/gpu/bench/accuracy.py --build "$kit" --timing "$timing" --json "$OUT/$base.json" > "$OUT/$base.md" 2> "$OUT/$base.err" || rc=1
    cat "$OUT/$base.md"; tail -20 "$OUT/$base.err"
  done
fi
if [ "$what" = overhead ] || [ "$what" = all ]; then
  [ $# -gt 0 ] || set -- --budget-s 540
  "$py" tests/gpu/bench/overhead.py --build "$kit" --json "$OUT/overhead.json" --md "$OUT/overhead.md" "$@" > /dev/null 2> "$OUT/overhead.err" || rc=1
  cat "$OUT/overhead.md"; tail -20 "$OUT/overhead.err"
fi
exit $rc
