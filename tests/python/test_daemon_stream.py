"""Ranks stream to a daemon (FLARE_DAEMON): every record arrives, in order, through a daemon
restart; a wrong token is refused; the training steps do not wait on the daemon.

The daemon here is flare-fake-ingest (src/timing/testing): the Ingest service of
proto/flare/v1/service.proto, writing what it receives in the spool layout (deduplicating
re-sent batches by batch_seq, as flared does) so flare-export reads it. The truth is the same
workload traced into the local spool without a daemon.
"""
import collections
import json
import os
import signal
import subprocess
import tempfile
import time

import pytest
from pipeline_health import assert_nothing_refused

STEPS_SHORT = 5


class Ingest:
    def __init__(self, build_dir, out, token=""):
        self.exe = os.path.join(build_dir, "bin", "flare-fake-ingest")
        self.out = str(out)
        self.token = token
        self.port = 0
        self.proc = None
        self.log = []

    def start(self):
        cmd = [self.exe, "--out", self.out, "--port", str(self.port)]
        if self.token:
            cmd += ["--token", self.token]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("port "), line + self.proc.stderr.read()
        self.port = int(line.split()[1])
        return self

    def stop(self, sig=signal.SIGTERM):
        if self.proc is None:
            return
        self.proc.send_signal(sig)
        _, err = self.proc.communicate(timeout=30)
        self.log.append(err)
        self.proc = None

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port


@pytest.fixture
def ingest(build_dir, tmp_path):
    if not os.path.exists(os.path.join(build_dir, "bin", "flare-fake-ingest")):
        pytest.skip("flare-fake-ingest not built (FLARE_BUILD_TESTS=OFF)")
    made = []

    def make(token=""):
        i = Ingest(build_dir, tmp_path / ("received%d" % len(made)), token)
        made.append(i)
        return i.start()
    yield make
    for i in made:
        i.stop(signal.SIGKILL)


def export(build_dir, folder):
    exp = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input", str(folder)],
                         capture_output=True, text=True, timeout=120)
    assert exp.returncode == 0, exp.stderr
    return [json.loads(line) for line in exp.stdout.splitlines()]


def counts(records):
    return collections.Counter((r["rank"], r["name"]) for r in records)


def assert_in_order(records):
    """Per rank and stream, records come in launch order (what the poller emits)."""
    last = {}
    for r in records:
        key = (r["rank"], r["stream"], r["thread"])
        assert r["issue_ns"] >= last.get(key, 0), r
        last[key] = r["issue_ns"]


