"""The GPU kit (tools/gpu-kit/make-kit.sh) carries everything a GPU run needs (issue 18, item 6).

A kit is built from the build tree, then moved to another directory (as it is when carried to a
GPU machine), and a simulated Python training job preloads the kit's hook from there: its Python
spans must be traced, which needs the kit's lib/flare/ tracing modules, and the kit's own
flare-export and `flare` CLI must read the spool. The first H100 run found a kit without
lib/flare/: it traced no Python and said so only in a log line.
"""
import json
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAKE_KIT = os.path.join(ROOT, "tools", "gpu-kit", "make-kit.sh")
STEPS = 4


@pytest.fixture(scope="module")
def moved_kit(build_dir, tmp_path_factory):
    if shutil.which("patchelf") is None:
        pytest.fail("patchelf not installed (Debian package patchelf; deploy/install-deps.sh)")
    base = tmp_path_factory.mktemp("kit")
    made = base / "made" / "kit"
    proc = subprocess.run(["bash", MAKE_KIT, build_dir, str(made)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    moved = base / "elsewhere" / "gpukit"
    moved.parent.mkdir()
    shutil.move(str(made), str(moved))
    assert not made.exists()
    return moved


def test_kit_has_every_part_of_a_gpu_run(moved_kit):
    for rel in ("lib/libflare_hook.so", "bin/flared", "bin/flare-export", "bin/flare",
                "tools/cuda-gdb-scripts/flare_nccl_steps.py", "tests/gpu/acceptance.sh",
                "tests/gpu/capture.sh", "tests/gpu/run_device.sh", "tests/gpu/bench/accuracy.py",
                "tests/gpu/bench/overhead.py", "python/flare/cli.py", "NEEDS"):
        assert (moved_kit / rel).exists(), rel
    assert list((moved_kit / "lib" / "flare").glob("libflare_pyprof_cp3*.so"))
    # No build-machine paths: the binaries find their libraries relative to themselves.
    for rel in ("bin/flared", "lib/libflare_hook.so"):
        rpath = subprocess.run(["patchelf", "--print-rpath", str(moved_kit / rel)],
                               capture_output=True, text=True, check=True).stdout.strip()
        assert rpath == "$ORIGIN/../deps", (rel, rpath)


def test_moved_kit_traces_python(moved_kit, sim_train, tmp_path):
    spool = tmp_path / "spool"
    run = sim_train("--ranks", 1, "--steps", STEPS, "--python", "--layers", 1, "--hidden", 512,
                    "--seq", 256, "--tp", 1, "--data-ms", 1,
                    env={"LD_PRELOAD": str(moved_kit / "lib" / "libflare_hook.so"),
                         "FLARE_OUTPUT_DIR": str(spool), "FLARE_JOB_ID": "kit",
                         "FLARE_MODE": "raw",
                         "TRACED_PYTHON_API": "sim_train@_LoaderIter.__next__"})
    assert run.returncode == 0, run.stderr
    assert "pyprof" not in run.stderr.lower() or "not found" not in run.stderr.lower(), run.stderr
    exp = subprocess.run([str(moved_kit / "bin" / "flare-export"), "--input", str(spool)],
                         capture_output=True, text=True, timeout=120)
    assert exp.returncode == 0, exp.stderr
    recs = [json.loads(line) for line in exp.stdout.splitlines() if line.strip()]
    spans = [r for r in recs if r.get("kind") == "span"]
    nexts = [s for s in spans if s["name"] == "sim_train@_LoaderIter.__next__"]
    # One span per batch, plus the call that ends the loop (StopIteration).
    assert len(nexts) >= STEPS, sorted({s["name"] for s in spans})
    assert any(r.get("kind") == "gemm" for r in recs)
    # The kit's CLI runs from the moved kit and finds the kit's own tools.
    cli = subprocess.run([str(moved_kit / "bin" / "flare"), "export", "--input", str(spool)],
                         capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items()
                              if k not in ("FLARE_HOOK_LIB", "PYTHONPATH")})
    assert cli.returncode == 0, cli.stderr
    assert len(cli.stdout.splitlines()) == len(exp.stdout.splitlines())
