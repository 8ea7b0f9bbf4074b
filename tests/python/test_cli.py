"""The `flare` CLI (python/flare): `flare run` and `flare status`."""
import json
import os
import re
import subprocess
import sys

import pytest
from fake_api import RoutesApi, serving

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def flare(*args, env=None, timeout=60):
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("FLARE_") and k != "LD_PRELOAD"}
    full["PYTHONPATH"] = os.path.join(ROOT, "python")
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "flare", *args], env=full, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def fake_hook(tmp_path):
    # `flare run` only needs the file to exist; a real preload would be loaded into the child.
    path = tmp_path / "libflare_hook.so"
    path.write_bytes(b"")
    return str(path)


DUMP = "import json, os; print(json.dumps({k: os.environ.get(k) for k in " \
       "['LD_PRELOAD', 'FLARE_DAEMON', 'FLARE_TOKEN', 'FLARE_JOB_ID']}))"


def dumped_env(fake_hook, *args, env=None):
    res = flare("run", "--hook", fake_hook, "--quiet", *args, "--", sys.executable, "-c", DUMP,
                env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_run_appends_the_hook_to_ld_preload_and_sets_the_daemon(fake_hook):
    # LD_PRELOAD is inherited by the child only if the preload exists; use a harmless real one.
    other = "/lib/x86_64-linux-gnu/libm.so.6"
    if not os.path.exists(other):
        pytest.skip("no libm at the Debian path")
    got = dumped_env(fake_hook, "--daemon", "daemon.example:7070", "--token", "t0k",
                     env={"LD_PRELOAD": other})
    assert got["LD_PRELOAD"] == other + " " + fake_hook  # appended, the existing one first
    assert got["FLARE_DAEMON"] == "daemon.example:7070"
    assert got["FLARE_TOKEN"] == "t0k"
    assert got["FLARE_JOB_ID"].startswith("flare-")
    # Twice through flare run: the hook is not added a second time.
    again = dumped_env(fake_hook, env={"LD_PRELOAD": other + " " + fake_hook})
    assert again["LD_PRELOAD"] == other + " " + fake_hook


def test_run_keeps_a_given_job_id_and_the_environment_daemon(fake_hook):
    got = dumped_env(fake_hook, env={"FLARE_JOB_ID": "mine", "FLARE_DAEMON": "10.0.0.1:1234"})
    assert got["FLARE_JOB_ID"] == "mine"
    assert got["FLARE_DAEMON"] == "10.0.0.1:1234"
    assert dumped_env(fake_hook, "--job-id", "other")["FLARE_JOB_ID"] == "other"
    # Fresh ids differ between runs.
    assert dumped_env(fake_hook)["FLARE_JOB_ID"] != dumped_env(fake_hook)["FLARE_JOB_ID"]


def test_run_returns_the_command_exit_code(fake_hook):
    assert flare("run", "--hook", fake_hook, "--quiet", "--", "sh", "-c", "exit 7").returncode == 7
    assert flare("run", "--hook", fake_hook, "--quiet", "--", "true").returncode == 0
    killed = flare("run", "--hook", fake_hook, "--quiet", "--", "sh", "-c", "kill -TERM $$")
    assert killed.returncode == 128 + 15


@pytest.mark.parametrize("args, message", [
    (["--daemon", "no-port", "--", "true"], "is not HOST:PORT"),
    (["--daemon", "host:99999", "--", "true"], "is not HOST:PORT"),
    ([], "no command given"),
    (["--", "/nonexistent/program"], "cannot start"),
])
def test_run_bad_input_gives_a_clear_error(fake_hook, args, message):
    res = flare("run", "--hook", fake_hook, *args)
    assert res.returncode != 0
    assert message in res.stderr
    assert "Traceback" not in res.stderr


def test_run_without_a_hook_library_says_where_it_looked(tmp_path):
    res = flare("run", "--", "true", env={"FLARE_HOOK_LIB": str(tmp_path / "missing.so")})
    assert res.returncode == 2
    assert "libflare_hook.so not found" in res.stderr and "FLARE_HOOK_LIB" in res.stderr


class FakeApi(RoutesApi):
    routes = {}


@pytest.fixture
def api():
    with serving(FakeApi) as server:
        yield server


# flared's answers: the protobuf JSON mapping (lowerCamelCase, 64-bit integers as strings,
# every field printed), docs/daemon-protocol.md "HTTP API".
JOBS = {"jobs": [{"jobId": "job/a", "worldSize": 2, "ranksConnected": 1,
                  "startTimeUnixNs": "1795000000000000000", "lastSeenUnixNs": "1795000001000000000",
                  "finished": False}]}
RANKS = {"jobId": "job/a", "ranks": [
    {"rank": 0, "host": "node-1", "pid": 11, "localRank": 0, "connected": True,
     "lastSeenUnixNs": "1795000001000000000", "batches": "40", "records": "1200",
     "lostBatches": "0", "drops": {"ringFull": "0", "spoolDropped": "0", "sendFailed": "0"},
     "mode": "MODE_RAW"},
    {"rank": 1, "host": "node-2", "pid": 12, "localRank": 0, "connected": False,
     "lastSeenUnixNs": "1794999990000000000", "batches": "38", "records": "1100",
     "lostBatches": "2", "drops": {"ringFull": "5", "spoolDropped": "3", "sendFailed": "0"},
     "mode": "MODE_RAW",
     "refusals": [{"reason": "bad_record", "items": "3", "lastUnixNs": "1794999990000000000",
                   "lastError": "step statistics: inter_ns 41000 ns outside its step of 1000 ns"},
                  {"reason": "rate_limited", "batches": "2",
                   "lastUnixNs": "1794999980000000000",
                   "lastError": "rank is over --rank-rate-limit records/s"}]}]}


def test_status_lists_jobs_and_ranks_with_last_seen_and_drops(api):
    FakeApi.routes = {"/api/v1/jobs": JOBS, "/api/v1/jobs/job%2Fa/ranks": RANKS}
    addr = "127.0.0.1:%d" % api.server_address[1]
    res = flare("status", "--daemon-http", addr, "--json")
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)["jobs"]
    assert [j["jobId"] for j in got] == ["job/a"]
    assert got[0]["worldSize"] == 2 and got[0]["ranksConnected"] == 1
    r1 = got[0]["ranks"][1]
    assert (r1["rank"], r1["host"], r1["connected"], r1["lostBatches"]) == (1, "node-2", False, 2)
    assert r1["lastSeenUnixNs"] == 1794999990000000000
    assert r1["drops"]["ringFull"] == 5 and r1["drops"]["spoolDropped"] == 3
    table = flare("status", "--daemon-http", addr)
    assert table.returncode == 0, table.stderr
    assert "job job/a  ranks 1/2 connected" in table.stdout
    line1 = [line for line in table.stdout.splitlines() if "node-2" in line][0]
    assert "gone" in line1 and "ringFull=5" in line1 and "spoolDropped=3" in line1
    line0 = [line for line in table.stdout.splitlines() if "node-1" in line][0]
    assert "connected" in line0 and line0.rstrip().endswith("none")
    # What the daemon refused of a rank: per reason in its row, and each with its last error.
    assert r1["refusals"][0] == {"reason": "bad_record", "batches": 0, "items": 3,
                                 "lastError": RANKS["ranks"][1]["refusals"][0]["lastError"],
                                 "lastUnixNs": 1794999990000000000}
    assert got[0]["ranks"][0]["refusals"] == []
    assert "bad_record=3" in line1 and "rate_limited=2 batches" in line1
    assert ("rank 1: the daemon refused 0 batch(es) and 3 item(s) as bad_record" in table.stdout
            and "inter_ns 41000 ns outside its step" in table.stdout)


