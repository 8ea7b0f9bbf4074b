"""The GPU kit (tools/gpu-kit/make-kit.sh) carries everything a GPU run needs (issue 18, item 6),
Flare itself as the wheel users install (issue 23).

A kit is built from the build tree, then moved to another directory (as it is when carried to a
GPU machine); tests/gpu/kit-env.sh installs its wheel into a venv there (no network) and lays
out the tree the GPU scripts read, whose programs and hook must resolve into that venv. A
simulated Python training job preloads the installed hook: its Python spans must be traced,
which needs the wheel's lib/flare/ tracing modules (the first H100 run found a kit without them:
it traced no Python and said so only in a log line), and the installed flare-export and `flare`
CLI must read the spool. A kit without its wheel is an error, not a fallback.
"""
import json
import os
import shutil
import subprocess
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAKE_KIT = os.path.join(ROOT, "tools", "gpu-kit", "make-kit.sh")
KIT_ENV = os.path.join(ROOT, "tests", "gpu", "kit-env.sh")
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


def install(kit, env=None):
    """tests/gpu/kit-env.sh's flare_use_kit KIT, as the GPU scripts run it: the variables it
    exports (FLARE_BUILD_DIR, PYTHON), or the failure's exit status and message."""
    script = ('. "%s" && flare_use_kit "%s" && echo "FLARE_BUILD_DIR=$FLARE_BUILD_DIR" && '
              'echo "PYTHON=$PYTHON"' % (KIT_ENV, kit))
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLARE_") and
            k not in ("PYTHON", "PYTHONPATH", "LD_PRELOAD")}
    base.update(env or {})
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300,
                          env=base)
    got = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return proc, got


def test_kit_carries_the_wheel_and_only_what_the_wheel_cannot_hold(moved_kit):
    wheels = list((moved_kit / "wheel").glob("flare-*-py3-none-manylinux_*_x86_64.whl"))
    assert len(wheels) == 1, list((moved_kit / "wheel").iterdir())
    with zipfile.ZipFile(wheels[0]) as z:
        names = set(z.namelist())
    for rel in ("flare/lib/libflare_hook.so", "flare/bin/flared", "flare/bin/flare-export",
                "flare/cli.py"):
        assert rel in names, rel
    for rel in ("tools/cuda-gdb-scripts/flare_nccl_steps.py", "tests/gpu/acceptance.sh",
                "tests/gpu/capture.sh", "tests/gpu/run_device.sh", "tests/gpu/kit-env.sh",
                "tests/gpu/bench/accuracy.py", "tests/gpu/bench/overhead.py",
                "tests/gpu/bench/proc_readings.py",
                "sim/bin/flare-sim-train", "sim/lib/sim/libcudart.so.13", "NEEDS", "VERSION"):
        assert (moved_kit / rel).exists(), rel
    # Flare itself only in the wheel: no second copy of the hook, daemon or CLI beside it that
    # a script could run instead.
    for rel in ("lib", "python", "deps", "bin/flared", "bin/flare", "bin/flare-export"):
        assert not (moved_kit / rel).exists(), rel


def test_a_kit_without_its_wheel_is_an_error_not_a_fallback(moved_kit, build_dir, tmp_path):
    broken = tmp_path / "kit"
    shutil.copytree(moved_kit, broken, symlinks=True, ignore=shutil.ignore_patterns(
        "venv", "installed"))
    for w in (broken / "wheel").iterdir():
        w.unlink()
    proc, got = install(broken)
    assert proc.returncode == 2 and "FLARE_BUILD_DIR" not in got
    assert "no wheel in %s/wheel/" % broken in proc.stderr, proc.stderr
    # The scripts stop there, with that message, before running anything.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLARE_")}
    env.update(OUT=str(tmp_path / "out"), FLARE_BUILD_DIR=str(broken), FLARE_ACCEPTANCE_SIM="1")
    acc = subprocess.run(["bash", str(broken / "tests" / "gpu" / "acceptance.sh")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert acc.returncode == 2 and "no wheel in" in acc.stderr, acc.stderr
    assert not (tmp_path / "out" / "summary.json").exists()


def test_the_wheel_is_installed_into_a_venv_and_is_what_runs(moved_kit):
    proc, got = install(moved_kit)
    assert proc.returncode == 0, proc.stderr
    view, venv = got["FLARE_BUILD_DIR"], str(moved_kit / "venv")
    assert view == str(moved_kit / "installed") and got["PYTHON"] == venv + "/bin/python"
    info = (moved_kit / "installed" / "INSTALLED").read_text().splitlines()
    site = info[1]
    assert site.startswith(venv + "/") and site.endswith("/site-packages/flare"), info
    # Every program and library the scripts name resolves into the installed package.
    for rel, target in (("lib/libflare_hook.so", site + "/lib/libflare_hook.so"),
                        ("lib/flare", site + "/lib/flare"),
                        ("bin/flared", venv + "/bin/flared"),
                        ("bin/flare", venv + "/bin/flare"),
                        ("bin/flare-export", venv + "/bin/flare-export")):
        assert os.path.realpath(os.path.join(view, rel)) == target, rel
    # The simulated stack stays the kit's own.
    assert os.path.realpath(os.path.join(view, "bin", "flare-sim-train")) == str(
        moved_kit / "sim" / "bin" / "flare-sim-train")
    # Installed once: a second use finds it and installs nothing.
    again, got2 = install(moved_kit)
    assert again.returncode == 0 and got2 == got and "installed" not in again.stderr


def test_moved_kit_traces_python(moved_kit, sim_train, tmp_path):
    proc, got = install(moved_kit)
    assert proc.returncode == 0, proc.stderr
    view = got["FLARE_BUILD_DIR"]
    spool = tmp_path / "spool"
    run = sim_train("--ranks", 1, "--steps", STEPS, "--python", "--layers", 1, "--hidden", 512,
                    "--seq", 256, "--tp", 1, "--data-ms", 1,
                    env={"LD_PRELOAD": os.path.join(view, "lib", "libflare_hook.so"),
                         "FLARE_OUTPUT_DIR": str(spool), "FLARE_JOB_ID": "kit",
                         "FLARE_MODE": "raw",
                         "TRACED_PYTHON_API": "sim_train@_LoaderIter.__next__"})
    assert run.returncode == 0, run.stderr
    assert "pyprof" not in run.stderr.lower() or "not found" not in run.stderr.lower(), run.stderr
    exp = subprocess.run([os.path.join(view, "bin", "flare-export"), "--input", str(spool)],
                         capture_output=True, text=True, timeout=120)
    assert exp.returncode == 0, exp.stderr
    recs = [json.loads(line) for line in exp.stdout.splitlines() if line.strip()]
    spans = [r for r in recs if r.get("kind") == "span"]
    nexts = [s for s in spans if s["name"] == "sim_train@_LoaderIter.__next__"]
    # One span per batch, plus the call that ends the loop (StopIteration).
    assert len(nexts) >= STEPS, sorted({s["name"] for s in spans})
    assert any(r.get("kind") == "gemm" for r in recs)
    # The installed CLI runs from the moved kit's venv and finds the wheel's own tools.
    cli = subprocess.run([os.path.join(view, "bin", "flare"), "export", "--input", str(spool)],
                         capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items()
                              if k not in ("FLARE_HOOK_LIB", "PYTHONPATH")})
    assert cli.returncode == 0, cli.stderr
    assert len(cli.stdout.splitlines()) == len(exp.stdout.splitlines())
