"""The Python package: `pip install ./python` builds the binding and installs the CLI; the
in-process API (flare.step, flare.register_kernel) reaches libflare_hook.so on every interpreter,
natively and through the ctypes fallback; flare.Client reads a real flared with typed results."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from conftest import python_interpreters
from test_flared_diagnosis import beyond_load, daemon, run_job  # noqa: F401 (daemon: a fixture)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(REPO, "python")
WORKLOAD = os.path.join(REPO, "src", "sim", "workload")

# A training script's use of the API on the simulated stack: 3 steps, each launching a custom
# tiled kernel (grid of 10 blocks: amount 9 * 4096, see train.Kernel) declared with
# flare.register_kernel. Prints what the API returned as JSON.
PROBE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import flare
out = {"binding": flare.binding(), "hook": flare.hook_loaded()}
out["registered"] = flare.register_kernel("probe_tile_kernel", kind="gemm", flops=7,
                                          flops_per_block=1000, bytes_per_block=64)
try:
    flare.register_kernel("x", kind="tensor")
except ValueError as e:
    out["bad_kind"] = str(e)
try:
    flare.register_kernel("x", flops=-1)
except ValueError as e:
    out["bad_flops"] = str(e)
import train
stream = train.c_void_p()
train.check(train.cudaStreamCreateWithFlags(train.ctypes.byref(stream), 1), "stream")
kernel = train.Kernel("probe_tile_kernel", 1)
other = train.Kernel("probe_plain_kernel", 1)
out["steps"] = []
for _ in range(3):
    out["steps"].append(flare.step())
    kernel(9 * 4096, stream)
    other(9 * 4096, stream)
train.check(train.cudaDeviceSynchronize(), "sync")
print(json.dumps(out))
"""


def compile_binding(python, dest):
    """Builds flare/_native.c for `python` (its headers and extension suffix) into a copy of the
    package under `dest`; returns the directory to put on PYTHONPATH."""
    info = json.loads(subprocess.run(
        [python, "-c", "import json, sysconfig; print(json.dumps({'inc': "
         "sysconfig.get_paths()['include'], 'suffix': sysconfig.get_config_var('EXT_SUFFIX')}))"],
        capture_output=True, text=True, check=True).stdout)
    pkg = os.path.join(dest, "flare")
    shutil.copytree(os.path.join(PACKAGE, "flare"), pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    cc = shutil.which("cc") or shutil.which("gcc")
    res = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-I", info["inc"],
                          os.path.join(pkg, "_native.c"), "-o",
                          os.path.join(pkg, "_native" + info["suffix"]), "-ldl"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return dest


def run_probe(build_dir, python, pythonpath, tmp_path, traced=True):
    spool = tmp_path / "spool"
    env = dict(os.environ, PYTHONPATH=pythonpath, FLARE_OUTPUT_DIR=str(spool),
               FLARE_JOB_ID="pkgtest", FLARE_SIM_LIB_DIR=os.path.join(build_dir, "lib", "sim"))
    env.pop("LD_PRELOAD", None)
    if traced:
        env["LD_PRELOAD"] = os.path.join(build_dir, "lib", "libflare_hook.so")
    proc = subprocess.run([python, "-c", PROBE, WORKLOAD], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    records = []
    if traced:
        exp = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input",
                              str(spool)], capture_output=True, text=True, timeout=60)
        assert exp.returncode == 0, exp.stderr
        records = [json.loads(line) for line in exp.stdout.splitlines()]
    return out, records


def check_traced(out, records, binding):
    assert out["binding"] == binding
    assert out["hook"] is True
    assert out["registered"] is True
    assert "kind must be one of" in out["bad_kind"]
    assert "non-negative" in out["bad_flops"]
    assert out["steps"] == [True, True, True]
    markers = [r for r in records if r["name"] == "flare_step"]
    assert len(markers) == 3
    tiles = [r for r in records if r["name"].startswith("probe_tile_kernel")]
    assert len(tiles) == 3
    for r in tiles:
        assert r["kind"] == "gemm"
        assert r["flops"] == 7 + 1000 * 10  # per launch + per block x 10 blocks
        assert r["bytes"] == 64 * 10
    plain = [r for r in records if r["name"].startswith("probe_plain_kernel")]
    assert len(plain) == 3 and all(r["flops"] == 0 and r["kind"] == "kernel" for r in plain)


@pytest.mark.parametrize("version", ["3.9", "3.10", "3.11", "3.12", "3.13"])
def test_native_binding_on_every_interpreter(build_dir, tmp_path, version):
    python = python_interpreters().get(version)
    if python is None:
        pytest.skip("no CPython %s on this machine" % version)
    path = compile_binding(python, str(tmp_path / "pkg"))
    out, records = run_probe(build_dir, python, path, tmp_path)
    check_traced(out, records, "native")


