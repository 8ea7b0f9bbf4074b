"""tests/gpu/acceptance.sh on the simulated stack (issue 19, part 1): the script a GPU session
runs from a kit must run end to end here too. Parts that need PyTorch and a GPU say so and why;
the end-to-end part runs the simulated Python workload through flared in summary and raw mode,
1 and 4 ranks, and must pass with no batch rejected; the results are a handful of files plus one
archive; a part that runs past its budget is cut off and the others still report. Flare runs
from the kit's wheel, installed into a venv inside the kit on first use (tests/gpu/kit-env.sh):
the daemon, hook and CLI the runs used must resolve there."""
import json
import os
import subprocess
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def kit(build_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("acceptance") / "kit"
    proc = subprocess.run(["bash", os.path.join(ROOT, "tools", "gpu-kit", "make-kit.sh"),
                           build_dir, str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return path


def acceptance(kit, out, **budgets):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLARE_")}
    env.update(OUT=str(out), FLARE_BUILD_DIR=str(kit), FLARE_ACCEPTANCE_SIM="1")
    env.update({"FLARE_ACCEPTANCE_BUDGET_" + k: str(v) for k, v in budgets.items()})
    # The kit carries tests/gpu: run the script from the kit, as on a GPU machine.
    return subprocess.run(["bash", str(kit / "tests" / "gpu" / "acceptance.sh")], env=env,
                          capture_output=True, text=True, timeout=240)


def test_simulated_acceptance_runs_end_to_end(kit, tmp_path):
    out = tmp_path / "out"
    proc = acceptance(kit, out)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert sorted(os.listdir(out)) == ["details.tar.gz", "nvidia-smi.txt", "summary.json",
                                       "summary.md"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "simulated" and summary["status"] == "passed"
    parts = {p["part"]: p for p in summary["parts"]}
    assert list(parts) == ["env", "a", "b", "c", "d", "e"]
    assert sum(p["budget_s"] for p in parts.values()) <= 8 * 60
    for name in ("a", "c", "d", "e"):
        assert parts[name]["status"] == "skipped"
        assert "needs PyTorch+GPU" in parts[name]["reason"], parts[name]
    e2e = parts["b"]
    assert e2e["status"] == "passed", e2e
    runs = e2e["result"]["runs"]
    assert [(r["mode"], r["ranks"]) for r in runs] == [("summary", 1), ("raw", 1),
                                                       ("summary", 4), ("raw", 4)]
    for run in runs:
        assert run["ok"] and run["rejected"] == {}, run
        assert all(c["ok"] for c in run["checks"].values()), run["checks"]
        assert run["gemm_tflops"] and run["gemm_tflops"][0]["tflops"] > 0
        assert len(run["loop_steps"]) == run["ranks"]
    # The 4-rank runs' injected host stall on rank 3 is found by a detector, routed.
    for run in runs[2:]:
        assert run["checks"]["the stalled rank is named"]["ok"], run["diagnoses"]
    md = (out / "summary.md").read_text()
    assert "| b | end to end through flared" in md and "skipped: needs PyTorch+GPU" in md
    with tarfile.open(out / "details.tar.gz") as tar:
        names = tar.getnames()
        assert "e2e.json" in names and "logs/b.log" in names and "gpu-tests.log" in names
        e2e = json.load(tar.extractfile("e2e.json"))
    # What ran is the installed wheel: flared the process exec'd, the hook the ranks preloaded
    # and the CLI that read the reports all resolve into the kit's venv.
    site = (kit / "installed" / "INSTALLED").read_text().splitlines()[1]
    assert site.startswith(str(kit / "venv") + "/"), site
    assert e2e["programs"] == {"flared": site + "/bin/flared",
                               "hook": site + "/lib/libflare_hook.so",
                               "flare": str(kit / "venv" / "bin" / "flare")}, e2e["programs"]
    env_txt = (out / "nvidia-smi.txt").read_text()
    assert "flare installed: flare-" in env_txt and site in env_txt, env_txt


def test_a_part_past_its_budget_is_cut_off_and_the_rest_report(kit, tmp_path):
    out = tmp_path / "out"
    proc = acceptance(kit, out, B=3)
    assert proc.returncode == 1, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    parts = {p["part"]: p for p in summary["parts"]}
    assert parts["b"]["status"] == "timeout" and "3 s budget" in parts["b"]["reason"]
    assert parts["b"]["seconds"] < 20
    assert parts["a"]["status"] == "skipped" and parts["env"]["status"] == "passed"
    assert summary["status"] == "failed"
    # timeout signalled the part's whole process group: no daemon or rank of it is left.
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(out) not in ps


def test_a_gpu_session_returns_a_handful_of_files(kit, tmp_path):
    """tests/gpu/gpu-session.sh, the one device call of a GPU session, in its simulated mode:
    what comes back fits the device tool (at most 8 files, two folders down) and holds the
    acceptance summary and the fixtures."""
    out = tmp_path / "session"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLARE_")}
    env.update(OUT=str(out), FLARE_BUILD_DIR=str(kit), FLARE_ACCEPTANCE_SIM="1",
               FLARE_CAPTURE_SIM="1", FLARE_ACCEPTANCE_PARTS="b",
               FLARE_ACCEPTANCE_E2E_RUNS="summary:1",
               FLARE_CAPTURE_ARGS="--steps 3 --only healthy-small")
    proc = subprocess.run(["bash", os.path.join(ROOT, "tests", "gpu", "gpu-session.sh")],
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert len(files) <= 8 and all(f.count("/") <= 2 for f in files), files
    assert "acceptance/summary.json" in files and "fixtures.tar.gz" in files, files
    summary = json.loads((out / "acceptance" / "summary.json").read_text())
    assert {p["part"]: p["status"] for p in summary["parts"]}["b"] == "passed"
    with tarfile.open(out / "fixtures.tar.gz") as t:
        names = t.getnames()
    assert "./metadata.json" in names and "./healthy-small/rank0.jsonl.gz" in names, names
    log = (out / "session.log").read_text()
    assert "acceptance: exit 0" in log and "capture: exit 0" in log, log
    if (kit / "bin" / "launch_cost").exists():  # built where nvcc is: run on the simulated stack
        cost = json.loads((out / "launch-cost.json").read_text())
        arms = {"bare", "summary", "raw", "summary-end", "summary-sampled", "summary-sampled-all"}
        assert cost["rounds"] == 5 and set(cost["arms"]) == arms
        assert sorted(cost["order"]) == sorted(list(arms) * 5)
        for arm, entry in cost["arms"].items():
            assert len(entry["runs"]) == 5 and all(entry["runs"]), (arm, log)
            assert all(r["pairs_polled"] > 0 for r in entry["runs"]), arm
        assert set(cost["hook_minus_bare"]) == arms - {"bare"}
        assert all("launch" in d and "launch_with_hook_calls" in d
                   for d in cost["hook_minus_bare"].values())
        assert "launch cost, ns per call, median of 5 interleaved rounds" in log