def test_status_counts_summary_ranks_steps_and_says_what_step_sampling_left_untimed(api):
    """Summary-mode ranks' steps (StepStats the daemon applied) in a column, and a line saying
    how many of the job's rank-steps step sampling left untimed, so that fewer records are not
    taken for a loss; a raw-mode rank's steps are the daemon's to find ("-")."""
    summary = {"jobId": "job/a", "ranks": [
        dict(RANKS["ranks"][0], mode="MODE_SUMMARY", steps="120", stepsSampledOut="112"),
        dict(RANKS["ranks"][1], mode="MODE_SUMMARY", steps="119", stepsSampledOut="111")]}
    FakeApi.routes = {"/api/v1/jobs": JOBS, "/api/v1/jobs/job%2Fa/ranks": summary}
    addr = "127.0.0.1:%d" % api.server_address[1]
    got = json.loads(flare("status", "--daemon-http", addr, "--json").stdout)["jobs"][0]
    assert [(r["steps"], r["stepsSampledOut"]) for r in got["ranks"]] == [(120, 112), (119, 111)]
    table = flare("status", "--daemon-http", addr).stdout
    assert re.search(r"node-1 .* 1200 +120 +0 ", table), table
    assert ("step sampling: 223 of 239 rank-steps sampled out (FLARE_SAMPLE_STEPS or "
            "FLARE_TIMING_BUDGET_PCT: their kernels untimed, their times kept); GPU figures "
            "from the other 16") in table, table
    FakeApi.routes["/api/v1/jobs/job%2Fa/ranks"] = RANKS  # raw mode, nothing sampled out
    table = flare("status", "--daemon-http", addr).stdout
    assert re.search(r"node-1 .* 1200 +- +0 ", table) and "step sampling" not in table, table


