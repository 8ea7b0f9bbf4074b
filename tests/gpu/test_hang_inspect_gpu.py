"""tools/cuda-gdb-scripts/flare_nccl_steps.py against a real hung kernel (needs a GPU, nvcc and
cuda-gdb). A ring-like kernel (hang_ring.cu) stops with known per-channel send/recv steps; the
script, attached with cuda-gdb in batch mode, must read exactly those steps and peers.

Run: python3 -m pytest tests/gpu/test_hang_inspect_gpu.py
Never run so far: no GPU was available when it was written.
"""
import os
import shutil
import subprocess
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPTS = os.path.join(ROOT, "tools", "cuda-gdb-scripts")

for tool in ("nvcc", "cuda-gdb", "nvidia-smi"):
    if not shutil.which(tool):
        pytest.skip("%s not found" % tool, allow_module_level=True)
if subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode != 0:
    pytest.skip("no GPU", allow_module_level=True)


def test_script_reads_the_ring_steps_of_a_hung_kernel(tmp_path):
    exe = tmp_path / "hang_ring"
    subprocess.run(["nvcc", "-G", "-o", str(exe), os.path.join(HERE, "hang_ring.cu")],
                   check=True, timeout=300)
    # Rank 2 of 4, three channels; channel 1's send connection stalled early.
    targets = [(40, 32), (3, 32), (40, 24)]
    args = [str(exe), "2", "4"] + [str(x) for pair in targets for x in pair]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
        time.sleep(1.0)  # the kernel reaches its spin
        env = dict(os.environ,
                   FLARE_CUDA_GDB_LAYOUT=os.path.join(SCRIPTS, "layouts", "flare_test_ring.json"))
        out = subprocess.run(["cuda-gdb", "-batch", "-nx", "-p", str(proc.pid), "-x",
                              os.path.join(SCRIPTS, "flare_nccl_steps.py")],
                             capture_output=True, text=True, timeout=180, env=env)
        lines = [l for l in (out.stdout + out.stderr).splitlines() if l.startswith("FLARE-")]
        steps = sorted(l for l in lines if l.startswith("FLARE-STEP"))
        expected = sorted(
            line for c, (send, recv) in enumerate(targets)
            for line in ("FLARE-STEP channel=%d peer=3 step=%d send=1" % (c, send),
                         "FLARE-STEP channel=%d peer=1 step=%d send=0" % (c, recv)))
        assert steps == expected, out.stdout + out.stderr
        # The process was detached, not killed: it is still hung.
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
