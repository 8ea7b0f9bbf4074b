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
import time

import pytest

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
    env = {"LD_PRELOAD": os.path.join(build_dir, "lib", "libflare_hook.so"),
           "FLARE_OUTPUT_DIR": str(tmp_path / "spool"), "FLARE_JOB_ID": "streamtest"}
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
