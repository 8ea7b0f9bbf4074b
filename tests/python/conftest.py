"""Shared fixtures: where the build is, and how to run flare-sim-train."""
import glob
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("FLARE_BUILD_DIR", os.path.join(ROOT, "build"))


@pytest.fixture(scope="session")
def build_dir():
    if not os.path.exists(os.path.join(BUILD, "bin", "flare-sim-train")):
        pytest.fail("build not found at %s (run `make build` or set FLARE_BUILD_DIR)" % BUILD)
    return BUILD


def python_interpreters():
    """Every pyenv CPython from 3.9 to 3.13 on this machine (the CI machine has each)."""
    found = {}
    roots = [os.path.expanduser("~/.pyenv/versions"), "/root/.pyenv/versions"]
    for root in roots:
        for path in sorted(glob.glob(os.path.join(root, "3.*", "bin", "python3"))):
            version = os.path.basename(os.path.dirname(os.path.dirname(path)))
            minor = tuple(int(x) for x in version.split(".")[:2])
            if (3, 9) <= minor <= (3, 13):
                found.setdefault("%d.%d" % minor, path)
    return found


class SimRun:
    def __init__(self, proc, result):
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.ranks = result.get("ranks", []) if result else []

    def median(self, rank, key):
        values = sorted(self.ranks[rank][key])
        n = len(values)
        return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2

    def low(self, rank, key):
        """The smallest of a rank's per-step values: for a GPU time measured between two events
        (gemm_ms), the step least inflated by the host (a preempted host that launches the GEMM
        late after recording the start event adds its delay; nothing makes it shorter)."""
        return min(self.ranks[rank][key])


@pytest.fixture
def sim_train(build_dir, tmp_path):
    """Runs flare-sim-train with extra environment; returns a SimRun."""
    def run(*args, env=None, timeout=120):
        out = tmp_path / ("run%d.json" % len(list(tmp_path.iterdir())))
        full_env = {k: v for k, v in os.environ.items()
                    if not k.startswith("FLARE_SIM_") and k != "LD_PRELOAD"}
        full_env.update(env or {})
        cmd = [os.path.join(build_dir, "bin", "flare-sim-train"), *map(str, args),
               "--json", str(out), "--quiet"]
        proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
        result = json.loads(out.read_text()) if out.exists() else None
        return SimRun(proc, result)
    return run


@pytest.fixture
def probe(build_dir, tmp_path):
    """Runs hook_probe MODE under the hook (FLARE_* of this environment left out, `env` added);
    returns (process, records of its spool)."""
    hook = os.path.join(build_dir, "lib", "libflare_hook.so")

    def run(*args, env=None):
        spool = tmp_path / ("spool-" + args[0])
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLARE_")}
        full_env.update({"LD_PRELOAD": hook, "FLARE_OUTPUT_DIR": str(spool),
                         "FLARE_JOB_ID": "probe"}, **(env or {}))
        proc = subprocess.run([os.path.join(build_dir, "bin", "hook_probe"), *map(str, args)],
                              env=full_env, capture_output=True, text=True, timeout=60)
        return proc, exported(build_dir, spool)
    return run


def exported(build_dir, spool):
    """The records of the spool folder `spool` as flare-export writes them; [] when the process
    never wrote one."""
    if not os.path.exists(spool):
        return []
    exp = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input", str(spool)],
                         capture_output=True, text=True, timeout=60)
    assert exp.returncode == 0, exp.stderr
    return [json.loads(line) for line in exp.stdout.splitlines()]
