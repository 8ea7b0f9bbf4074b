"""A client of flared's query API (HTTP/JSON), returning typed objects.

    import flare
    c = flare.Client("127.0.0.1:9464")          # flared's --http address
    for job in c.jobs():
        print(job.job_id, job.ranks_connected)
    report = c.report("my-job")
    rows = report.rows()                          # list of flat dicts: pandas.DataFrame(rows)
    for d in c.diagnoses("my-job"):
        print(d.team, d.summary)

Every object keeps the daemon's JSON under `.raw`, so fields the daemon adds later are not
lost. Endpoints without a typed method are reached with `get`, `post`, `delete` (JSON) and
`get_bytes` (e.g. the protobuf records stream). Errors: `DaemonUnreachable` (connection refused,
timeout; `NotHttp` when something answers that does not speak HTTP/1.1, such as flared's gRPC
port), `UnknownJob` (404 for a job), `ApiError` (any other non-2xx answer, with `.status` and
the daemon's own `.detail`, or a body that is not JSON, `.status` 0); all derive from
`FlareError`. The `flare` CLI makes every daemon call through this class. Only the standard
library is used. A `Client` holds no connection and is safe to share.
"""

import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

DEFAULT_HTTP = "127.0.0.1:9464"


class FlareError(Exception):
    """Base of the client's errors."""


class DaemonUnreachable(FlareError):
    """The daemon's HTTP API did not answer; `.reason` says why (refused, timed out, ...)."""

    def __init__(self, message, reason=None):
        super().__init__(message)
        self.reason = message if reason is None else reason


class NotHttp(DaemonUnreachable):
    """Something answered at the address but not in HTTP/1.1 (e.g. flared's gRPC port);
    `.reason` is the kind of protocol error."""


class UnknownJob(FlareError):
    """The daemon does not know the job."""


class ApiError(FlareError):
    """The daemon answered with an error status (`.status`, and `.detail`: the daemon's own
    "error" text, or ""), or with something that is not JSON (`.status` 0)."""

    def __init__(self, message, status=0, detail=""):
        super().__init__(message)
        self.status = status
        self.detail = detail


