"""libflare_hook.so against the real CUDA, cuBLAS and NCCL with PyTorch (needs a GPU).

Run: FLARE_BUILD_DIR=build python3 -m pytest tests/gpu
Skipped on machines without a GPU or without PyTorch.
"""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

BUILD = os.environ.get("FLARE_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..",
                                                       "build"))


def test_matmul_tflops_and_allreduce_bytes(tmp_path):
    hook = os.path.join(BUILD, "lib", "libflare_hook.so")
    spool = tmp_path / "spool"
    out = tmp_path / "independent.json"
    env = dict(os.environ, LD_PRELOAD=hook, FLARE_OUTPUT_DIR=str(spool), FLARE_JOB_ID="gpu")
    subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "hook_workload.py"),
                    str(out)], env=env, check=True, timeout=600)
    ref = json.loads(out.read_text())
    exp = subprocess.run([os.path.join(BUILD, "bin", "flare-export"), "--input", str(spool)],
                         capture_output=True, text=True, check=True)
    recs = [json.loads(l) for l in exp.stdout.splitlines()]
    gemms = [r for r in recs if r["kind"] == "gemm" and r["shape"][:3] == [8192, 8192, 8192]]
    assert len(gemms) >= 10
    flare_ms = sorted(r["duration_ns"] for r in gemms)[len(gemms) // 2] / 1e6
    flops = 2 * 8192 ** 3
    flare_tflops, ref_tflops = flops / flare_ms / 1e9, flops / ref["matmul_ms"] / 1e9
    assert flare_tflops == pytest.approx(ref_tflops, rel=0.10)
    ar = [r for r in recs if r["name"] == "ncclAllReduce"]
    assert ar and ar[-1]["bytes"] == ref["allreduce_bytes"] and ar[-1]["nranks"] == 1