def test_status_says_how_many_launches_no_name_lookup_named(api):
    """Kernels the hook could not name (kernel@unknown in the kernel report) are counted in
    `flare status`, with their share of GPU time; nothing is said when there are none; when the
    report cannot be read the ranks are still listed and the line says why it counted nothing."""
    sig = {"name": "kernel@unknown", "kind": "OP_KIND_KERNEL"}
    report = {"jobId": "job/a", "signatures": [
        {"signature": sig, "count": "300", "timeShare": 0.25},
        {"signature": dict(sig, shape=["2"]), "count": "20", "timeShare": 0.05},
        {"signature": {"name": "gemm", "kind": "OP_KIND_GEMM"}, "count": "900",
         "timeShare": 0.7}]}
    FakeApi.routes = {"/api/v1/jobs": JOBS, "/api/v1/jobs/job%2Fa/ranks": RANKS,
                      "/api/v1/jobs/job%2Fa/report": report}
    addr = "127.0.0.1:%d" % api.server_address[1]
    got = json.loads(flare("status", "--daemon-http", addr, "--json").stdout)["jobs"][0]
    assert got["unnamedKernels"]["launches"] == 320
    assert got["unnamedKernels"]["timeShare"] == pytest.approx(0.30)
    table = flare("status", "--daemon-http", addr).stdout
    assert "unnamed kernels: 320 launch(es), 30.0% of GPU time, recorded as kernel@unknown" \
        in table, table
    report["signatures"] = report["signatures"][2:]
    assert "unnamed kernels" not in flare("status", "--daemon-http", addr).stdout
    del FakeApi.routes["/api/v1/jobs/job%2Fa/report"]  # 404
    res = flare("status", "--daemon-http", addr, "--json")
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)["jobs"][0]
    assert got["unnamedKernels"] is None and len(got["ranks"]) == 2
    assert "404" in got["unnamedKernelsError"], got
    table = flare("status", "--daemon-http", addr)
    assert table.returncode == 0, table.stderr
    line = [x for x in table.stdout.splitlines() if "unnamed kernels" in x]
    assert len(line) == 1 and "not counted: the job's kernel report could not be read (" in line[0] \
        and "404" in line[0], table.stdout


