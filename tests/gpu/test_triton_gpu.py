"""Triton kernels under libflare_hook.so on a real GPU (issue 19; needs PyTorch with Triton).

Triton's launcher takes cuLaunchKernelEx by dlsym on its own dlopen("libcuda.so.1") handle; the
hook's dlsym (src/hook/dlsym_interpose.cc) hands it the wrapper. The H200 run of 2026-11-26
recorded no Triton kernel at all; this counts them exactly. The simulated-stack twin is
tests/python/test_hook_dlsym.py.

Run: FLARE_BUILD_DIR=build python3 -m pytest tests/gpu/test_triton_gpu.py
"""
import collections
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

BUILD = os.environ.get("FLARE_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..",
                                                       "build"))

# 7 launches on a grid of 5 blocks, 3 on a grid of 2 x 3. Under the hook each block counts
# 1000 FLOPs (flare_register_kernel_linear, found in the global scope), so that a record's FLOPs
# tell its grid.
WORKLOAD = r"""
import ctypes, sys
import torch, triton, triton.language as tl

@triton.jit
def flare_probe_add(x, y, out, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)

try:
    reg = ctypes.CDLL(None).flare_register_kernel_linear
    reg.argtypes = [ctypes.c_char_p, ctypes.c_int] + [ctypes.c_double] * 4
    assert reg(b"flare_probe_add", 1, 0.0, 1000.0, 0.0, 0.0) == 0
except AttributeError:
    pass  # not under the hook
n = 6 * 1024
x = torch.randn(n, device="cuda"); y = torch.randn(n, device="cuda"); out = torch.empty_like(x)
for _ in range(7):
    flare_probe_add[(5,)](x, y, out, n, BLOCK=1024)
for _ in range(3):
    flare_probe_add[(2, 3)](x, y, out, n, BLOCK=1024)
torch.cuda.synchronize()
assert torch.allclose(out, x + y)
print("ok")
"""


def test_triton_launches_are_recorded_with_their_grids(tmp_path):
    hook = os.path.join(BUILD, "lib", "libflare_hook.so")
    spool = tmp_path / "spool"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLARE_")}
    env.update(LD_PRELOAD=hook, FLARE_OUTPUT_DIR=str(spool), FLARE_JOB_ID="triton",
               FLARE_MODE="raw", TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    # From a file: @triton.jit reads its function's source (inspect), which `python -c` lacks.
    script = tmp_path / "triton_workload.py"
    script.write_text(WORKLOAD)
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and "ok" in run.stdout, run.stdout + run.stderr
    exp = subprocess.run([os.path.join(BUILD, "bin", "flare-export"), "--input", str(spool)],
                         capture_output=True, text=True, check=True)
    recs = [json.loads(line) for line in exp.stdout.splitlines()]
    triton = [r for r in recs if r["kind"] == "kernel" and "flare_probe_add" in r["name"]]
    assert collections.Counter(r["flops"] for r in triton) == {5000: 7, 6000: 3}, \
        sorted(collections.Counter(r["name"] for r in recs).items())
    assert all(r["duration_ns"] > 0 for r in triton)
