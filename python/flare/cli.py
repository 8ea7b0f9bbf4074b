"""The `flare` command line.

    flare run [--daemon HOST:PORT] [--token T] [--job-id ID] [--hook PATH] -- CMD ...
    flare status [--daemon-http HOST:PORT] [--json] [--all]
    flare report --job ID [--daemon-http HOST:PORT] [--json] [--html FILE] [--baseline JOB]
    flare deep-trace --job ID --steps N [--ranks LIST] [--json]
    flare hang --job ID [--daemon-http HOST:PORT] [--json]
    flare upload --spool DIR [--daemon HOST:PORT] [--token T]

`run` traces CMD: it appends libflare_hook.so to LD_PRELOAD (never replacing what is there),
sets FLARE_DAEMON, FLARE_TOKEN and FLARE_JOB_ID (a fresh job id unless one is given or already
set), runs CMD and returns its exit code (128 + N when a signal N ended it).

`status` lists the daemon's jobs and their ranks with last-seen times, batches, records, steps
(summary mode; with how many step sampling left untimed) and drop counters, from flared's HTTP
JSON API (`/api/v1/jobs`, `/api/v1/jobs/{job}/ranks`).

`report` prints a job's kernel report, diagnoses and metrics (`/api/v1/jobs/{job}/report`,
`/diagnoses`, `/series`, ...); `--html` writes a self-contained page (flare/html_report.py).

`hang` shows a job's hang incidents (`/api/v1/jobs/{job}/hangs`): suspected ranks, hosts and
GPUs, the stack groups, the last collective each rank issued and completed, the watchdog
reports, and the time the diagnosis took; it exits 3 when the job has an incident.

`upload` sends the pending batches that ended rank processes left in a spool (the daemon was
unreachable when they ended) to flared, each exactly once, and deletes them once flared holds
them (build/bin/flare-upload; the next Flare process streaming to flared does the same in the
background). Exit 1 when something was kept for a later try.

Every --json output uses one casing, protobuf's JSON mapping (lowerCamelCase: `jobId`,
`lastSeenUnixNs`), as flared's API does; counts and nanoseconds are JSON numbers.

Exit codes: CMD's for `run`; 0 for a successful `status` or `report`; 4 when `report` names a
job the daemon does not know; 3 when `hang` finds an incident; 2 for bad arguments (a missing
command, a daemon address that is not host:port, no libflare_hook.so found); 3 when the daemon
cannot be reached or answers something that is not its API.
"""
import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid

from .client import DEFAULT_HTTP, ApiError, Client, DaemonUnreachable, NotHttp
from .ranks import RankListError, parse_rank_list
from .safe_text import SafeStream, escape_controls

DEFAULT_DAEMON = "127.0.0.1:7070"
HOOK_NAME = "libflare_hook.so"


class CliError(Exception):
    def __init__(self, message, code=2, status=None):
        super().__init__(message)
        self.code = code
        self.status = status  # the HTTP status, when the daemon answered with an error


def parse_address(value, what):
    """host:port (host may be a name, IPv4 or [IPv6]; an HTTP address may start with https://
    or http://); raises CliError otherwise."""
    for scheme in ("https://", "http://"):
        if value.startswith(scheme):
            value = value[len(scheme):]
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CliError("%s %r is not HOST:PORT (e.g. %s)" % (what, value, DEFAULT_DAEMON))
    return host, int(port)


def find_hook(explicit=None):
    """libflare_hook.so: --hook, FLARE_HOOK_LIB, next to this package, or the build tree."""
    wanted = explicit or os.environ.get("FLARE_HOOK_LIB")
    if wanted:  # an explicit choice is used or refused, never replaced by another library
        if not os.path.isfile(wanted):
            raise CliError("%s not found at %s (from %s): fix the path, or unset it to use "
                           "the library of this installation" % (
                               HOOK_NAME, wanted, "--hook" if explicit else "FLARE_HOOK_LIB"))
        return os.path.abspath(wanted)
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "lib", HOOK_NAME),                     # installed package
                  os.path.join(here, "..", "..", "build", "lib", HOOK_NAME)]  # repo checkout
    for path in candidates:
        if os.path.isfile(path):
            return os.path.abspath(path)
    raise CliError("%s not found: this flare package has no hook library. Install the wheel "
                   "that carries it (`make wheel`, then pip install build/wheel/dist/flare-*.whl;"
                   " docs/install.md), or pass --hook PATH / set FLARE_HOOK_LIB to a build's "
                   "lib/%s" % (HOOK_NAME, HOOK_NAME))


def find_tool(name):
    """A Flare program (flare-export, flare-timeline, flare-diagnose): next to the hook library's
    bin/ folder (build tree or installed package), then PATH."""
    candidates = []
    try:
        lib = find_hook()
        candidates.append(os.path.join(os.path.dirname(os.path.dirname(lib)), "bin", name))
    except CliError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    candidates += [os.path.join(here, "bin", name),
                   os.path.join(here, "..", "..", "build", "bin", name)]
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.abspath(path)
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(folder, name)
        if folder and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise CliError("%s not found: install the wheel that carries it (`make wheel`, then pip "
                   "install build/wheel/dist/flare-*.whl; docs/install.md), build Flare (`make "
                   "build`), or put it on PATH" % name)


TOOLS = {"export": "flare-export", "timeline": "flare-timeline",
         "diagnose-spool": "flare-diagnose"}


def output_file(rest):
    """The -o FILE a tool writes to, or None when it writes to stdout."""
    for i, a in enumerate(rest):
        if a == "-o" and i + 1 < len(rest):
            return rest[i + 1]
    return None


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0


def run_with_progress(command, out_path, stream=None, interval=0.2):
    """Runs a tool and draws one carriage-return progress line on `stream` (stderr): bytes
    written and, for output on stdout (JSON lines), records; cleared when the tool exits.
    Output on stdout is copied through unchanged; output to a file is measured by polling its
    size."""
    stream = stream or sys.stderr
    last = [0.0]

    def draw(nbytes, records, final=False):
        now = time.monotonic()
        if not final and now - last[0] < interval:
            return
        last[0] = now
        text = "flare: %s" % human_bytes(nbytes)
        if records is not None:
            text += ", %d records" % records
        print("\r%-40s" % text, end="", file=stream, flush=True)

    if out_path is None:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE)
        out = sys.stdout.buffer
        nbytes = records = 0
        while True:
            chunk = proc.stdout.read1(1 << 16)
            if not chunk:
                break
            out.write(chunk)
            nbytes += len(chunk)
            records += chunk.count(b"\n")
            draw(nbytes, records)
        out.flush()
        code = proc.wait()
        draw(nbytes, records, final=True)
    else:
        proc = subprocess.Popen(command)
        while True:
            try:
                code = proc.wait(timeout=interval)
                break
            except subprocess.TimeoutExpired:
                pass
            try:
                draw(os.path.getsize(out_path), None)
            except OSError:
                pass
        try:
            draw(os.path.getsize(out_path), None, final=True)
        except OSError:
            pass
    print("\r%40s\r" % "", end="", file=stream, flush=True)
    return code