def hook_env(build_dir, tmp_path, **extra):
    # Raw mode: these tests check that every record the rank timed reaches flared (summary
    # mode, the default when streaming, is covered by test_summary_mode.py).
    env = {"LD_PRELOAD": os.path.join(build_dir, "lib", "libflare_hook.so"),
           "FLARE_OUTPUT_DIR": str(tmp_path / "spool"), "FLARE_JOB_ID": "streamtest",
           "FLARE_MODE": "raw"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.fixture
def baseline(sim_train, build_dir, tmp_path):
    """The same workload traced into the local spool only: the truth."""
    cache = {}

    def run(steps):
        if steps not in cache:
            env = hook_env(build_dir, tmp_path / ("base%d" % steps))
            res = sim_train("--ranks", 8, "--steps", steps, env=env)
            assert res.returncode == 0, res.stderr
            cache[steps] = (export(build_dir, tmp_path / ("base%d" % steps) / "spool"), res)
        return cache[steps]
    return run


def test_eight_ranks_stream_every_record_in_order(sim_train, build_dir, tmp_path, ingest,
                                                   baseline):
    daemon = ingest(token="tok")
    env = hook_env(build_dir, tmp_path, FLARE_DAEMON=daemon.address, FLARE_TOKEN="tok")
    res = sim_train("--ranks", 8, "--steps", STEPS_SHORT, env=env)
    assert res.returncode == 0, res.stderr
    daemon.stop()
    got = export(build_dir, daemon.out)
    truth, _ = baseline(STEPS_SHORT)
    assert sorted({r["rank"] for r in got}) == list(range(8))
    assert counts(got) == counts(truth)
    assert_in_order(got)
    # Everything went to the daemon: nothing left in the local spool.
    spool = tmp_path / "spool"
    assert not spool.exists() or not any(p.is_file() for p in spool.rglob("*.pb"))
    assert daemon.log[0].count("accepted") == 8


def test_daemon_killed_and_restarted_mid_run_loses_nothing(sim_train, build_dir, tmp_path,
                                                            ingest, baseline):
    steps = 80
    daemon = ingest()
    env = hook_env(build_dir, tmp_path, FLARE_DAEMON=daemon.address,
                   FLARE_EXPORT_BUFFER_BYTES=262144)
    import threading
    done = threading.Event()
    result = {}

    def train():
        result["res"] = sim_train("--ranks", 8, "--steps", steps, env=env, timeout=300)
        done.set()
    t = threading.Thread(target=train)
    t.start()
    time.sleep(1.0)
    daemon.stop(signal.SIGKILL)  # mid-run, without a goodbye
    time.sleep(1.5)
    assert not done.is_set(), "the run ended before the daemon came back; make it longer"
    daemon.start()  # same port, same output folder
    t.join(300)
    res = result["res"]
    assert res.returncode == 0, res.stderr
    daemon.stop()
    got = export(build_dir, daemon.out)
    truth, base = baseline(steps)
    assert counts(got) == counts(truth)
    assert_in_order(got)
    # Every rank reconnected (a second hello) and nothing is left in the local spool.
    hellos = "".join(daemon.log).count("accepted")
    assert hellos >= 16, daemon.log
    # The restarted daemon told each rank what it held (HelloAck.resume_after_seq): no batch
    # was sent twice to it.
    import re
    dups = [int(n) for n in re.findall(r"duplicates=(\d+)", daemon.log[-1])]
    assert len(dups) == 8 and sum(dups) == 0, daemon.log[-1]
    assert not any(p.stat().st_size for p in (tmp_path / "spool").rglob("*.pb"))
    # The steps did not wait on the daemon: medians within noise of the run without one.
    for rank in range(8):
        assert res.median(rank, "step_ms") < 1.5 * base.median(rank, "step_ms") + 5, rank


def test_wrong_token_is_refused_and_records_stay_in_the_spool(sim_train, build_dir, tmp_path,
                                                             ingest, baseline):
    daemon = ingest(token="right")
    env = hook_env(build_dir, tmp_path, FLARE_DAEMON=daemon.address, FLARE_TOKEN="wrong")
    res = sim_train("--ranks", 8, "--steps", STEPS_SHORT, env=env)
    assert res.returncode == 0, res.stderr
    assert "refused" in res.stderr
    daemon.stop()
    assert daemon.log[0].count("refused") == 8
    assert not os.path.exists(daemon.out) or not export(build_dir, daemon.out)
    kept = export(build_dir, tmp_path / "spool")
    truth, _ = baseline(STEPS_SHORT)
    assert counts(kept) == counts(truth)


def test_unreachable_daemon_spools_and_exits_promptly(sim_train, build_dir, tmp_path, baseline):
    env = hook_env(build_dir, tmp_path, FLARE_DAEMON="127.0.0.1:1", FLARE_EXIT_FLUSH_SECONDS=1)
    t0 = time.monotonic()
    res = sim_train("--ranks", 8, "--steps", STEPS_SHORT, env=env)
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    kept = export(build_dir, tmp_path / "spool")
    truth, _ = baseline(STEPS_SHORT)
    assert counts(kept) == counts(truth)
    assert elapsed < 30


def test_forked_children_stay_quiet_while_streaming(build_dir, tmp_path, ingest):
    daemon = ingest()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLARE_")}
    env.update(hook_env(build_dir, tmp_path, FLARE_DAEMON=daemon.address, FLARE_JOB_ID="probe"))
    proc = subprocess.run([os.path.join(build_dir, "bin", "hook_probe"), "fork"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("child ok") == 1
    daemon.stop()
    records = export(build_dir, daemon.out)
    assert len([r for r in records if r["name"].startswith("probe_kernel(")]) == 6
    assert len({r["thread"] for r in records}) == 1  # nothing from the child
    assert daemon.log[0].count("hello") == 1  # the child opened no stream


# ---- the real daemon (build/bin/flared, src/engine), when it is built ----------------------

class Flared:
    def __init__(self, build_dir, workdir, token_file=None, extra=()):
        self.exe = os.path.join(build_dir, "bin", "flared")
        self.extra = list(extra)
        self.workdir = workdir
        self.token_file = token_file
        self.grpc_port = 0
        self.http_port = 0
        self.proc = None

    def start(self):
        import re
        log = os.path.join(str(self.workdir), "flared-%d.log" % time.monotonic_ns())
        cmd = [self.exe, "--listen", "127.0.0.1:%d" % self.grpc_port,
               "--http", "127.0.0.1:%d" % self.http_port,
               "--db", os.path.join(str(self.workdir), "flared.db")]
        if self.token_file:
            cmd += ["--token-file", str(self.token_file)]
        cmd += self.extra
        self.log = open(log, "w+")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(200):
            m = re.search(r"gRPC on port (\d+)(?: \(TLS\))?, HTTP on port (\d+)", open(log).read())
            if m:
                self.grpc_port, self.http_port = int(m.group(1)), int(m.group(2))
                return self
            assert self.proc.poll() is None, open(log).read()
            time.sleep(0.05)
        raise AssertionError("flared did not start: " + open(log).read())

    def stop(self, sig=signal.SIGTERM):
        if self.proc is not None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)
            self.proc = None

    http_token = None  # sent with every HTTP request when set (flared with a token file)

    def get(self, path):
        import ssl
        import urllib.request
        # With --tls-cert the HTTP port speaks HTTPS too (same certificate): trusted through the
        # CA beside the certificate (make_certs' layout).
        context = None
        scheme = "http"
        if "--tls-cert" in self.extra:
            cert = self.extra[self.extra.index("--tls-cert") + 1]
            certs = os.path.dirname(cert)
            context = ssl.create_default_context(cafile=os.path.join(certs, "ca.pem"))
            if "--tls-client-ca" in self.extra:  # mutual TLS: the client's certificate too
                context.load_cert_chain(os.path.join(certs, "client.pem"),
                                        os.path.join(certs, "client.key"))
            scheme = "https"
        req = urllib.request.Request("%s://127.0.0.1:%d%s" % (scheme, self.http_port, path))
        if self.http_token:
            req.add_header("X-Flare-Token", self.http_token)
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return r.read().decode()

    def ranks(self, job):
        return {r["rank"]: r for r in json.loads(self.get("/api/v1/jobs/%s/ranks" % job))["ranks"]}


@pytest.fixture
def flared(build_dir, tmp_path):
    if not os.path.exists(os.path.join(build_dir, "bin", "flared")):
        pytest.skip("build/bin/flared not built")
    made = []

    def make(**kw):
        f = Flared(build_dir, tmp_path, **kw).start()
        made.append(f)
        return f
    yield make
    for f in made:
        f.stop(signal.SIGKILL)


def per_rank(records):
    return collections.Counter(r["rank"] for r in records)


def test_flared_receives_every_record_and_refuses_a_wrong_token(sim_train, build_dir, tmp_path,
                                                               flared, baseline):
    tokens = tmp_path / "tokens"
    tokens.write_text("streamtest tok\n[operator] optok\n")
    daemon = flared(token_file=tokens)
    daemon.http_token = "optok"  # reads /metrics and every job
    addr = "127.0.0.1:%d" % daemon.grpc_port
    env = hook_env(build_dir, tmp_path, FLARE_DAEMON=addr, FLARE_TOKEN="tok")
    res = sim_train("--ranks", 8, "--steps", STEPS_SHORT, env=env)
    assert res.returncode == 0, res.stderr
    truth, _ = baseline(STEPS_SHORT)
    want = per_rank(truth)
    got = daemon.ranks("streamtest")
    assert sorted(got) == list(range(8))
    for rank in range(8):
        assert int(got[rank]["records"]) == want[rank], got[rank]
        assert int(got[rank]["lostBatches"]) == 0
    env = hook_env(build_dir, tmp_path / "wrong", FLARE_DAEMON=addr, FLARE_TOKEN="nope")
    res = sim_train("--ranks", 2, "--steps", STEPS_SHORT, env=env)
    assert res.returncode == 0, res.stderr
    assert "refused" in res.stderr
    metrics = daemon.get("/metrics")
    assert 'flare_ingest_rejected_total{reason="unauthenticated"} 2' in metrics
    assert_nothing_refused(daemon.http_port, allow=("unauthenticated",), token="optok")
    assert export(build_dir, tmp_path / "wrong" / "spool")  # kept locally


def stored_per_rank(db, job):
    """Ranks' record counters and raw records, read from flared's SQLite database."""
    import sqlite3
    con = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
    try:
        records = dict(con.execute("SELECT rank, records FROM ranks WHERE job_id=?", (job,)))
        # Raw records are packed per rank into chunks (src/engine/raw_chunks.h).
        raw = dict(con.execute("SELECT rank, SUM(count) FROM raw_chunks WHERE job_id=? "
                               "GROUP BY rank", (job,)))
    finally:
        con.close()
    return records, raw


@pytest.fixture
def postgres(tmp_path):
    """A PostgreSQL server in a temporary directory (Unix socket only); its URI for flared.
    Skips when no server binary is installed."""
    import glob
    import pwd
    import shutil
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not bins:
        pytest.skip("no PostgreSQL server binary (Debian package postgresql)")
    bindir = os.path.dirname(bins[-1])
    d = tempfile.mkdtemp(prefix="flare_pgt_", dir="/tmp")  # short: Unix socket path limit
    prefix = []
    if os.geteuid() == 0:  # initdb refuses root: the server runs as postgres
        pw = pwd.getpwnam("postgres")
        os.chown(d, pw.pw_uid, pw.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    subprocess.run(prefix + [bindir + "/initdb", "-D", d + "/data", "-U", "flare",
                             "--auth=trust"], check=True, capture_output=True, timeout=120)
    subprocess.run(prefix + [bindir + "/pg_ctl", "-D", d + "/data", "-l", d + "/log", "-w", "-o",
                             "-k %s -c listen_addresses='' -c fsync=off" % d, "start"],
                   check=True, capture_output=True, timeout=120)
    yield "postgresql://flare@/postgres?host=" + d, d
    subprocess.run(prefix + [bindir + "/pg_ctl", "-D", d + "/data", "-m", "immediate", "stop"],
                   capture_output=True, timeout=60)
    shutil.rmtree(d, ignore_errors=True)


def stored_per_rank_pg(host, job):
    def query(sql):
        out = subprocess.run(["psql", "-h", host, "-U", "flare", "-d", "postgres", "-At", "-F",
                              " ", "-c", sql], check=True, capture_output=True, text=True,
                             timeout=60).stdout
        return {int(a): int(b) for a, b in (line.split() for line in out.splitlines() if line)}
    return (query("SELECT rank, records FROM ranks WHERE job_id='%s'" % job),
            query("SELECT rank, SUM(count) FROM raw_chunks WHERE job_id='%s' GROUP BY rank" % job))


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_flared_killed_and_restarted_mid_run_holds_every_record_exactly_once(
        sim_train, build_dir, tmp_path, flared, baseline, request, db):
    # Long enough that every rank's first checkpoint is committed well before the run ends, even
    # on a loaded machine (a PostgreSQL commit can take a second there).
    steps = 240
    extra = ["--persist-interval-ms", "500"]
    if db == "postgresql":
        uri, pg_host = request.getfixturevalue("postgres")
        extra += ["--db", uri]
    daemon = flared(extra=extra)
    env = hook_env(build_dir, tmp_path, FLARE_DAEMON="127.0.0.1:%d" % daemon.grpc_port)
    import threading
    result = {}
    t = threading.Thread(target=lambda: result.update(
        res=sim_train("--ranks", 8, "--steps", steps, env=env, timeout=300)))
    t.start()
    # Kill once the store holds a checkpoint of every rank (its batch_seq mark committed).
    def marks():
        sql = "SELECT COUNT(*) FROM batch_seqs WHERE job_id='streamtest'"
        try:
            if db == "postgresql":
                return int(subprocess.run(["psql", "-h", pg_host, "-U", "flare", "-d",
                                           "postgres", "-At", "-c", sql], capture_output=True,
                                          text=True, timeout=30).stdout.strip() or 0)
            import sqlite3
            con = sqlite3.connect("file:%s?mode=ro" % os.path.join(str(tmp_path), "flared.db"),
                                  uri=True)
            try:
                return con.execute(sql).fetchone()[0]
            finally:
                con.close()
        except Exception:  # not created yet
            return 0
    deadline = time.monotonic() + 60
    while marks() < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert t.is_alive(), "the run ended before the kill; make it longer"
    daemon.stop(signal.SIGKILL)  # batches applied since its last checkpoint die with it
    time.sleep(1.5)
    daemon.start()  # same ports, same database
    t.join(300)
    assert result["res"].returncode == 0, result["res"].stderr
    # On a loaded machine the checkpoints can come so late that the run ends while the daemon
    # is down (a loaded make test: pending files written 28 ms before the restart). Each rank
    # then leaves what it could not send in the spool for `flare upload`, as when the daemon is
    # down at a job's end; uploaded, it must still be every record exactly once.
    left = sorted((tmp_path / "spool").rglob("pending-*.pb"))
    if left:
        up = subprocess.run([os.path.join(build_dir, "bin", "flare"), "upload", "--spool",
                             str(tmp_path / "spool"), "--daemon",
                             "127.0.0.1:%d" % daemon.grpc_port],
                            capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, up.stdout + up.stderr
        assert not list((tmp_path / "spool").rglob("pending-*.pb")), up.stdout
    truth, _ = baseline(steps)
    want = per_rank(truth)
    # The restarted daemon reloaded each rank process's resume point from the store.
    daemon.log.seek(0)
    assert "8 rank processes' batch marks" in daemon.log.read()
    # Exactly once: every record the ranks produced, none twice (the ranks resumed after what
    # the store held; batches re-sent below that point would have been dropped and counted).
    deadline = time.monotonic() + 20
    while True:
        got = daemon.ranks("streamtest")
        if all(int(got[r]["records"]) == want[r] for r in range(8)) or \
                time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for rank in range(8):
        assert int(got[rank]["records"]) == want[rank], (rank, got[rank], want[rank])
        assert int(got[rank]["lostBatches"]) == 0, got[rank]
    daemon.stop()  # SIGTERM: a final checkpoint
    if db == "postgresql":
        records, raw = stored_per_rank_pg(pg_host, "streamtest")
    else:
        records, raw = stored_per_rank(os.path.join(str(tmp_path), "flared.db"), "streamtest")
    assert records == dict(want), (records, want)
    assert raw == dict(want), (raw, want)


def test_batch_bounds_are_settings_and_bad_values_are_named(sim_train, build_dir, tmp_path,
                                                              flared):
    daemon = flared()
    addr = "127.0.0.1:%d" % daemon.grpc_port

    def batches(job, **extra):
        env = hook_env(build_dir, tmp_path / job, FLARE_DAEMON=addr, FLARE_JOB_ID=job, **extra)
        r = sim_train("--ranks", 2, "--steps", 40, env=env)
        assert r.returncode == 0, r.stderr
        got = daemon.ranks(job)
        return r, sum(int(v["batches"]) for v in got.values()), \
            sum(int(v["records"]) for v in got.values())
    _, by_size, records = batches("small", FLARE_BATCH_BYTES=1024)
    _, by_default, records_default = batches("default")
    assert records == records_default
    # ~60 bytes a record: 1 KiB batches are many more than 64 KiB ones.
    assert by_size >= 5 * by_default, (by_size, by_default)
    # A time bound alone (size bound out of reach): more batches at 50 ms than at 1 s.
    _, fast, _ = batches("fast", FLARE_BATCH_BYTES=64 << 20, FLARE_BATCH_INTERVAL_MS=50)
    _, slow, _ = batches("slow", FLARE_BATCH_BYTES=64 << 20, FLARE_BATCH_INTERVAL_MS=1000)
    assert fast >= 3 * slow, (fast, slow)
    # Malformed or out-of-range values: one line naming the setting, the default used.
    r, n, recs = batches("bad", FLARE_BATCH_BYTES="64k", FLARE_BATCH_INTERVAL_MS=0)
    assert "FLARE_BATCH_BYTES='64k' is not an integer; using 65536" in r.stderr, r.stderr
    assert "FLARE_BATCH_INTERVAL_MS" in r.stderr and "using 1000" in r.stderr, r.stderr
    assert recs == records_default


def make_certs(folder):
    """A CA, a server certificate it signs for 127.0.0.1/localhost, a client certificate it signs,
    and an unrelated CA. None when openssl is missing."""
    import shutil
    if shutil.which("openssl") is None:
        return None
    folder.mkdir()
    f = lambda name: str(folder / name)

    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)
    for ca in ("ca", "other-ca"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
            "/CN=flare test " + ca, "-keyout", f(ca + ".key"), "-out", f(ca + ".pem"))
    (folder / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for who in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=" + who, "-keyout",
            f(who + ".key"), "-out", f(who + ".csr"))
        extra = ["-extfile", f("server.ext")] if who == "server" else []
        run("x509", "-req", "-in", f(who + ".csr"), "-CA", f("ca.pem"), "-CAkey", f("ca.key"),
            "-CAcreateserial", "-days", "1", "-out", f(who + ".pem"), *extra)
    return f


def test_ranks_stream_over_tls_and_a_wrong_ca_spools(sim_train, build_dir, tmp_path, flared):
    certs = make_certs(tmp_path / "certs")
    if certs is None:
        pytest.skip("openssl not installed")
    steps = STEPS_SHORT
    base = hook_env(build_dir, tmp_path / "base")
    res = sim_train("--ranks", 2, "--steps", steps, env=base)
    assert res.returncode == 0, res.stderr
    want = per_rank(export(build_dir, tmp_path / "base" / "spool"))
    daemon = flared(extra=["--tls-cert", certs("server.pem"), "--tls-key", certs("server.key")])
    addr = "127.0.0.1:%d" % daemon.grpc_port

    def run(job, **tls):
        env = hook_env(build_dir, tmp_path / job, FLARE_DAEMON=addr, FLARE_JOB_ID=job,
                       FLARE_EXIT_FLUSH_SECONDS=1, **tls)
        r = sim_train("--ranks", 2, "--steps", steps, env=env)
        assert r.returncode == 0, r.stderr
        return r

    def held(job):
        try:
            return {r: int(v["records"]) for r, v in daemon.ranks(job).items()}
        except Exception:  # 404: the daemon never heard of the job
            return {}

    # The right CA: every record arrives over TLS.
    run("tls-ok", FLARE_TLS_CA=certs("ca.pem"))
    assert held("tls-ok") == dict(want)
    # The right CA, the daemon addressed by a name its certificate lists.
    run("tls-name", FLARE_TLS_CA=certs("ca.pem"), FLARE_TLS_SERVER_NAME="localhost")
    assert held("tls-name") == dict(want)
    # A CA that did not sign the daemon's certificate: refused by the rank, records spooled.
    r = run("tls-wrong-ca", FLARE_TLS_CA=certs("other-ca.pem"))
    assert "over TLS" in r.stderr, r.stderr
    assert held("tls-wrong-ca") == {}
    assert per_rank(export(build_dir, tmp_path / "tls-wrong-ca" / "spool")) == want
    # An unreadable CA file: one clear line, records spooled, the run unharmed.
    r = run("tls-missing", FLARE_TLS_CA=str(tmp_path / "nope.pem"))
    assert "FLARE_TLS_CA=%s cannot be read" % (tmp_path / "nope.pem") in r.stderr, r.stderr
    assert held("tls-missing") == {}
    assert per_rank(export(build_dir, tmp_path / "tls-missing" / "spool")) == want
    # No TLS settings against the TLS daemon: no stream (plaintext is refused), spooled.
    run("plain")
    assert held("plain") == {}
    assert per_rank(export(build_dir, tmp_path / "plain" / "spool")) == want
    daemon.stop()

    # A daemon that asks for client certificates: the rank's own certificate gets it in.
    daemon = flared(extra=["--tls-cert", certs("server.pem"), "--tls-key", certs("server.key"),
                           "--tls-client-ca", certs("ca.pem")])
    addr = "127.0.0.1:%d" % daemon.grpc_port
    run("mtls-ok", FLARE_TLS_CA=certs("ca.pem"), FLARE_TLS_CERT=certs("client.pem"),
        FLARE_TLS_KEY=certs("client.key"))
    assert held("mtls-ok") == dict(want)
    run("mtls-nocert", FLARE_TLS_CA=certs("ca.pem"))
    assert held("mtls-nocert") == {}
    assert per_rank(export(build_dir, tmp_path / "mtls-nocert" / "spool")) == want


SITECUSTOMIZE = r'''
import os, sys, threading, time

def _exporter_loaded():
    with open("/proc/self/maps") as f:
        return "libflare_exporter.so" in f.read()

def _grpc_roundtrip(tag):
    loaded_before = _exporter_loaded()
    try:
        import grpc
        from concurrent import futures
        ident = lambda b: b
        handler = grpc.method_handlers_generic_handler("probe.Echo", {
            "Say": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"echo:" + req,
                                                       request_deserializer=ident,
                                                       response_serializer=ident)})
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        with grpc.insecure_channel("127.0.0.1:%d" % port) as ch:
            say = ch.unary_unary("/probe.Echo/Say", request_serializer=ident,
                                 response_deserializer=ident)
            reply = say(b"hi", timeout=10)
        server.stop(0)
        result = "ok" if reply == b"echo:hi" else "bad reply %r" % reply
        result += " exporter-loaded-before" if loaded_before else " exporter-loaded-after"
    except Exception as e:  # reported to the test
        result = "error %r" % e
    with open(os.path.join(os.environ["GRPC_PROBE_DIR"], "%s-%d" % (tag, os.getpid())), "w") as f:
        f.write(result)

if os.environ.get("GRPC_PROBE_DIR") and sys.argv and sys.argv[0].endswith("train.py"):
    if os.environ["GRPC_PROBE_WHEN"] == "early":
        _grpc_roundtrip("early")   # grpcio loaded before Flare's exporter
    else:
        def _late():
            while not _exporter_loaded():  # training (and Flare's exporter) already running
                time.sleep(0.005)
            _grpc_roundtrip("late")
        _t = threading.Thread(target=_late)
        _t.start()
        import atexit
        atexit.register(_t.join)
'''


@pytest.mark.parametrize("when", ["early", "late"])
def test_python_rank_using_grpcio_streams_beside_it(sim_train, build_dir, tmp_path, ingest, when):
    pytest.importorskip("grpc")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    probes = tmp_path / "probes"
    probes.mkdir()
    daemon = ingest()
    env = hook_env(build_dir, tmp_path, FLARE_DAEMON=daemon.address, PYTHONPATH=str(site),
                   GRPC_PROBE_DIR=str(probes), GRPC_PROBE_WHEN=when)
    res = sim_train("--ranks", 2, "--steps", 20, "--layers", 2, "--python", env=env)
    assert res.returncode == 0, res.stderr
    daemon.stop()
    results = {p.name: p.read_text() for p in probes.iterdir()}
    order = "before" if when == "late" else "after"
    assert len(results) == 2, results
    assert set(results.values()) == {"ok exporter-loaded-" + order}, results
    got = export(build_dir, daemon.out)
    assert {r["rank"] for r in got} == {0, 1}
    # The Python workload: 12 cublasGemmEx per layer and step (test_hook.py), 2 ranks.
    assert sum(1 for r in got if r["name"] == "cublasGemmEx") == 2 * 20 * 2 * 12
