"""The pipeline's health, asserted by every end-to-end test that runs flared.

The first real-GPU run lost a whole job's data to refusals no test had looked at. Every test
that streams into flared therefore ends by checking that flared refused nothing — no whole
message (`flare_ingest_rejected_total`) and no item of a batch (`flare_ingest_items_dropped_total`)
— unless the test injects bad input on purpose and names the reasons it expects (`allow`).
"""
import json
import re
import time
import urllib.request

_SERIES = re.compile(
    r'^(flare_ingest_rejected_total|flare_ingest_items_dropped_total)\{reason="([a-z_]+)"\} '
    r'([0-9.e+]+)$', re.M)


def refusals(metrics_text):
    """{(metric, reason): count} of the non-zero refusal counters in a /metrics text."""
    out = {}
    for m in _SERIES.finditer(metrics_text):
        value = float(m.group(3))
        if value:
            out[(m.group(1), m.group(2))] = int(value)
    return out


def assert_nothing_refused(http, allow=(), token=None):
    """Fails, naming each counter, when flared at `http` (a port, "host:port" or a URL) refused
    anything other than the reasons in `allow` (duplicate_batch is a replay's duplicate, not a
    refusal of data, and always allowed). `token`: sent as a bearer token where the daemon's
    HTTP needs one."""
    if isinstance(http, int):
        http = "127.0.0.1:%d" % http
    if not http.startswith("http"):
        http = "http://" + http
    req = urllib.request.Request(http + "/metrics")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    with urllib.request.urlopen(req, timeout=20) as r:
        text = r.read().decode()
    assert "flare_ingest_rejected_total" in text, "no refusal counters in /metrics"
    allowed = set(allow) | {"duplicate_batch"}
    bad = {k: v for k, v in refusals(text).items() if k[1] not in allowed}
    assert not bad, "flared refused data: %s" % ", ".join(
        "%s{reason=%s} %d" % (k[0], k[1], v) for k, v in sorted(bad.items()))


def steps_held(daemon, job):
    """{rank: steps} flared holds for `job` (`daemon`: a test daemon with .get(path)): the
    intervals between consecutive step starts, warm-up included; {} before the job is there."""
    try:
        series = json.loads(daemon.get(
            "/api/v1/jobs/%s/series?max_signatures=1&max_steps=2048" % job))
    except Exception:  # noqa: BLE001 - not there yet
        return {}
    return {r: sum(1 for v in row if v is not None)
            for r, row in zip(series["ranks"], series["stepTimeNs"])}


def wait_for_job(daemon, job, ranks, delivered, timeout):
    """Waits until `ranks` ranks of `job` registered and none is connected any more, and
    `delivered(steps_held(...))` holds, or `timeout` seconds; returns the ranks' rows of
    /api/v1/jobs/JOB/ranks (the caller's assertions say what is missing after a timeout)."""
    deadline = time.time() + timeout
    while True:
        info = json.loads(daemon.get("/api/v1/jobs/%s/ranks" % job)).get("ranks", [])
        if (len(info) == ranks and not any(r.get("connected") for r in info) and
                delivered(steps_held(daemon, job))) or time.time() > deadline:
            return info
        time.sleep(0.3)