def run_tool(what, rest):
    """export / timeline / diagnose-spool on an offline spool: the C++ programs, their arguments
    passed through (but --quiet, which is ours), their exit code returned. export and timeline
    draw a progress line on stderr when it is a terminal, unless --quiet. `flare timeline|export
    --job ID` without --input first fetches the job's records from flared into a temporary spool
    (fetch_job_records)."""
    rest = list(rest)
    if what in ("timeline", "export"):
        if any(a in ("-h", "--help") for a in rest):
            return print_tool_help(what)
        if "--input" not in rest and not any(a.startswith("--input=") for a in rest):
            if "--job" not in rest:
                raise CliError("flare %s needs --job ID (a job flared holds) or --input DIR (an "
                               "offline spool, FLARE_OUTPUT_DIR); `flare %s --help` shows both "
                               "modes" % (what, what))
            return run_tool_on_daemon(what, rest)
    return run_offline_tool(what, rest)


# `flare timeline|export --help`: both modes, then the offline tool's own options.
TOOL_HELP = {
    "timeline": """usage: flare timeline --job ID [--daemon-http HOST:PORT] [--ranks LIST] [--steps A-B]
                      (-o FILE | --per-rank DIR) [--timeout S] [--quiet]
       flare timeline --input DIR [--job ID] [--ranks LIST] [--steps A-B] [--no-align]
                      (-o FILE | --per-rank DIR) [--quiet]

A Perfetto/Kineto-shaped trace of a job's records: -o FILE is one trace with every rank (open it
in ui.perfetto.dev), --per-rank DIR one Kineto file per rank (HolisticTraceAnalysis).

Online, a job flared holds (--job without --input): its records are fetched from flared's HTTP
API into a temporary spool, then converted. Ranks that streamed in summary mode have their
collectives and syncs only; run the job with FLARE_MODE=raw, or take a deep trace, for every
kernel.
  --job ID                the job (`flare status --all` lists them)
  --daemon-http HOST:PORT flared's HTTP address (default: FLARE_DAEMON_HTTP or %(http)s)
  --timeout S             seconds per request (default 60); FLARE_TOKEN is sent as the token

Offline, a spool (FLARE_OUTPUT_DIR, written when no daemon is set or reachable):
  --input DIR             the spool root or one job's folder (--job picks one of several)

Both: --ranks, --steps, --no-align and the outputs are flare-timeline's (below); a progress
line goes to stderr when it is a terminal (--quiet: none).
""",
    "export": """usage: flare export --job ID [--daemon-http HOST:PORT] [--ranks LIST] [--timeout S] [--quiet]
       flare export --input DIR [--format jsonl] [--quiet]

A job's records as JSON lines on stdout, one object per kernel, GEMM, collective, memcpy, span
or step.

Online, a job flared holds (--job without --input): its records are fetched from flared's HTTP
API into a temporary spool, then exported. Ranks that streamed in summary mode have their
collectives and syncs only (FLARE_MODE=raw for every kernel).
  --job ID                the job (`flare status --all` lists them)
  --daemon-http HOST:PORT flared's HTTP address (default: FLARE_DAEMON_HTTP or %(http)s)
  --ranks LIST            ranks to fetch, e.g. 0-7,64 (default: all)
  --timeout S             seconds per request (default 60); FLARE_TOKEN is sent as the token

Offline, a spool (FLARE_OUTPUT_DIR, written when no daemon is set or reachable):
  --input DIR             one job's folder of the spool (DIR/<job>)

Both: a progress line goes to stderr when it is a terminal (--quiet: none).
""",
}


def print_tool_help(what):
    print(TOOL_HELP[what] % {"http": DEFAULT_HTTP})
    try:
        tool = find_tool(TOOLS[what])
    except CliError as e:
        print("(%s)" % e)
        return 0
    print("%s's own options (offline mode; online mode passes them on):" % TOOLS[what])
    sys.stdout.flush()
    subprocess.call([tool, "--help"], stdout=sys.stdout, stderr=subprocess.STDOUT)
    return 0


def run_offline_tool(what, rest):
    quiet = "--quiet" in rest and what in ("export", "timeline")
    if quiet:
        rest = [a for a in rest if a != "--quiet"]
    command = [find_tool(TOOLS[what])] + rest
    wants_help = any(a in ("-h", "--help") for a in rest)
    if what in ("export", "timeline") and not quiet and not wants_help and sys.stderr.isatty():
        return run_with_progress(command, output_file(rest))
    return subprocess.call(command)


class Progress:
    """A one-line progress indicator on stderr, only when stderr is a terminal (and not
    --quiet): `what  i/n  bytes`, rewritten in place, cleared at the end."""

    def __init__(self, what, total, quiet=False, stream=None):
        self.stream = stream or sys.stderr
        self.on = not quiet and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.what, self.total, self.done, self.bytes = what, total, 0, 0

    def step(self, nbytes):
        self.done += 1
        self.bytes += nbytes
        if self.on:
            width = 24
            fill = int(width * self.done / max(self.total, 1))
            self.stream.write("\r%s [%s%s] %d/%d ranks, %.1f MiB" % (
                self.what, "#" * fill, "." * (width - fill), self.done, self.total,
                self.bytes / (1 << 20)))
            self.stream.flush()

    def close(self):
        if self.on:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _take(args, flag, has_value=True):
    """Removes `flag` (and its value) from args; returns the value (True for a bare flag)."""
    for i, a in enumerate(args):
        if a == flag:
            if not has_value:
                del args[i]
                return True
            if i + 1 >= len(args):
                raise CliError("%s needs a value" % flag, code=2)
            value = args[i + 1]
            del args[i:i + 2]
            return value
        if has_value and a.startswith(flag + "="):
            del args[i]
            return a.split("=", 1)[1]
    return None


def fetch_job_records(base, job, ranks, folder, timeout=60.0, quiet=False):
    """The job's records from flared (GET /api/v1/jobs/{job}/records, one request per rank so
    that progress can be shown) written as an offline spool: FOLDER/<job>/<rank>/records-0.pb.
    Returns the number of ranks written."""
    quoted = urllib.parse.quote(job, safe="")
    api = daemon(base, timeout)
    listed = api.get("/api/v1/jobs/%s/ranks" % quoted)
    known = sorted(as_int(r.get("rank", 0)) for r in listed.get("ranks", []))
    wanted = [r for r in known if ranks is None or r in ranks]
    if not wanted:
        raise CliError("job %s has no %s at the daemon" % (
            job, "ranks" if ranks is None else "ranks in --ranks"), code=1)
    summarised = [as_int(r.get("rank", 0)) for r in listed.get("ranks", [])
                  if r.get("mode") == "MODE_SUMMARY" and as_int(r.get("rank", 0)) in wanted]
    if summarised and not quiet:
        # Summary mode (the default when streaming) sends compute kernels as summaries: their
        # ranks' GPU tracks hold the collectives and syncs only.
        print("flare: ranks %s streamed in summary mode: compute kernels are summaries, not in the "
              "timeline; run the job with FLARE_MODE=raw, or take a deep trace (flare deep-trace), "
              "for every kernel" % compact_ranges(summarised), file=sys.stderr)
    progress = Progress("fetching %s" % job, len(wanted), quiet)
    written = 0
    try:
        for rank in wanted:
            data = api.get_bytes("/api/v1/jobs/%s/records?ranks=%d" % (quoted, rank))
            progress.step(len(data))
            if not data:
                continue
            out = os.path.join(folder, job, str(rank))
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, "records-0.pb"), "wb") as f:
                f.write(data)
            written += 1
    finally:
        progress.close()
    return written


