"""The wheel (`make wheel`, tools/packaging/make-wheel.sh) carries everything (issue 23, item 1).

The wheel is built from this build tree, installed with pip into a fresh venv (no build tools
inside, no network: --no-index), and used from there only: the venv's `flared` receives a
simulated Python job run with the venv's `flare run` (so the wheel's libflare_hook.so, its
exporter and its Python tracing modules), then the venv's `flare export`, `flare-export`,
`flare timeline` and `flare report` read the job back. Nothing may resolve a library from the
build machine's non-system packages: ldd of every ELF file in the venv is checked.
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAKE_WHEEL = os.path.join(ROOT, "tools", "packaging", "make-wheel.sh")
# What a wheel may take from the machine (manylinux: glibc, libstdc++, libgcc_s).
SYSTEM = re.compile(r"^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|"
                    r"librt\.so|libresolv\.so|libutil\.so|libstdc\+\+\.so|libgcc_s\.so)")


@pytest.fixture(scope="module")
def venv(build_dir, tmp_path_factory):
    for tool in ("patchelf",):
        if shutil.which(tool) is None:
            pytest.fail("%s not installed (deploy/install-deps.sh)" % tool)
    for module in ("wheel", "auditwheel"):
        if subprocess.run([sys.executable, "-c", "import " + module]).returncode != 0:
            pytest.fail("python module %s missing (pip install %s; deploy/install-deps.sh)"
                        % (module, module))
    base = tmp_path_factory.mktemp("wheel")
    made = subprocess.run(["bash", MAKE_WHEEL, build_dir, str(base / "dist"), str(base / "work")],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHON=sys.executable))
    assert made.returncode == 0, made.stderr
    wheels = glob.glob(str(base / "dist" / "flare-*.whl"))
    assert len(wheels) == 1, wheels
    env = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=120)
    inst = subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "-q",
                           "--no-index", "--no-deps", wheels[0]],
                          capture_output=True, text=True, timeout=300)
    assert inst.returncode == 0, inst.stderr
    return {"wheel": wheels[0], "env": env, "base": base}


def clean_env(extra=None):
    """The environment of a user with only the venv: no build-tree hook, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FLARE_", "LD_")) and k != "PYTHONPATH"}
    env.update(extra or {})
    return env


def test_wheel_is_tagged_manylinux_and_holds_every_part(venv):
    name = os.path.basename(venv["wheel"])
    assert re.match(r"flare-[0-9.]+-py3-none-manylinux_2_\d+_x86_64\.whl$", name), name
    files = set(zipfile.ZipFile(venv["wheel"]).namelist())
    for rel in ("flare/cli.py", "flare/programs.py", "flare/lib/libflare_hook.so",
                "flare/lib/libflare_exporter.so", "flare/bin/flared", "flare/bin/flare-export",
                "flare/bin/flare-timeline", "flare/bin/flare-diagnose"):
        assert rel in files, rel
    assert any(re.match(r"flare/lib/flare/libflare_pyprof_cp3\d+\.so$", f) for f in files)
    # Vendored as auditwheel does: renamed after their content.
    assert any(re.match(r"flare/lib/vendor/libprotobuf-[0-9a-f]{8}\.so", f) for f in files), \
        sorted(f for f in files if f.startswith("flare/lib/vendor/"))


def test_every_elf_in_the_venv_resolves_inside_it_or_from_the_base_system(venv):
    site = glob.glob(str(venv["env"] / "lib" / "python3*" / "site-packages" / "flare"))[0]
    elves = glob.glob(os.path.join(site, "bin", "*")) + glob.glob(os.path.join(site, "lib", "*.so"))
    elves += glob.glob(os.path.join(site, "lib", "flare", "*.so"))
    elves += glob.glob(os.path.join(site, "lib", "vendor", "*"))
    assert len(elves) > 10
    for f in elves:
        out = subprocess.run(["ldd", f], capture_output=True, text=True, env=clean_env()).stdout
        for line in out.splitlines():
            name = line.split()[0]
            assert "not found" not in line, (f, line)
            if "=>" in line and not SYSTEM.match(name):
                assert line.split("=>")[1].strip().startswith(site), (f, line)
    # flare/lib alone is a complete hook (what a container copies for a training pod).
    copy = os.path.join(str(venv["base"]), "hook-copy")
    shutil.copytree(os.path.join(site, "lib"), copy)
    for lib in ("libflare_hook.so", "libflare_exporter.so"):
        out = subprocess.run(["ldd", os.path.join(copy, lib)], capture_output=True, text=True,
                             env=clean_env()).stdout
        assert "not found" not in out and site not in out, out


