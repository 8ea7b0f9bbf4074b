"""A real flared for the Python tests: started on free loopback ports with a database in the
test's folder, ready once it has written its ports to --ready-file (no log scraping, no fixed
sleep), read over its HTTP API, stopped with SIGTERM. The test files subclass it to add their
default flags and helpers."""
import json
import os
import signal
import subprocess
import time
import urllib.request


class Flared:
    def __init__(self, build_dir, workdir, *flags, start_timeout_s=20):
        workdir = str(workdir)
        ready = os.path.join(workdir, "ready")
        if os.path.exists(ready):
            os.unlink(ready)  # a previous daemon's ports
        self.log_path = os.path.join(workdir, "flared.log")
        self.proc = subprocess.Popen(
            [os.path.join(build_dir, "bin", "flared"), "--listen", "127.0.0.1:0", "--http",
             "127.0.0.1:0", "--db", os.path.join(workdir, "flared.db"), "--ready-file", ready,
             *map(str, flags)],
            stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline:
            if os.path.exists(ready):
                self.grpc, self.http = map(int, open(ready).read().split())
                return
            assert self.proc.poll() is None, open(self.log_path).read()
            time.sleep(0.05)
        raise AssertionError("flared did not start: " + open(self.log_path).read())

    def text(self, path, timeout=10):
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.http, path),
                                    timeout=timeout) as r:
            return r.read().decode()

    def json(self, path, timeout=10):
        return json.loads(self.text(path, timeout))

    def stop(self, timeout=30, kill=False):
        """SIGTERM, then wait; a daemon still running after `timeout` is an error, or is killed
        when `kill`."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            if not kill:
                raise
            self.proc.kill()