def parse_ranks(value, what="--ranks"):
    """A rank list (flare.ranks: "0,2,4-7", or * for every rank) -> None (every rank) or the
    sorted ranks; CliError (exit status 2) naming `what` on a malformed list."""
    try:
        return parse_rank_list(value, what)
    except RankListError as e:
        raise CliError(str(e), code=2)


def run_tool_on_daemon(what, rest):
    """`flare timeline --job ID [--ranks L] [--steps A-B] -o FILE [--daemon-http H]` and `flare
    export --job ID`: the records flared holds for the job, fetched into a temporary spool, then
    the same offline tool."""
    base = _take(rest, "--daemon-http") or os.environ.get("FLARE_DAEMON_HTTP") or DEFAULT_HTTP
    quiet = bool(_take(rest, "--quiet", has_value=False))
    timeout = float(_take(rest, "--timeout") or 60.0)
    job = rest[rest.index("--job") + 1] if rest.index("--job") + 1 < len(rest) else None
    if not job:
        raise CliError("--job needs a value", code=2)
    if what == "timeline" and output_file(rest) is None and "--per-rank" not in rest:
        raise CliError("flare timeline --job %s needs where to write: -o FILE (one trace of every "
                       "rank, for ui.perfetto.dev) or --per-rank DIR (one Kineto file per rank, "
                       "for HTA)" % job, code=2)
    ranks = None
    if "--ranks" in rest and rest.index("--ranks") + 1 < len(rest):
        listed = parse_ranks(rest[rest.index("--ranks") + 1])
        ranks = None if listed is None else set(listed)
    with tempfile.TemporaryDirectory(prefix="flare-records-") as folder:
        fetch_job_records(base, job, ranks, folder, timeout=timeout, quiet=quiet)
        if quiet:
            rest.append("--quiet")
        if what == "export":
            _take(rest, "--job")  # flare-export reads one folder
            _take(rest, "--ranks")
            return run_offline_tool(what, ["--input", os.path.join(folder, job)] + rest)
        return run_offline_tool(what, ["--input", folder] + rest)


def append_preload(current, hook):
    """LD_PRELOAD with `hook` appended (once); what was there stays first."""
    parts = [p for p in (current or "").replace(":", " ").split() if p]
    if hook not in parts:
        parts.append(hook)
    return " ".join(parts)


# The one job-id rule of the hook and flared (src/common/job_id.h; tests/python/test_job_id.py
# keeps these equal to its constants): 1 to 128 of ASCII letters, digits and "._-:@".
JOB_ID_MAX = 128
JOB_ID_PUNCTUATION = "._-:@"
JOB_ID_RULE = "1 to 128 of A-Z a-z 0-9 . _ - : @"


def valid_job_id(job):
    return (0 < len(job) <= JOB_ID_MAX and
            all(c.isascii() and (c.isalnum() or c in JOB_ID_PUNCTUATION) for c in job))


def run_env(args, environ):
    env = dict(environ)
    hook = find_hook(args.hook)
    env["LD_PRELOAD"] = append_preload(env.get("LD_PRELOAD"), hook)
    daemon = args.daemon or env.get("FLARE_DAEMON") or DEFAULT_DAEMON
    parse_address(daemon, "--daemon")
    env["FLARE_DAEMON"] = daemon
    if args.token is not None:
        env["FLARE_TOKEN"] = args.token
    job = args.job_id or env.get("FLARE_JOB_ID")
    if not job:
        job = "flare-%s-%s" % (time.strftime("%Y%m%d-%H%M%S"), uuid.uuid4().hex[:8])
    if not valid_job_id(job):
        # Refused before the job starts: flared would refuse every rank's stream.
        raise CliError("flare run: job id %s is not valid: a job id is %s (from %s)"
                       % (ascii(job), JOB_ID_RULE,
                          "--job-id" if args.job_id else "FLARE_JOB_ID"))
    env["FLARE_JOB_ID"] = job
    return env


def cmd_run(args):
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CliError("flare run: no command given (flare run [options] -- CMD ...)")
    env = run_env(args, os.environ)
    if not args.quiet:
        print("flare: job %s, daemon %s" % (env["FLARE_JOB_ID"], env["FLARE_DAEMON"]),
              file=sys.stderr)
    try:
        proc = subprocess.Popen(command, env=env)
    except OSError as e:
        raise CliError("flare run: cannot start %s: %s" % (command[0], e.strerror), code=127)
    # Signals meant for the job go to it; we wait for its exit.
    forward = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, lambda n, _f: proc.send_signal(n)) for s in forward}
    try:
        code = proc.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return 128 - code if code < 0 else code


def auth_token(token=None):
    """The token sent to flared's HTTP API: the one given, else FLARE_TOKEN (a job's token reads
    and changes that job; an operator token everything; flared without --token-file checks
    none)."""
    return token or os.environ.get("FLARE_TOKEN") or None


def unreachable(base, reason):
    """The error for a daemon that does not answer, with what to try next."""
    return ("cannot reach the daemon's HTTP API at %s: %s. Is flared running there? Start it "
            "(`flared --db DATA_DIR/flared.db`), or point the CLI at its --http address with "
            "--daemon-http HOST:PORT or FLARE_DAEMON_HTTP" % (base, reason))


def http_error(base, code, what, why=""):
    """The error for an HTTP error answer, with what to do about the usual ones."""
    text = "daemon at %s answered %d for %s%s" % (base, code, what, (": " + why) if why else "")
    if code == 401:
        text += " (this daemon checks tokens: pass --token or set FLARE_TOKEN)"
    elif code == 403:
        text += " (the token given may not do this: a job's token reaches only its job; an " \
                "[operator] token reaches every job)"
    return text


class Daemon(Client):
    """flare.Client for the CLI: every daemon call goes through it, and its errors become
    CliErrors (exit status 3) that say what to try next."""

    def request(self, method, path, body=None, job=None, raw=False):
        try:
            return super().request(method, path, body, job, raw)
        except NotHttp as e:
            raise CliError("%s does not answer HTTP (%s): is it flared's --http address?"
                           % (self.address, e.reason), code=3)
        except DaemonUnreachable as e:
            raise CliError(unreachable(self.address, e.reason), code=3)
        except ApiError as e:
            if not e.status:
                raise CliError("daemon at %s sent something that is not JSON for %s"
                               % (self.address, path), code=3)
            what = path if method == "GET" else "%s %s" % (method, path)
            raise CliError(http_error(self.address, e.status, what, e.detail), code=3,
                           status=e.status)