def test_status_json_is_camel_case_throughout(api):
    """One casing, protobuf's JSON mapping: every key of `flare status --json` is lowerCamelCase
    (the drop counters' keys are flared's own, already camelCase)."""
    FakeApi.routes = {"/api/v1/jobs": JOBS, "/api/v1/jobs/job%2Fa/ranks": RANKS}
    res = flare("status", "--daemon-http", "127.0.0.1:%d" % api.server_address[1], "--json")
    assert res.returncode == 0, res.stderr

    def keys(x):
        if isinstance(x, dict):
            for k, v in x.items():
                yield k
                yield from keys(v)
        elif isinstance(x, list):
            for v in x:
                yield from keys(v)
    found = set(keys(json.loads(res.stdout)))
    assert "jobId" in found and "lastError" in found
    assert [k for k in found if "_" in k or k[:1].isupper()] == []


def test_status_with_no_jobs_says_what_it_looked_at(api):
    addr = "127.0.0.1:%d" % api.server_address[1]
    FakeApi.routes = {"/api/v1/jobs": {"jobs": []},
                      "/api/v1/jobs?include_finished=1": {"jobs": []}}
    res = flare("status", "--daemon-http", addr)
    assert res.returncode == 0
    assert "no jobs at the daemon at %s, running or finished" % addr in res.stdout
    # Only finished jobs: said, with the command that lists them.
    finished = {"jobs": [dict(JOBS["jobs"][0], finished=True),
                         dict(JOBS["jobs"][0], jobId="job/b", finished=True)]}
    FakeApi.routes = {"/api/v1/jobs": {"jobs": []}, "/api/v1/jobs?include_finished=1": finished}
    res = flare("status", "--daemon-http", addr)
    assert res.returncode == 0, res.stderr
    assert "no running jobs at the daemon at %s; 2 finished jobs" % addr in res.stdout
    assert "flare status --all" in res.stdout
    FakeApi.routes["/api/v1/jobs?include_finished=1"] = {"jobs": []}
    res = flare("status", "--daemon-http", addr, "--all")
    assert "running or finished" in res.stdout


def test_alerts_with_none_say_what_was_looked_at(api):
    addr = "127.0.0.1:%d" % api.server_address[1]
    FakeApi.routes = {"/api/v1/alerts?since=0": {"alerts": []},
                      "/api/v1/alerts?since=0&job=j1": {"alerts": []}}
    res = flare("alerts", "--daemon-http", addr)
    assert res.returncode == 0, res.stderr
    assert "no alerts for any job at the daemon at %s" % addr in res.stdout
    res = flare("alerts", "--daemon-http", addr, "--job", "j1")
    assert res.returncode == 0 and "no alerts for job j1" in res.stdout
    # --json stays a stream of alert objects: none is no line.
    res = flare("alerts", "--daemon-http", addr, "--json")
    assert res.returncode == 0 and res.stdout == ""


def test_status_errors_are_clear(api):
    FakeApi.routes = {"/api/v1/jobs": "<html>not the api</html>"}
    addr = "127.0.0.1:%d" % api.server_address[1]
    res = flare("status", "--daemon-http", addr)
    assert res.returncode == 3 and "not JSON" in res.stderr
    FakeApi.routes = {}
    res = flare("status", "--daemon-http", addr)
    assert res.returncode == 3 and "answered 404" in res.stderr
    res = flare("status", "--daemon-http", "127.0.0.1:1")
    assert res.returncode == 3 and "cannot reach" in res.stderr
    # ... and what to try next.
    assert "Is flared running" in res.stderr and "--daemon-http" in res.stderr
    res = flare("status", "--daemon-http", "nonsense")
    assert res.returncode == 2 and "is not HOST:PORT" in res.stderr
    for r in (res,):
        assert "Traceback" not in r.stderr


