#!/usr/bin/env bash
# Installs what Flare needs to build and test, from Debian's packages and PyPI.
# Idempotent: packages already present are not touched, and the script does nothing
# (and needs no network) when everything is there. Run as root or with sudo.
set -euo pipefail

DEB_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev pybind11-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libsqlite3-dev sqlite3 zlib1g-dev libssl-dev
  libpq-dev postgresql openssl
  time valgrind
  # patchelf: tools/gpu-kit/make-kit.sh sets the kit's RUNPATHs (tests/python/test_gpu_kit.py)
  patchelf
  prometheus
  chromium
  # clang with libFuzzer and the sanitizers' runtimes: tools/fuzz/run.sh (`make fuzz-test`)
  clang libclang-rt-dev
)

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: Debian packages present"
fi

# Python test dependencies, for every interpreter the tests run on.
# FLARE_PYTHONS may list interpreters; by default the first python3 on PATH.
# Entries are PIP_NAME or PIP_NAME=IMPORT_NAME. scipy/numpy check the statistics
# (tests/python/test_stats_scipy.py); HolisticTraceAnalysis checks that the timeline export loads
# in HTA (tests/python/test_timeline.py); grpcio: tests/python/test_daemon_stream.py runs a
# traced rank that uses Python gRPC beside Flare's exporter.
# pyyaml, kubernetes-validate (Kubernetes API schemas) and the Debian package prometheus
# (promtool, the server): tests/python/test_deploy.py.
# The Debian package chromium (headless) renders `flare report --html` pages in
# tests/python/test_report.py.
# setuptools, wheel and auditwheel: `make wheel` builds the wheel, tags it and verifies its
# manylinux tag
# (tools/packaging/make-wheel.sh, tests/python/test_wheel.py).
PY_PACKAGES=(pytest scipy numpy psutil HolisticTraceAnalysis=hta grpcio=grpc pyyaml=yaml
  kubernetes-validate=kubernetes_validate setuptools wheel auditwheel)
for py in ${FLARE_PYTHONS:-$(command -v python3)}; do
  for entry in "${PY_PACKAGES[@]}"; do
    pkg="${entry%%=*}"
    mod="${entry#*=}"
    if ! "$py" -c "import $mod" 2>/dev/null; then
      echo "install-deps: pip install $pkg for $py"
      "$py" -m pip install -q "$pkg"
    fi
  done
done

# CUDA toolkit: headers and libraries are needed to build (not a GPU).
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
if [ ! -f "$CUDA_HOME/include/cuda_runtime_api.h" ] || [ ! -f "$CUDA_HOME/include/nccl.h" ]; then
  echo "install-deps: CUDA toolkit headers not found under $CUDA_HOME (set CUDA_HOME);" \
       "Flare builds against the real CUDA/cuBLAS/NCCL headers" >&2
  exit 1
fi
echo "install-deps: done"