def daemon_address(given):
    """flared's HTTP address: --daemon-http, else FLARE_DAEMON_HTTP, else the default; checked."""
    base = given or os.environ.get("FLARE_DAEMON_HTTP") or DEFAULT_HTTP
    parse_address(base, "--daemon-http")
    return base


def add_daemon_http(parser, timeout):
    """The flags of every command that asks flared: --daemon-http and --timeout."""
    parser.add_argument("--daemon-http", help="flared's HTTP address HOST:PORT (default: "
                        "FLARE_DAEMON_HTTP or %s)" % DEFAULT_HTTP)
    parser.add_argument("--timeout", type=float, default=timeout, help="seconds per request")


def daemon(base, timeout, token=None):
    """The daemon's HTTP API at `base` (HOST:PORT, or https://HOST:PORT when flared serves
    HTTPS: it has --tls-cert; verified against FLARE_TLS_CA, else the system's roots), with the
    token of auth_token()."""
    return Daemon(base, timeout, auth_token(token))


def as_int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


# The hook's name for a kernel no name lookup named (src/hook/op_names.cc unnamedKernel).
UNNAMED_KERNEL = "kernel@unknown"


def unnamed_kernels(api, job_id):
    """The job's launches recorded as kernel@unknown, from its kernel report: ({"launches",
    "timeShare"} (of the job's GPU-busy time), None), or (None, why) when the report could not
    be read."""
    try:
        got = api.get("/api/v1/jobs/%s/report" % urllib.parse.quote(job_id, safe=""))
    except CliError as e:
        return None, str(e)
    launches, share = 0, 0.0
    for s in (got.get("signatures") or []) if isinstance(got, dict) else []:
        if isinstance(s, dict) and (s.get("signature") or {}).get("name") == UNNAMED_KERNEL:
            launches += as_int(s.get("count"))
            share += float(s.get("timeShare") or 0)
    return {"launches": launches, "timeShare": share}, None


def fetch_status(base, include_finished, timeout):
    api = daemon(base, timeout)
    jobs = api.get("/api/v1/jobs" + ("?include_finished=1" if include_finished else ""))
    if not isinstance(jobs, dict) or not isinstance(jobs.get("jobs", []), list):
        raise CliError("daemon at %s: /api/v1/jobs is not a job list" % base, code=3)
    out = []
    for job in jobs.get("jobs", []):
        job_id = job.get("jobId", "")
        ranks = api.get("/api/v1/jobs/%s/ranks" % urllib.parse.quote(job_id, safe=""))
        unnamed, unnamed_error = unnamed_kernels(api, job_id)
        out.append({
            "jobId": job_id,
            "worldSize": as_int(job.get("worldSize")),
            "ranksConnected": as_int(job.get("ranksConnected")),
            "lastSeenUnixNs": as_int(job.get("lastSeenUnixNs")),
            "finished": bool(job.get("finished", False)),
            "unnamedKernels": unnamed,
            # Why unnamedKernels is null: the report's error, never a silent "none".
            "unnamedKernelsError": unnamed_error,
            "ranks": [{
                "rank": as_int(r.get("rank")),
                "host": r.get("host", ""),
                "pid": as_int(r.get("pid")),
                "connected": bool(r.get("connected", False)),
                "lastSeenUnixNs": as_int(r.get("lastSeenUnixNs")),
                "batches": as_int(r.get("batches")),
                "records": as_int(r.get("records")),
                "lostBatches": as_int(r.get("lostBatches")),
                "mode": r.get("mode", ""),
                "steps": as_int(r.get("steps")),
                "stepsSampledOut": as_int(r.get("stepsSampledOut")),
                "drops": {k: as_int(v) for k, v in (r.get("drops") or {}).items()},
                "refusals": [{
                    "reason": x.get("reason", ""),
                    "batches": as_int(x.get("batches")),
                    "items": as_int(x.get("items")),
                    "lastError": x.get("lastError", ""),
                    "lastUnixNs": as_int(x.get("lastUnixNs")),
                } for x in (r.get("refusals") or []) if isinstance(x, dict)],
            } for r in (ranks.get("ranks", []) if isinstance(ranks, dict) else [])],
        })
    return out


def ago(ns, now):
    if not ns:
        return "never"
    seconds = max(0.0, now - ns / 1e9)
    if seconds < 120:
        return "%.0fs ago" % seconds
    if seconds < 7200:
        return "%.0fm ago" % (seconds / 60)
    return datetime.datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S")


def no_jobs_text(base, included_finished, timeout):
    """What an empty `flare status` looked at, and where the finished jobs are."""
    if included_finished:
        return ("no jobs at the daemon at %s, running or finished (jobs appear when a traced "
                "rank connects: flare run --daemon HOST:PORT -- CMD)" % base)
    got = daemon(base, timeout).get("/api/v1/jobs?include_finished=1")
    finished = [j for j in (got.get("jobs", []) if isinstance(got, dict) else [])
                if isinstance(j, dict)]
    if not finished:
        return ("no jobs at the daemon at %s, running or finished (jobs appear when a traced "
                "rank connects: flare run --daemon HOST:PORT -- CMD)" % base)
    return ("no running jobs at the daemon at %s; %d finished job%s (`flare status --all` "
            "lists %s)" % (base, len(finished), "" if len(finished) == 1 else "s",
                           "it" if len(finished) == 1 else "them"))


