"""`flare hang --job ID [--json]`: a job's hang incidents from flared's /api/v1/jobs/{job}/hangs,
shown compactly (suspects, stack groups, collective progress, watchdog reports, time taken),
and its failure paths. The end-to-end run against the real flared is in test_hang_flared.py."""
import json
import os
import subprocess
import sys

import pytest
from fake_api import RoutesApi, serving

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def flare(*args, timeout=60):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLARE_")}
    env["PYTHONPATH"] = os.path.join(ROOT, "python")
    return subprocess.run([sys.executable, "-m", "flare", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


class Api(RoutesApi):
    routes = {}


@pytest.fixture
def api():
    with serving(Api) as server:
        yield "127.0.0.1:%d" % server.server_address[1]


# As flared's incidentToJson writes it (src/engine/hang_monitor.cc).
INCIDENT = {
    "id": 1, "jobId": "job/a", "kind": "non-communication hang",
    "trigger": "watchdog of ranks 0: rank 0's ncclAllReduce on communicator c1 seq 13 not "
               "completed for 2.0 s (bound 2.0 s)",
    "triggeredBy": "watchdog", "onsetUnixNs": 1795000000000000000,
    "lastProgressUnixNs": 1795000000500000000, "openedUnixNs": 1795000002000000000,
    "diagnosedUnixNs": 1795000002250000000, "diagnosisSeconds": 0.25,
    "answered": [0, 1, 2, 3, 5, 6, 7], "noAnswer": [], "crashed": [4], "inspected": False,
    "needsInspection": False, "alertId": 7,
    "suspects": [{"rank": 4, "host": "node-2", "gpuUuid": "GPU-44", "gpuIndex": 0,
                  "reason": "crashed: stream closed (process gone)"}],
    "watchdog": [
        {"rank": r, "receivedUnixNs": 1795000002000000000, "episode": 1,
         "first": {"op": "ncclAllReduce", "kind": "collective", "communicator": "c1", "seq": 13,
                   "nranks": 8, "device": r, "ageS": 2.0 + r / 100, "thresholdS": 2.0},
         "stuck": []} for r in (0, 1, 2, 3, 5, 6, 7)],
    "stackGroups": [
        {"ranks": [0, 1, 2, 3, 5, 6, 7], "ranges": "0-3,5-7", "inCommunication": False,
         "frames": ["native cudaEventSynchronize", "native runStep", "native main",
                    "native __libc_start_main"]}],
    "progress": [{"communicator": "c1", "lastIssuedSeq": 13, "lastCompletedSeq": 12,
                  "lastIssuedOp": "ncclAllReduce", "ranks": [0, 1, 2, 3, 5, 6, 7],
                  "ranges": "0-3,5-7"}],
    "lagging": [{"communicator": "c1", "seq": 13, "op": "ncclAllReduce", "notIssued": [],
                 "waiting": [0, 1, 2, 3, 5, 6, 7]}],
    "evidence": ["ranks 4 did not answer"], "text": "unresponsive rank: ...",
    "link": {"sender": 2, "receiver": 3, "step": 40, "channelsAgreeing": 2},
}


def test_hang_shows_suspects_groups_progress_watchdog_and_time(api):
    Api.routes = {"/api/v1/jobs/job%2Fa/hangs": {"jobId": "job/a", "incidents": [INCIDENT]}}
    res = flare("hang", "--job", "job/a", "--daemon-http", api)
    assert res.returncode == 3, res.stderr  # an incident: like `flare diagnose`
    out = res.stdout
    assert "job job/a: 1 hang incident" in out
    assert "incident #1  non-communication hang  (triggered by watchdog)" in out
    assert "suspect: rank 4 on node-2 GPU 0 (GPU-44): crashed: stream closed" in out
    assert "time: onset to diagnosis 2.25 s (the diagnosis itself 0.25 s)" in out
    assert "ranks: answered 0-3,5-7; no answer -; crashed 4" in out
    assert "link: rank 2 -> rank 3 stalled at step 40 (2 channels agree)" in out
    # Stack groups compactly, cut to --frames.
    group = [line for line in out.splitlines() if line.startswith("    ranks 0-3,5-7: native")]
    assert group == ["    ranks 0-3,5-7: native cudaEventSynchronize <- native runStep <- "
                     "native main <- ... 1 more"], out
    assert "ranks 0-3,5-7 on c1: issued #13 ncclAllReduce, completed #12" in out
    # The seven watchdog reports fold into one line (oldest age shown).
    assert "ranks 0-3,5-7: ncclAllReduce on c1 seq 13 stuck up to 2.1 s (bound 2.0 s)" in out
    assert flare("hang", "--job", "job/a", "--daemon-http", api, "--frames", "1").stdout.count(
        " <- ") == 1
    js = flare("hang", "--job", "job/a", "--daemon-http", api, "--json")
    assert js.returncode == 3
    assert json.loads(js.stdout) == {"jobId": "job/a", "incidents": [INCIDENT]}


def test_hang_without_incidents(api):
    Api.routes = {"/api/v1/jobs/quiet/hangs": {"jobId": "quiet", "incidents": []}}
    res = flare("hang", "--job", "quiet", "--daemon-http", api)
    assert res.returncode == 0 and res.stdout.strip() == "no hang incident in job quiet"
    res = flare("hang", "--job", "quiet", "--daemon-http", api, "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["incidents"] == []


def test_hang_failure_paths_are_clear(api):
    Api.routes = {"/api/v1/jobs/j/hangs": "<html>proxy error</html>",
                  "/api/v1/jobs/k/hangs": {"incidents": "nope"}}
    res = flare("hang", "--job", "j", "--daemon-http", api)
    assert res.returncode == 3 and "not JSON" in res.stderr
    res = flare("hang", "--job", "k", "--daemon-http", api)
    assert res.returncode == 3 and "not an incident list" in res.stderr
    res = flare("hang", "--job", "missing", "--daemon-http", api)
    assert res.returncode == 3 and "answered 404" in res.stderr
    res = flare("hang", "--job", "j", "--daemon-http", "127.0.0.1:1")
    assert res.returncode == 3 and "cannot reach" in res.stderr
    res = flare("hang", "--job", "j", "--daemon-http", "nonsense")
    assert res.returncode == 2 and "is not HOST:PORT" in res.stderr
    res = flare("hang", "--daemon-http", api)
    assert res.returncode == 2 and "--job" in res.stderr
    for r in (res,):
        assert "Traceback" not in r.stderr
