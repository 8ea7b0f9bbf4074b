"""The GPU overhead benchmark's harness (tests/gpu/bench/overhead.py), driven by a stand-in
workload that needs no GPU: every arm runs in every repetition with the right environment, the
overhead is the per-repetition ratio to the bare arm (so drift between repetitions cancels), and
a failing arm is a clear error. The real measurement needs a GPU (tests/gpu/README.md)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "tests", "gpu", "bench")


def run(build_dir, tmp_path, *extra, env=None):
    out = tmp_path / "overhead.json"
    cmd = [sys.executable, os.path.join(BENCH, "overhead.py"), "--build", str(build_dir),
           "--workload", os.path.join(BENCH, "standin_workload.py"), "--sizes", "tiny,small",
           "--reps", "3", "--steps", "5", "--warmup", "1", "--json", str(out), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {}))), out


def test_overhead_is_the_per_repetition_ratio_to_the_bare_arm(build_dir, tmp_path):
    proc, out = run(build_dir, tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert len(data["runs"]) == 3 * 2 * 4
    for size in ("tiny", "small"):
        rows = data["summary"][size]
        assert set(rows) == {"bare", "flare-summary", "flare-raw", "torch-profiler"}
        assert rows["flare-summary"]["overhead_pct"] == pytest.approx(5.0)
        assert rows["flare-raw"]["overhead_pct"] == pytest.approx(10.0)
        assert rows["torch-profiler"]["overhead_pct"] == pytest.approx(30.0)
        # The stand-in drifts 1% per repetition; the ratio cancels it, the raw medians do not.
        assert rows["flare-raw"]["overhead_pct_max"] - rows["flare-raw"]["overhead_pct_min"] < 1e-9
        assert rows["flare-summary"]["reps"] == 3
        assert rows["flare-summary"]["spool_bytes_per_step"] >= 0
    assert "| small | flare-raw |" in proc.stdout and "+10.00%" in proc.stdout
    # Shuffled order: not every repetition runs the arms in the same sequence.
    orders = {}
    for r in data["runs"]:
        orders.setdefault((r["rep"], r["size"]), []).append(r["arm"])
    assert len({tuple(v) for v in orders.values()}) > 1


def test_a_failing_arm_is_a_clear_error(build_dir, tmp_path):
    proc, _ = run(build_dir, tmp_path, env={"STANDIN_FAIL_ARM": "flare-raw"})
    assert proc.returncode != 0
    assert "flare-raw" in proc.stderr and "failing flare-raw as asked" in proc.stderr


def test_arms_must_include_the_bare_one(build_dir, tmp_path):
    proc, _ = run(build_dir, tmp_path, "--arms", "flare-raw")
    assert proc.returncode == 2 and "bare" in proc.stderr