def cmd_status(args):
    base = daemon_address(args.daemon_http)
    jobs = fetch_status(base, args.all, args.timeout)
    if args.json:
        json.dump({"jobs": jobs}, sys.stdout, indent=2)
        print()
        return 0
    if not jobs:
        print(no_jobs_text(base, args.all, args.timeout))
        return 0
    now = time.time()
    for job in jobs:
        print("job %s  ranks %d/%d connected  last seen %s%s" % (
            job["jobId"], job["ranksConnected"], job["worldSize"],
            ago(job["lastSeenUnixNs"], now), "  (finished)" if job["finished"] else ""))
        print("  %5s  %-20s %8s  %-9s %-12s %9s %10s %7s %6s  %-10s %s" % (
            "rank", "host", "pid", "state", "last seen", "batches", "records", "steps", "lost",
            "refused", "drops"))
        refusals = []
        for r in job["ranks"]:
            drops = ", ".join("%s=%d" % (k, v) for k, v in sorted(r["drops"].items()) if v)
            refused = ", ".join(
                "%s=%s" % (x["reason"], "%d batches" % x["batches"] if x["batches"] and not
                           x["items"] else "%d" % (x["items"] + x["batches"]))
                for x in r["refusals"])
            # Summary mode's complete steps (StepStats); raw mode's are found from the records.
            steps = "-" if r["mode"] == "MODE_RAW" else "%d" % r["steps"]
            print("  %5d  %-20s %8d  %-9s %-12s %9d %10d %7s %6d  %-10s %s" % (
                r["rank"], r["host"][:20], r["pid"],
                "connected" if r["connected"] else "gone", ago(r["lastSeenUnixNs"], now),
                r["batches"], r["records"], steps, r["lostBatches"], refused or "none",
                drops or "none"))
            for x in r["refusals"]:
                refusals.append((r["rank"], x))
        steps = sum(r["steps"] for r in job["ranks"])
        sampled_out = sum(r["stepsSampledOut"] for r in job["ranks"])
        if sampled_out:
            # Step sampling is a setting, not a loss; said so that fewer records are not taken
            # for one.
            print("  step sampling: %d of %d rank-steps sampled out (FLARE_SAMPLE_STEPS or "
                  "FLARE_TIMING_BUDGET_PCT: their kernels untimed, their times kept); GPU figures "
                  "from the other %d" % (sampled_out, steps, steps - sampled_out))
        # Kernels the hook could not name are kept as plain kernels, not lost; said so that a
        # report full of kernel@unknown is not mistaken for the workload's own names.
        unnamed = job["unnamedKernels"]
        if unnamed and unnamed["launches"]:
            print("  unnamed kernels: %d launch(es), %.1f%% of GPU time, recorded as %s: no "
                  "name lookup named them (each rank's log says what the lookups answered); "
                  "they count as plain kernels" % (unnamed["launches"],
                                                   100 * unnamed["timeShare"], UNNAMED_KERNEL))
        elif not unnamed:
            print("  unnamed kernels: not counted: the job's kernel report could not be read (%s)"
                  % job["unnamedKernelsError"])
        # What the daemon refused is never silent: each reason with its last error.
        for rank, x in refusals:
            print("  rank %d: the daemon refused %d batch(es) and %d item(s) as %s, last %s: %s" % (
                rank, x["batches"], x["items"], x["reason"], ago(x["lastUnixNs"], now),
                x["lastError"]))
    return 0


def cmd_alerts(args):
    """The alerts flared raised (stored, deduplicated), oldest first; --follow keeps polling."""
    base = daemon_address(args.daemon_http)
    api = daemon(base, args.timeout)
    since = 0
    printed = explained = 0
    while True:
        query = {"since": str(since)}
        if args.job:
            query["job"] = args.job
        got = api.get("/api/v1/alerts?" + urllib.parse.urlencode(query))
        alerts = got.get("alerts", []) if isinstance(got, dict) else []
        alerts.sort(key=lambda a: as_int(a.get("id")))
        for a in alerts:
            since = max(since, as_int(a.get("timeUnixNs")) + 1)
            if args.json:
                print(json.dumps(a))
            else:
                when = datetime.datetime.fromtimestamp(as_int(a.get("timeUnixNs")) / 1e9)
                # The message is the summary, then " | "-separated evidence.
                parts = a.get("message", "").split(" | ")
                print("%s [%s] %s job %s: %s" % (when.strftime("%H:%M:%S"), a.get("team", "?"),
                                                a.get("severity", ""), a.get("jobId", ""),
                                                parts[0]))
                for evidence in parts[1:]:
                    print("    - %s" % evidence)
            printed += 1
        if not printed and not args.json and not explained:
            # Once: what was looked at, so that silence is not mistaken for a broken command.
            print("no alerts %s at the daemon at %s%s" % (
                "for job %s" % args.job if args.job else "for any job", base,
                "; waiting for new ones (Ctrl-C to stop)" if args.follow else
                " (`flare diagnose --job ID` runs the detectors now; `flare status --all` "
                "lists the jobs)"))
            explained = 1
        sys.stdout.flush()
        if not args.follow:
            return 0
        time.sleep(args.interval)


def looked_at(base, job, timeout):
    """What an empty diagnosis looked at: the job's ranks, their batches and records, the ranks
    whose data flared refused or dropped, and its hang incidents. Raises CliError (exit 4) for a
    job the daemon does not know: an unknown job is not a healthy one."""
    path = urllib.parse.quote(job, safe="")
    api = daemon(base, timeout)
    try:
        ranks = api.get("/api/v1/jobs/%s/ranks" % path).get("ranks", [])
    except CliError as e:
        if e.status == 404:
            raise CliError("job %r is not known to the daemon at %s, so nothing was diagnosed "
                           "(`flare status --all` lists its jobs)" % (job, base), code=4)
        raise
    try:
        hangs = api.get("/api/v1/jobs/%s/hangs" % path).get("incidents", [])
    except CliError:
        hangs = None
    refused = sorted({as_int(r.get("rank")) for r in ranks if r.get("refusals")})
    lost = sorted({as_int(r.get("rank")) for r in ranks if as_int(r.get("lostBatches"))})
    return {"ranks": len(ranks), "connected": sum(1 for r in ranks if r.get("connected")),
            "batches": sum(as_int(r.get("batches")) for r in ranks),
            "records": sum(as_int(r.get("records")) for r in ranks),
            "ranksWithRefusedData": refused, "ranksWithLostBatches": lost,
            "hangIncidents": None if hangs is None else len(hangs)}


def cmd_diagnose(args):
    """The detectors run now by flared on the job's recent records."""
    base = daemon_address(args.daemon_http)
    got = daemon(base, args.timeout).get(
        "/api/v1/jobs/%s/diagnoses" % urllib.parse.quote(args.job, safe=""))
    found = got.get("diagnoses", []) if isinstance(got, dict) else []
    # What the detectors read and which of them ran or were skipped, and why (flared's words).
    detectors = got.get("lookedAt", {}) if isinstance(got, dict) else {}
    seen = None if found else looked_at(base, args.job, args.timeout)
    if args.json:
        # flared's steps, detectors and text, with the CLI's own counts over them.
        out = {"diagnoses": found}
        if seen is not None or detectors:
            out["lookedAt"] = dict(detectors, **(seen or {}))
        json.dump(out, sys.stdout, indent=2)
        print()
    elif not found:
        caveats = []
        if seen["ranksWithRefusedData"]:
            caveats.append("flared refused data of ranks %s (`flare status --job %s`)" % (
                compact_ranges(seen["ranksWithRefusedData"]), args.job))
        if seen["ranksWithLostBatches"]:
            caveats.append("ranks %s lost batches" % compact_ranges(seen["ranksWithLostBatches"]))
        if seen["hangIncidents"]:
            caveats.append("%d hang incident(s): `flare hang --job %s`" % (
                seen["hangIncidents"], args.job))
        if seen["ranks"] == 0 or seen["records"] == 0:
            caveats.append("no records have arrived yet")
        if seen["hangIncidents"] is None:
            caveats.append("its hang incidents could not be read (`flare hang --job %s`)"
                           % args.job)
        print("no anomaly found in job %s: looked at %d rank(s) (%d connected), %d batches, "
              "%d records in the detectors' window%s%s" % (
                  args.job, seen["ranks"], seen["connected"], seen["batches"], seen["records"],
                  " (%s)" % detectors["text"] if detectors.get("text") else "",
                  "; but " + "; ".join(caveats) if caveats else ""))
    else:
        for d in found:
            print("[%s] %s" % (d.get("team"), d.get("summary")))
            for e in d.get("evidence", []):
                print("    - %s" % e.get("text"))
        if detectors.get("text"):
            print("looked at %s" % detectors["text"])
    if found:
        return 3
    return 5 if seen and (seen["hangIncidents"] or seen["ranksWithRefusedData"]) else 0