def test_flare_run_streams_a_sim_job_to_the_daemon(build_dir, tmp_path):
    from test_daemon_stream import Ingest, export
    exe = os.path.join(build_dir, "bin", "flare-fake-ingest")
    if not os.path.exists(exe):
        pytest.skip("flare-fake-ingest not built")
    daemon = Ingest(build_dir, tmp_path / "received").start()
    try:
        res = flare("run", "--daemon", daemon.address, "--job-id", "clijob", "--",
                    os.path.join(build_dir, "bin", "flare-sim-train"), "--ranks", "2",
                    "--steps", "2", "--quiet",
                    env={"FLARE_HOOK_LIB": os.path.join(build_dir, "lib", "libflare_hook.so"),
                         "FLARE_OUTPUT_DIR": str(tmp_path / "spool")}, timeout=120)
        assert res.returncode == 0, res.stderr
    finally:
        daemon.stop()
    records = export(build_dir, daemon.out)
    assert {r["job"] for r in records} == {"clijob"}
    assert {r["rank"] for r in records} == {0, 1}
    assert any(r["name"] == "cublasGemmEx" for r in records)


def test_offline_tools_run_through_the_cli(build_dir, tmp_path):
    """flare export / timeline / diagnose-spool pass every argument to the C++ tools."""
    flare = os.path.join(build_dir, "bin", "flare")
    spool = tmp_path / "spool"
    env = dict(os.environ, LD_PRELOAD=os.path.join(build_dir, "lib", "libflare_hook.so"),
               FLARE_OUTPUT_DIR=str(spool), FLARE_JOB_ID="cli")
    res = subprocess.run([os.path.join(build_dir, "bin", "flare-sim-train"), "--ranks", "2",
                          "--steps", "3", "--layers", "1", "--quiet"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    res = subprocess.run([flare, "export", "--input", str(spool)], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.count("\n") > 10
    res = subprocess.run([flare, "timeline", "--input", str(spool), "-o",
                          str(tmp_path / "t.json")], capture_output=True, text=True)
    assert res.returncode == 0 and (tmp_path / "t.json").exists()
    res = subprocess.run([flare, "diagnose-spool", "--input", str(spool)], capture_output=True,
                         text=True)
    assert res.returncode == 0 and "no anomaly" in res.stdout
    res = subprocess.run([flare, "export", "--bogus"], capture_output=True, text=True)
    assert res.returncode == 2 and "--job ID" in res.stderr and "--input DIR" in res.stderr
    res = subprocess.run([flare, "export", "--input", str(spool), "--bogus"], capture_output=True,
                         text=True)
    assert res.returncode == 2 and "usage" in res.stderr


@pytest.mark.parametrize("what,tool", [("timeline", "flare-timeline"), ("export", "flare-export")])
def test_tool_help_covers_the_online_and_the_offline_mode(what, tool):
    res = flare(what, "--help")
    assert res.returncode == 0, res.stderr
    for text in ("--job ID", "--daemon-http HOST:PORT", "--input DIR", "Online", "Offline",
                 "usage: " + tool):
        assert text in res.stdout, text
    top = " ".join(flare("--help").stdout.split())
    assert "online from flared (--job ID" in top and "offline from a spool (--input DIR" in top
    # diagnose (online) and diagnose-spool (offline) point at each other.
    assert "offline: diagnose-spool" in top and "a job in flared: diagnose --job" in top


def test_timeline_of_a_daemon_job_without_an_output_names_what_is_missing():
    """`flare timeline --job J` needs -o or --per-rank, not --input (that is the offline mode);
    said before anything is fetched (no daemon is running here)."""
    res = flare("timeline", "--job", "J", "--daemon-http", "127.0.0.1:1")
    assert res.returncode == 2
    assert "-o FILE" in res.stderr and "--per-rank DIR" in res.stderr
    assert "--input" not in res.stderr and "cannot reach" not in res.stderr