def test_ctypes_fallback_from_a_source_checkout(build_dir, tmp_path):
    out, records = run_probe(build_dir, sys.executable, PACKAGE, tmp_path)
    check_traced(out, records, "ctypes")


@pytest.mark.parametrize("native", [True, False])
def test_without_flare_the_script_runs_unchanged(build_dir, tmp_path, native):
    path = compile_binding(sys.executable, str(tmp_path / "pkg")) if native else PACKAGE
    out, _ = run_probe(build_dir, sys.executable, path, tmp_path, traced=False)
    assert out["binding"] == ("native" if native else "ctypes")
    assert out["hook"] is False
    assert out["registered"] is False
    assert out["steps"] == [False, False, False]
    assert not (tmp_path / "spool").exists()


def test_pip_install_builds_the_binding_and_installs_the_cli(tmp_path):
    """The real `pip install ./python` into a fresh virtual environment (build isolation: pip
    fetches setuptools from the package index, as a user's install does)."""
    src = tmp_path / "src"
    shutil.copytree(PACKAGE, src, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                "__pycache__", "*.so"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(src)],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    py = str(venv / "bin" / "python")
    got = subprocess.run([py, "-c", "import flare, flare._native; print(flare.binding(), "
                          "flare._native.__file__)"], capture_output=True, text=True,
                         cwd=str(tmp_path))
    assert got.returncode == 0, got.stderr
    binding, path = got.stdout.split()
    assert binding == "native" and path.startswith(str(venv))
    cli = subprocess.run([str(venv / "bin" / "flare"), "--help"], capture_output=True, text=True)
    assert cli.returncode == 0 and "status" in cli.stdout


# ---- the client API against a real flared ---------------------------------------------------

def test_client_reads_jobs_ranks_report_and_diagnoses(build_dir, daemon, tmp_path):
    sys.path.insert(0, PACKAGE)
    import flare
    run_job(build_dir, daemon, tmp_path, "slowgpu", {"FLARE_SIM_CLOCK_FACTOR": "3:0.8"})
    c = flare.Client("127.0.0.1:%d" % daemon.http)
    assert c.healthy()

    jobs = {j.job_id: j for j in c.jobs(include_finished=True)}
    assert "slowgpu" in jobs and jobs["slowgpu"].world_size == 8
    ranks = c.ranks("slowgpu")
    assert sorted(r.rank for r in ranks) == list(range(8))
    assert all(r.records > 0 and r.batches > 0 for r in ranks)

    report = c.report("slowgpu")
    raw = json.loads(daemon.get("/api/v1/jobs/slowgpu/report"))
    assert len(report.kernels) == len(raw["signatures"]) > 0
    rows = report.rows()
    assert set(rows[0]) >= {"name", "kind", "shape", "count", "time_share", "tflops"}
    gemms = [r for r in rows if r["kind"] == "gemm"]
    assert gemms and all(r["tflops"] > 0 and r["shape"].count("x") == 3 for r in gemms)
    colls = [r for r in rows if r["kind"] == "collective"]
    assert colls and all(r["busbw_gbps"] > 0 for r in colls)
    assert abs(sum(r["time_share"] for r in rows) - 1.0) < 0.05
    assert [r["count"] for r in rows] == [int(s["count"]) for s in raw["signatures"]]

    def beyond_load_of(found):
        """The client's diagnoses or alerts beyond what this machine's load explains
        (test_flared_diagnosis.beyond_load)."""
        as_dicts = [{"kind": f.kind, "ranks": f.ranks} if hasattr(f, "ranks")
                    else {"kind": f.kind, "rank": f.rank} for f in found]
        kept = {id(d) for d in beyond_load(tmp_path, "slowgpu", as_dicts)}
        return [f for f, d in zip(found, as_dicts) if id(d) in kept]

    found = beyond_load_of(c.diagnoses("slowgpu"))
    assert [(d.kind, d.ranks, d.team) for d in found] == [("gpu_slow", [3], "operations")]
    assert found[0].evidence and found[0].evidence[0].text

    alerts = []
    for _ in range(75):  # the analyzer raises it within its interval (1 s here)
        alerts = beyond_load_of(c.alerts(job="slowgpu"))
        if alerts:
            break
        import time
        time.sleep(0.2)
    assert [(a.kind, a.rank, a.team) for a in alerts] == [("gpu_slow", 3, "operations")]
    assert flare.rows(alerts)[0]["kind"] == "gpu_slow"
    assert c.hangs("slowgpu") == []

    with pytest.raises(flare.UnknownJob):
        c.report("no-such-job")
    with pytest.raises(ValueError):
        c.report("")


def test_client_errors_are_typed(tmp_path):
    sys.path.insert(0, PACKAGE)
    import socket

    import flare
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    c = flare.Client("127.0.0.1:%d" % port, timeout=2)
    assert not c.healthy()
    with pytest.raises(flare.DaemonUnreachable):
        c.jobs()
    with pytest.raises(ValueError):
        flare.Client("no-port")