def cmd_report(args):
    """A job's kernel report, diagnoses and metrics: text, --json, and/or an --html page."""
    from . import report
    base = daemon_address(args.daemon_http)
    if args.top < 0:
        raise CliError("--top must be 0 (all) or more")
    if any(v is not None and v <= 0 for v in (args.max_steps, args.max_ranks)):
        raise CliError("--max-steps and --max-ranks must be positive")

    api = daemon(base, args.timeout)

    def get(path, optional=False):
        try:
            return api.get(path)
        except CliError as e:
            if optional and e.status == 404:
                return None
            raise

    progress = None
    if sys.stderr.isatty() and not args.quiet:
        def progress(what):
            print("\rflare: fetching %-10s" % what, end="", file=sys.stderr, flush=True)
    try:
        data = report.collect(get, args.job, baseline=args.baseline, progress=progress,
                              limits={"max_steps": args.max_steps, "max_ranks": args.max_ranks})
    except CliError as e:
        if e.status == 404:
            raise CliError("job %r is not known to the daemon at %s (`flare status --all` lists "
                           "its jobs)" % (args.job, base), code=4)
        raise
    finally:
        if progress:
            print("\r%30s\r" % "", end="", file=sys.stderr, flush=True)
    if args.baseline and not ((data.get("series") or {}).get("issueLatency") or {}).get(
            "baseline"):
        print("flare: baseline job %r has no detector window in the daemon; drawn without it"
              % args.baseline, file=sys.stderr)
    report.derive(data)
    if args.html:
        from . import html_report
        page = escape_controls(html_report.render(data))
        try:
            with open(args.html, "w", encoding="utf-8") as f:
                f.write(page)
        except OSError as e:
            raise CliError("cannot write %s: %s" % (args.html, e.strerror or e))
        if not args.quiet:
            print("flare: wrote %s (%d KiB)" % (args.html, (len(page.encode()) + 1023) // 1024),
                  file=sys.stderr)
    if args.json:
        json.dump({k: data[k] for k in ("jobId", "ranks", "diagnoses", "metrics", "kernels",
                                        "hangs", "alerts", "series", "report")},
                  sys.stdout, indent=2)
        print()
    elif not args.html or args.text:
        sys.stdout.write(report.format_text(data, top=args.top))


def baseline_line(b):
    return "%-24s backend %-28s scale %4d  V_inter %5.1f%%  V_minority %5.1f%%  rank spread " \
        "%.3f ms  added %s" % (
            b.get("jobId", ""), repr(b.get("backend", "")), as_int(b.get("scale")),
            100 * float(b.get("vInter", 0) or 0), 100 * float(b.get("vMinority", 0) or 0),
            float(b.get("rankSpreadW1Ns", 0) or 0) / 1e6,
            datetime.datetime.fromtimestamp(as_int(b.get("addedUnixNs")) / 1e9).strftime(
                "%Y-%m-%d %H:%M:%S"))


def cmd_baseline(args):
    """Healthy history: jobs whose issue-latency, void and kernel figures later jobs of the same
    backend and scale are compared with (learned thresholds, docs/metrics.md)."""
    base = daemon_address(args.daemon_http)
    if args.action == "list":
        got = daemon(base, args.timeout).get("/api/v1/baselines")
        runs = got.get("baselines", []) if isinstance(got, dict) else []
        if args.json:
            json.dump({"baselines": runs}, sys.stdout, indent=2)
            print()
        elif not runs:
            print("no baselines")
        else:
            for b in runs:
                print(baseline_line(b))
        return 0
    if not args.job:
        raise CliError("flare baseline %s needs --job ID" % args.action)
    path = "/api/v1/jobs/%s/baseline" % urllib.parse.quote(args.job, safe="")
    if args.action == "add":
        body = {"backend": args.backend} if args.backend else {}
        got = daemon(base, args.timeout).post(path, body)
        if args.json:
            json.dump(got, sys.stdout, indent=2)
            print()
        else:
            print("job %s is now healthy history: %s" % (args.job, baseline_line(got)))
        return 0
    daemon(base, args.timeout).delete(path)
    print("job %s is no longer a baseline" % args.job)
    return 0


DEEP_FINAL = ("STATE_DONE", "STATE_SKIPPED")


def deep_trace_rows(results):
    rows = []
    for r in results.get("results", []):
        res = r.get("result", {})
        d = res.get("deepTrace", {})
        state = d.get("state", "STATE_SKIPPED" if not res.get("ok") else "STATE_UNSPECIFIED")
        rows.append({"rank": as_int(r.get("rank")), "state": state[len("STATE_"):].lower(),
                     "final": state in DEEP_FINAL,
                     "stepsRequested": as_int(d.get("stepsRequested")),
                     "stepsCaptured": as_int(d.get("stepsCaptured")),
                     "kernels": as_int(d.get("kernels")), "memcpys": as_int(d.get("memcpys")),
                     "memsets": as_int(d.get("memsets")), "dropped": as_int(d.get("dropped")),
                     "reason": d.get("reason") or res.get("error", ""),
                     "library": d.get("library", "")})
    return sorted(rows, key=lambda x: x["rank"])


def cmd_deep_trace(args):
    """Asks ranks for a CUPTI deep trace of N steps and waits for their answers."""
    base = daemon_address(args.daemon_http)
    if not 1 <= args.steps <= 1000:
        raise CliError("--steps must be in [1, 1000]")
    ranks = (parse_ranks(args.ranks) if args.ranks else None) or []
    job = urllib.parse.quote(args.job, safe="")
    body = {"ranks": ranks, "command": {"deepTrace": {"steps": args.steps}}}
    api = daemon(base, args.timeout, args.token)
    sent = api.post("/api/v1/jobs/%s/commands" % job, body)
    command_id = as_int(sent.get("commandId"))
    expected = as_int(sent.get("delivered")) + as_int(sent.get("queued"))
    if command_id <= 0:
        raise CliError("daemon at %s did not accept the command: %s" % (base, sent), code=3)
    deadline = time.time() + args.wait
    rows = []
    while True:
        got = api.get("/api/v1/jobs/%s/commands/%d" % (job, command_id))
        rows = deep_trace_rows(got)
        done = len([r for r in rows if r["final"]]) >= expected
        if done or time.time() >= deadline:
            break
        time.sleep(0.2)
    ok = expected > 0 and len(rows) >= expected and all(r["state"] == "done" for r in rows)
    if args.json:
        print(json.dumps({"jobId": args.job, "commandId": command_id, "steps": args.steps,
                          "ranksAsked": expected, "droppedByDaemon": as_int(sent.get("dropped")),
                          "complete": ok, "ranks": rows}, indent=2))
    else:
        print("deep trace %d of job %s: %d steps on %d rank(s)%s"
              % (command_id, args.job, args.steps, expected,
                 "" if ok else " (incomplete)"))
        print("%5s  %-8s %6s %8s %8s %8s %8s  %s" % ("rank", "state", "steps", "kernels",
                                                     "memcpys", "memsets", "dropped", "note"))
        for r in rows:
            print("%5d  %-8s %6d %8d %8d %8d %8d  %s"
                  % (r["rank"], r["state"], r["stepsCaptured"], r["kernels"], r["memcpys"],
                     r["memsets"], r["dropped"], r["reason"]))
        missing = expected - len(rows)
        if missing > 0:
            print("%d rank(s) did not answer within %.0f s" % (missing, args.wait))
    if expected == 0:
        print("flare: no rank of job %s could be asked (unknown job or ranks)" % args.job,
              file=sys.stderr)
    return 0 if ok else 1


def compact_ranges(ranks):
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8" (how flared prints rank sets)."""
    ranks = sorted(set(as_int(r) for r in ranks))
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else "%d-%d" % (ranks[i], ranks[j]))
        i = j + 1
    return ",".join(out) or "-"