def test_a_job_traced_from_the_venv_streams_to_its_flared_and_reads_back(venv, build_dir):
    env_bin = venv["env"] / "bin"
    work = venv["base"] / "job"
    work.mkdir()
    log = work / "flared.log"
    daemon = subprocess.Popen([str(env_bin / "flared"), "--listen", "127.0.0.1:0", "--http",
                               "127.0.0.1:0", "--db", str(work / "flared.db"),
                               "--diagnose-interval-s", "1"],
                              stdout=open(str(log), "w"), stderr=subprocess.STDOUT, env=clean_env())
    try:
        for _ in range(400):
            m = re.search(r"gRPC on port (\d+), HTTP on port (\d+)", log.read_text())
            if m:
                break
            assert daemon.poll() is None, log.read_text()
            time.sleep(0.05)
        assert m, log.read_text()
        grpc, http = "127.0.0.1:" + m.group(1), "127.0.0.1:" + m.group(2)
        # The job: two simulated ranks running the Python workload; the hook comes from the
        # wheel because nothing else is offered (no --hook, no FLARE_HOOK_LIB).
        job = "wheel-job"
        run = subprocess.run(
            [str(env_bin / "flare"), "run", "--daemon", grpc, "--job-id", job, "--",
             os.path.join(build_dir, "bin", "flare-sim-train"), "--ranks", "2", "--steps", "4",
             "--python", "--layers", "1", "--hidden", "512", "--seq", "256", "--tp", "1",
             "--quiet"],
            capture_output=True, text=True, timeout=180,
            env=clean_env({"FLARE_MODE": "raw",
                           "TRACED_PYTHON_API": "sim_train@_LoaderIter.__next__"}))
        assert run.returncode == 0, run.stderr
        assert "libflare_hook.so" not in run.stderr, run.stderr
        # Every rank's records reached the daemon (flare-sim-train waits for its ranks, whose
        # exporters flush at exit).
        deadline = time.time() + 30
        while True:
            st = subprocess.run([str(env_bin / "flare"), "status", "--all", "--json",
                                 "--daemon-http", http], capture_output=True, text=True,
                                timeout=60, env=clean_env())
            assert st.returncode == 0, st.stderr
            jobs = json.loads(st.stdout)["jobs"]
            ranks = [r for j in jobs for r in j["ranks"] if j["jobId"] == job]
            if len(ranks) == 2 and all(int(r["records"]) > 0 for r in ranks) or \
                    time.time() > deadline:
                break
            time.sleep(0.3)
        assert len(ranks) == 2 and all(int(r["records"]) > 0 for r in ranks), st.stdout
        # flare export --job: the daemon's records through the wheel's flare-export.
        exp = subprocess.run([str(env_bin / "flare"), "export", "--job", job, "--daemon-http",
                              http, "--quiet"], capture_output=True, text=True, timeout=120,
                             env=clean_env())
        assert exp.returncode == 0, exp.stderr
        recs = [json.loads(line) for line in exp.stdout.splitlines() if line.strip()]
        assert any(r.get("kind") == "gemm" for r in recs)
        # The Python tracing modules of the wheel traced the loader (raw mode keeps spans).
        spans = [r for r in recs if r.get("kind") == "span"]
        assert any(s["name"] == "sim_train@_LoaderIter.__next__" for s in spans), \
            sorted({s["name"] for s in spans})
        # The timeline of the job flared holds, and the offline tools as console scripts.
        got = subprocess.run([str(env_bin / "flare"), "timeline", "--job", job,
                              "--daemon-http", http, "-o", str(work / "trace.json"), "--quiet"],
                             capture_output=True, text=True, timeout=120, env=clean_env())
        assert got.returncode == 0, got.stderr
        assert json.loads((work / "trace.json").read_text())["traceEvents"]
        raw = subprocess.run([str(env_bin / "flare-export"), "--help"], capture_output=True,
                             text=True, timeout=60, env=clean_env())
        assert "usage: flare-export" in raw.stdout + raw.stderr
        diag = subprocess.run([str(env_bin / "flare-diagnose"), "--help"], capture_output=True,
                              text=True, timeout=60, env=clean_env())
        assert "flare-diagnose" in diag.stdout + diag.stderr
        # The report: text and the HTML page.
        rep = subprocess.run([str(env_bin / "flare"), "report", "--job", job, "--daemon-http",
                              http, "--html", str(work / "report.html"), "--text", "--quiet"],
                             capture_output=True, text=True, timeout=120, env=clean_env())
        assert rep.returncode == 0, rep.stderr
        assert job in rep.stdout
        assert "<html" in (work / "report.html").read_text()[:200].lower()
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