def _int(v):
    """protobuf's JSON writes 64-bit integers as strings; absent fields are 0."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0


def _float(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return 0.0


@dataclass
class Job:
    job_id: str
    world_size: int
    ranks_connected: int
    start_time_unix_ns: int
    last_seen_unix_ns: int
    finished: bool
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, j):
        return cls(j.get("jobId", ""), _int(j.get("worldSize")), _int(j.get("ranksConnected")),
                   _int(j.get("startTimeUnixNs")), _int(j.get("lastSeenUnixNs")),
                   bool(j.get("finished", False)), j)


@dataclass
class Rank:
    rank: int
    host: str
    pid: int
    connected: bool
    last_seen_unix_ns: int
    batches: int
    records: int
    lost_batches: int
    drops: Dict[str, int]
    device_name: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)
    # What the daemon refused of this rank, by reason: {reason: {"batches", "items",
    # "last_error", "last_unix_ns"}}.
    refusals: Dict[str, Dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, j):
        return cls(_int(j.get("rank")), j.get("host", ""), _int(j.get("pid")),
                   bool(j.get("connected", False)), _int(j.get("lastSeenUnixNs")),
                   _int(j.get("batches")), _int(j.get("records")), _int(j.get("lostBatches")),
                   {k: _int(v) for k, v in (j.get("drops") or {}).items()},
                   j.get("deviceName", ""), j,
                   {x.get("reason", ""): {"batches": _int(x.get("batches")),
                                          "items": _int(x.get("items")),
                                          "last_error": x.get("lastError", ""),
                                          "last_unix_ns": _int(x.get("lastUnixNs"))}
                    for x in (j.get("refusals") or []) if isinstance(x, dict)})


@dataclass
class KernelRow:
    """One signature's line of a job's kernel report. `shape` joins Signature.shape with "x"
    (GEMM b x m x n x k, collective count, ...); `kind`/`dtype` are lower-case enum labels."""
    name: str
    kind: str
    shape: str
    dtype: str
    count: int
    total_ns: int
    time_share: float
    tflops: float
    busbw_gbps: float  # per rank: bytes over each rank's own kernel time, waits included
    p50_ns: int
    p99_ns: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)
    # The job-level busbw of this signature (the job metrics' definition: from the last rank's
    # start to the last end), median over its complete instances; 0: not measured.
    job_busbw_gbps: float = 0.0

    @classmethod
    def from_json(cls, j):
        sig = j.get("signature") or {}
        shape = "x".join(str(_int(v)) for v in sig.get("shape", []))
        dtype = str(sig.get("dtype", "")).replace("DTYPE_", "").lower()
        kind = str(sig.get("kind", "")).replace("OP_KIND_", "").lower()
        return cls(sig.get("name", ""), kind, shape, dtype,
                   _int(j.get("count")), _int(j.get("totalNs")), _float(j.get("timeShare")),
                   _float(j.get("tflops")), _float(j.get("busbwGbps")), _int(j.get("p50Ns")),
                   _int(j.get("p99Ns")), j, _float(j.get("jobBusbwGbps")))

    def row(self):
        return {k: getattr(self, k) for k in ("name", "kind", "shape", "dtype", "count",
                                              "total_ns", "time_share", "tflops", "busbw_gbps",
                                              "job_busbw_gbps", "p50_ns", "p99_ns")}


@dataclass
class Report:
    job_id: str
    kernels: List[KernelRow]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    def rows(self):
        """The kernel table as flat dicts (one per signature), e.g. for pandas.DataFrame."""
        return [k.row() for k in self.kernels]


@dataclass
class Evidence:
    metric: str
    text: str
    value: float
    reference: float


@dataclass
class Diagnosis:
    kind: str
    team: str
    cause: str
    severity: float
    ranks: List[int]
    summary: str
    evidence: List[Evidence]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, j):
        return cls(j.get("kind", ""), j.get("team", ""), j.get("cause", ""),
                   _float(j.get("severity")), [_int(r) for r in j.get("ranks", [])],
                   j.get("summary", ""),
                   [Evidence(e.get("metric", ""), e.get("text", ""), _float(e.get("value")),
                             _float(e.get("reference"))) for e in j.get("evidence", [])], j)


@dataclass
class Alert:
    id: int
    job_id: str
    rank: int  # -1: the whole job
    kind: str
    severity: str
    team: str
    message: str
    time_unix_ns: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, j):
        return cls(_int(j.get("id")), j.get("jobId", ""), _int(j.get("rank", -1)),
                   j.get("kind", ""), j.get("severity", ""), j.get("team", ""),
                   j.get("message", ""), _int(j.get("timeUnixNs")), j)


@dataclass
class HangIncident:
    id: int
    kind: str
    trigger: str
    suspects: List[int]
    onset_unix_ns: int
    diagnosed_unix_ns: int
    text: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, j):
        return cls(_int(j.get("id")), j.get("kind", ""), j.get("trigger", ""),
                   [_int(s.get("rank")) for s in j.get("suspects", [])],
                   _int(j.get("onsetUnixNs")), _int(j.get("diagnosedUnixNs")), j.get("text", ""),
                   j)


class Client:
    """flared's HTTP query API at `address`: "HOST:PORT" (default 127.0.0.1:9464), or
    "https://HOST:PORT" when flared serves HTTPS (its certificate is verified against `ca_file`,
    default FLARE_TLS_CA, else the system's roots). `token` is sent as X-Flare-Token."""

    def __init__(self, address=DEFAULT_HTTP, timeout=10.0, token=None, ca_file=None):
        if not isinstance(address, str) or ":" not in address:
            raise ValueError("address must be HOST:PORT, not %r" % (address,))
        self.address = address
        self.timeout = timeout
        self.token = token
        self.ca_file = ca_file

    def url(self, path):
        """The URL of `path` (which starts with "/") at this daemon."""
        if self.address.startswith(("http://", "https://")):
            return self.address.rstrip("/") + path
        return "http://%s%s" % (self.address, path)

    def _tls(self, url):
        if not url.startswith("https://"):
            return None
        import ssl
        return ssl.create_default_context(
            cafile=self.ca_file or os.environ.get("FLARE_TLS_CA") or None)

    def request(self, method, path, body=None, job=None, raw=False):
        """One call: `body` (any JSON value, or None) sent as JSON; the answer's bytes when `raw`,
        else its parsed JSON (any JSON value). A 404 is UnknownJob when `job` is given."""
        url = self.url(path)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if self.token:
            headers["X-Flare-Token"] = self.token
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout,
                                        context=self._tls(url)) as resp:
                answer = resp.read()
        except urllib.error.HTTPError as e:
            detail = ""
            try:
                detail = json.loads(e.read()).get("error", "")
            except (ValueError, AttributeError, OSError):
                pass
            if e.code == 404 and job is not None:
                raise UnknownJob("flared at %s does not know job %r" % (self.address, job))
            raise ApiError("flared at %s answered %d for %s%s" %
                           (self.address, e.code, path, ": " + detail if detail else ""),
                           e.code, detail)
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise DaemonUnreachable("cannot reach flared's HTTP API at %s: %s" %
                                    (self.address, reason), reason)
        except http.client.HTTPException as e:
            raise NotHttp("%s does not answer HTTP (%s)" % (self.address, type(e).__name__),
                          type(e).__name__)
        if raw:
            return answer
        try:
            return json.loads(answer)
        except ValueError:
            raise ApiError("flared at %s sent something that is not JSON for %s" %
                           (self.address, path))

    def get(self, path):
        """GET `path`: the daemon's JSON answer."""
        return self.request("GET", path)

    def get_bytes(self, path):
        """GET `path`: the answer's bytes (e.g. /api/v1/jobs/{job}/records, protobuf)."""
        return self.request("GET", path, raw=True)

    def post(self, path, body):
        return self.request("POST", path, body)

    def delete(self, path):
        return self.request("DELETE", path)

    def _request(self, method, path, body=None, job=None):
        out = self.request(method, path, body, job)
        if not isinstance(out, dict):
            raise ApiError("flared at %s sent a JSON %s for %s, not an object" %
                           (self.address, type(out).__name__, path))
        return out

    @staticmethod
    def _job_path(job, tail):
        if not isinstance(job, str) or not job:
            raise ValueError("job must be a non-empty string")
        return "/api/v1/jobs/%s/%s" % (urllib.parse.quote(job, safe=""), tail)

    def healthy(self):
        """True when the daemon answers /healthz."""
        url = self.url("/healthz")
        try:
            with urllib.request.urlopen(url, timeout=self.timeout, context=self._tls(url)) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError, http.client.HTTPException):
            return False

    def jobs(self, include_finished=False):
        got = self._request("GET", "/api/v1/jobs" + ("?include_finished=1"
                                                     if include_finished else ""))
        return [Job.from_json(j) for j in got.get("jobs", [])]

    def ranks(self, job):
        got = self._request("GET", self._job_path(job, "ranks"), job=job)
        return [Rank.from_json(r) for r in got.get("ranks", [])]

    def report(self, job):
        """The job's kernel report (signature, shape, count, share of GPU time, TFLOPS/busbw)."""
        got = self._request("GET", self._job_path(job, "report"), job=job)
        return Report(got.get("jobId", job),
                      [KernelRow.from_json(s) for s in got.get("signatures", [])], got)

    def diagnoses(self, job):
        """The detectors run now on the job's current window."""
        got = self._request("GET", self._job_path(job, "diagnoses"), job=job)
        return [Diagnosis.from_json(d) for d in got.get("diagnoses", [])]

    def alerts(self, job=None, since_unix_ns=None, limit=None):
        """Alerts the daemon raised (all jobs when `job` is None), oldest first."""
        q = {}
        if job:
            q["job"] = job
        if since_unix_ns is not None:
            q["since"] = str(int(since_unix_ns))
        if limit is not None:
            q["limit"] = str(int(limit))
        path = "/api/v1/alerts" + ("?" + urllib.parse.urlencode(q) if q else "")
        return [Alert.from_json(a) for a in self._request("GET", path).get("alerts", [])]

    def hangs(self, job):
        """The job's hang incidents."""
        got = self._request("GET", self._job_path(job, "hangs"), job=job)
        return [HangIncident.from_json(i) for i in got.get("incidents", [])]

    def send_command(self, job, command, ranks=None):
        """Sends `command` (a dict in flare.v1.Command's JSON, e.g. {"dumpStacks": {}}) to the
        job's ranks (all when `ranks` is None); returns the daemon's answer (commandId, ...)."""
        body = {"command": command}
        if ranks:
            body["ranks"] = [int(r) for r in ranks]
        return self._request("POST", self._job_path(job, "commands"), body, job=job)

    def command_results(self, job, command_id):
        got = self._request("GET", self._job_path(job, "commands/%d" % int(command_id)), job=job)
        return got.get("results", [])


def rows(items):
    """Flat dicts of a list of client objects (their typed fields, without `raw`), for
    pandas.DataFrame(rows(c.alerts()))."""
    out = []
    for it in items:
        d = {k: v for k, v in it.__dict__.items() if k != "raw"}
        for k, v in list(d.items()):
            if isinstance(v, list) and v and not isinstance(v[0], (int, float, str)):
                d[k] = [x.__dict__ for x in v]
        out.append(d)
    return out