def print_hang_incident(inc, max_frames):
    when = datetime.datetime.fromtimestamp(as_int(inc.get("openedUnixNs")) / 1e9)
    print("incident #%d  %s  (triggered by %s)  opened %s" % (
        as_int(inc.get("id")), inc.get("kind", "?"), inc.get("triggeredBy") or "silence",
        when.strftime("%Y-%m-%d %H:%M:%S")))
    print("  trigger: %s" % inc.get("trigger", ""))
    onset, diagnosed = as_int(inc.get("onsetUnixNs")), as_int(inc.get("diagnosedUnixNs"))
    took = "onset to diagnosis %.2f s" % ((diagnosed - onset) / 1e9) if onset and diagnosed \
        else "onset unknown"
    if "diagnosisSeconds" in inc:
        took += " (the diagnosis itself %.2f s)" % float(inc.get("diagnosisSeconds") or 0)
    print("  time: %s" % took)
    suspects = inc.get("suspects") or []
    if not suspects:
        print("  suspects: none named")
    for s in suspects:
        gpu = "GPU %s" % s.get("gpuIndex", "?")
        if s.get("gpuUuid"):
            gpu += " (%s)" % s["gpuUuid"]
        print("  suspect: rank %d on %s %s: %s" % (as_int(s.get("rank")), s.get("host") or "?",
                                                   gpu, s.get("reason", "")))
    link = inc.get("link")
    if link:
        print("  link: rank %d -> rank %d%s stalled at step %d (%d channels agree)" % (
            as_int(link.get("sender")), as_int(link.get("receiver")),
            " on communicator %s" % link["communicator"] if link.get("communicator") else "",
            as_int(link.get("step")), as_int(link.get("channelsAgreeing"))))
    print("  ranks: answered %s; no answer %s; crashed %s%s" % (
        compact_ranges(inc.get("answered") or []), compact_ranges(inc.get("noAnswer") or []),
        compact_ranges(inc.get("crashed") or []),
        "; connection steps inspected" if inc.get("inspected") else ""))
    groups = inc.get("stackGroups") or []
    if groups:
        print("  stack groups:")
    for g in groups:
        frames = g.get("frames") or []
        shown = " <- ".join(frames[:max_frames])
        if len(frames) > max_frames:
            shown += " <- ... %d more" % (len(frames) - max_frames)
        print("    ranks %s%s: %s" % (g.get("ranges") or compact_ranges(g.get("ranks") or []),
                                      " [communication]" if g.get("inCommunication") else "",
                                      shown or "(no frames)"))
    progress = inc.get("progress") or []
    if progress:
        print("  last collective issued / completed:")
    for p in progress:
        print("    ranks %s on %s: issued #%d %s, completed #%d" % (
            p.get("ranges") or compact_ranges(p.get("ranks") or []), p.get("communicator", "?"),
            as_int(p.get("lastIssuedSeq")), p.get("lastIssuedOp") or "",
            as_int(p.get("lastCompletedSeq"))))
    by_op = {}
    for w in inc.get("watchdog") or []:
        op = w.get("first") or {}
        key = (op.get("op", "?"), op.get("communicator", ""), as_int(op.get("seq")))
        entry = by_op.setdefault(key, [[], 0.0, 0.0])
        entry[0].append(as_int(w.get("rank")))
        entry[1] = max(entry[1], float(op.get("ageS") or 0))
        entry[2] = max(entry[2], float(op.get("thresholdS") or 0))
    if by_op:
        print("  watchdog reports:")
    for (op, comm, seq), (ranks, age, bound) in sorted(by_op.items()):
        where = " on %s seq %d" % (comm, seq) if comm else ""
        print("    ranks %s: %s%s stuck up to %.1f s (bound %.1f s)" % (
            compact_ranges(ranks), op, where, age, bound))


def cmd_hang(args):
    """The hang incidents flared diagnosed for a job (exit 3 when there is one)."""
    base = daemon_address(args.daemon_http)
    got = daemon(base, args.timeout).get(
        "/api/v1/jobs/%s/hangs" % urllib.parse.quote(args.job, safe=""))
    if not isinstance(got, dict) or not isinstance(got.get("incidents", []), list):
        raise CliError("daemon at %s: the hangs of job %s are not an incident list" %
                       (base, args.job), code=3)
    incidents = got.get("incidents", [])
    if args.json:
        json.dump({"jobId": args.job, "incidents": incidents}, sys.stdout, indent=2)
        print()
    elif not incidents:
        print("no hang incident in job %s" % args.job)
    else:
        print("job %s: %d hang incident%s" % (args.job, len(incidents),
                                              "" if len(incidents) == 1 else "s"))
        for inc in incidents:
            print_hang_incident(inc, args.frames)
    return 3 if incidents else 0


def cmd_upload(args):
    """The pending batches of ended processes under --spool, to flared (flare-upload)."""
    daemon = args.daemon or os.environ.get("FLARE_DAEMON") or DEFAULT_DAEMON
    parse_address(daemon, "--daemon")
    if not os.path.isdir(args.spool):
        raise CliError("--spool %s is not a folder" % args.spool)
    cmd = [find_tool("flare-upload"), "--spool", args.spool, "--daemon", daemon]
    if args.token:
        cmd += ["--token", args.token]
    return subprocess.call(cmd)


def add_hang_parser(sub):
    h = sub.add_parser("hang", help="a job's hang incidents: suspects, stack groups, "
                       "collective progress (exit 3 when there is one)")
    add_daemon_http(h, timeout=5.0)
    h.add_argument("--job", required=True, help="the job")
    h.add_argument("--json", action="store_true", help="print the incidents as JSON")
    h.add_argument("--frames", type=int, default=3, help="frames shown per stack group")
    h.set_defaults(func=cmd_hang)


def build_parser():
    p = argparse.ArgumentParser(prog="flare", description="Flare: trace training jobs and "
                                "query the flared daemon.")
    sub = p.add_subparsers(dest="what", metavar="COMMAND")
    r = sub.add_parser("run", help="run a command with tracing, streaming to flared",
                       usage="flare run [options] -- CMD ...")
    r.add_argument("--daemon", help="flared's gRPC address HOST:PORT (default: FLARE_DAEMON "
                   "or %s)" % DEFAULT_DAEMON)
    r.add_argument("--token", help="the job's token (FLARE_TOKEN)")
    r.add_argument("--job-id", help="job id (default: FLARE_JOB_ID or a fresh one)")
    r.add_argument("--hook", help="path of libflare_hook.so (default: FLARE_HOOK_LIB, next to "
                   "this package, or build/lib)")
    r.add_argument("--quiet", action="store_true", help="no line about the job on stderr")
    r.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    r.set_defaults(func=cmd_run)
    s = sub.add_parser("status", help="jobs and ranks the daemon knows")
    add_daemon_http(s, timeout=5.0)
    s.add_argument("--json", action="store_true", help="print JSON")
    s.add_argument("--all", action="store_true", help="include finished jobs")
    s.set_defaults(func=cmd_status)
    a = sub.add_parser("alerts", help="alerts the daemon raised (routed to a team)")
    add_daemon_http(a, timeout=5.0)
    a.add_argument("--job", help="only this job")
    a.add_argument("--follow", action="store_true", help="keep printing new alerts")
    a.add_argument("--interval", type=float, default=2.0, help="seconds between polls (--follow)")
    a.add_argument("--json", action="store_true", help="one JSON object per alert")
    a.set_defaults(func=cmd_alerts)
    g = sub.add_parser("diagnose", help="run the detectors on a job's recent records in flared "
                       "now (exit 3 when something is found; offline: diagnose-spool)")
    add_daemon_http(g, timeout=5.0)
    g.add_argument("--job", required=True, help="the job")
    g.add_argument("--json", action="store_true", help="print JSON")
    g.set_defaults(func=cmd_diagnose)
    rp = sub.add_parser("report", help="a job's kernel report, diagnoses and metrics (text, "
                        "--json, --html page)")
    add_daemon_http(rp, timeout=10.0)
    rp.add_argument("--job", required=True, help="the job")
    rp.add_argument("--json", action="store_true", help="print everything as one JSON object")
    rp.add_argument("--html", metavar="FILE", help="write a self-contained HTML page (charts, "
                    "tables; no network needed to view it)")
    rp.add_argument("--text", action="store_true", help="print the text report as well as "
                    "writing --html")
    rp.add_argument("--baseline", metavar="JOB", help="a healthy job still in the daemon's window:"
                    " its issue-latency distribution is drawn as the reference")
    rp.add_argument("--top", type=int, default=25, help="kernel rows in the text report (0: all;"
                    " --json and --html have all)")
    rp.add_argument("--max-steps", type=int, help="steps in the series (the last ones; daemon "
                    "default 256, at most 2048)")
    rp.add_argument("--max-ranks", type=int, help="ranks in the series (diagnosed ones first; "
                    "daemon default 128, at most 512)")
    rp.add_argument("--quiet", action="store_true", help="no progress or 'wrote' lines on stderr")
    rp.set_defaults(func=cmd_report)
    b = sub.add_parser("baseline", help="mark jobs as healthy history (learned thresholds)",
                       description="add: mark a finished or running job healthy; list; remove.")
    b.add_argument("action", choices=("add", "list", "remove"))
    b.add_argument("--job", help="the job (add, remove)")
    b.add_argument("--backend", help="add: the backend key (default: the device name its ranks "
                   "reported)")
    add_daemon_http(b, timeout=30.0)
    b.add_argument("--json", action="store_true", help="print JSON")
    b.set_defaults(func=cmd_baseline)
    u = sub.add_parser("upload", help="upload the spools that ended processes left (the daemon "
                       "was unreachable) to flared, exactly once")
    u.add_argument("--spool", required=True, help="the spool folder (FLARE_OUTPUT_DIR), any "
                   "depth above the pending-<pid>.pb files")
    u.add_argument("--daemon", help="flared's gRPC address HOST:PORT (default: FLARE_DAEMON or "
                   "%s)" % DEFAULT_DAEMON)
    u.add_argument("--token", help="send this token instead of each process's own")
    u.set_defaults(func=cmd_upload)
    d = sub.add_parser("deep-trace", help="capture every kernel, memcpy and memset of N steps "
                       "with CUPTI on some ranks (exit 1 unless every rank finished)")
    add_daemon_http(d, timeout=5.0)
    d.add_argument("--job", required=True, help="the job")
    d.add_argument("--steps", type=int, required=True, help="steps to capture (1-1000)")
    d.add_argument("--ranks", help="ranks, e.g. 2,5 or 0-3,8 (default or *: every rank)")
    d.add_argument("--token", help="the job's token (default: FLARE_TOKEN)")
    d.add_argument("--wait", type=float, default=120.0,
                   help="seconds to wait for the ranks to finish (default 120)")
    d.add_argument("--json", action="store_true", help="print JSON")
    d.set_defaults(func=cmd_deep_trace)
    add_hang_parser(sub)
    for name, what in (("export", "a job's records as JSON lines: online from flared (--job ID) "
                                  "or offline from a spool (--input DIR); --help for both"),
                       ("timeline", "a Perfetto/Kineto trace: online from flared (--job ID -o "
                                    "FILE) or offline from a spool (--input DIR -o FILE); --help "
                                    "for both"),
                       ("diagnose-spool", "the detectors on an offline spool (--input DIR; "
                                          "flare-diagnose); a job in flared: diagnose --job")):
        # Dispatched in main() before parsing, so that every argument reaches the tool.
        sub.add_parser(name, help=what, add_help=False,
                       usage="flare %s [ARGS ...] (`flare %s --help` lists them)" % (name, name))
    return p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in TOOLS:
        try:
            return run_tool(argv[0], argv[1:])
        except CliError as e:
            print("flare: %s" % e, file=sys.stderr)
            return e.code
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    # Names and texts from ranks and the daemon reach the terminal without control characters
    # (flare/safe_text.py); stderr keeps the progress line's own \r.
    stdout = sys.stdout
    sys.stdout = SafeStream(stdout)
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `flare status | head`
        sys.stderr.close()
        return 0
    except CliError as e:
        print("flare: %s" % escape_controls(str(e)), file=sys.stderr)
        return e.code
    finally:
        sys.stdout = stdout
