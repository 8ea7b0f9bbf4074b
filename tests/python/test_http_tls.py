"""flared's HTTP API over TLS (issue 22): with --tls-cert/--tls-key (the gRPC port's options) it
serves HTTPS only; the CLI reaches it as https://HOST:PORT, verifying the certificate against
FLARE_TLS_CA, with an operator token; plain HTTP gets no answer."""
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest


@pytest.fixture
def tls_flared(build_dir, tmp_path):
    if not shutil.which("openssl"):
        pytest.skip("openssl not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out",
                    str(cert)], check=True, capture_output=True, timeout=60)
    tokens = tmp_path / "tokens"
    tokens.write_text("[operator] optok\n")
    log = open(tmp_path / "flared.log", "w+")
    proc = subprocess.Popen([os.path.join(build_dir, "bin", "flared"), "--listen", "127.0.0.1:0",
                             "--http", "127.0.0.1:0", "--db", str(tmp_path / "f.db"),
                             "--tls-cert", str(cert), "--tls-key", str(key), "--token-file",
                             str(tokens)], stdout=log, stderr=subprocess.STDOUT)
    port = None
    for _ in range(400):
        m = re.search(r"HTTP on port (\d+) \(TLS\)", open(tmp_path / "flared.log").read())
        if m:
            port = int(m.group(1))
            break
        assert proc.poll() is None, open(tmp_path / "flared.log").read()
        time.sleep(0.05)
    assert port, open(tmp_path / "flared.log").read()
    yield port, cert
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_cli_reads_flared_over_https(build_dir, tls_flared):
    port, cert = tls_flared
    env = dict(os.environ, FLARE_TLS_CA=str(cert), FLARE_TOKEN="optok")
    flare = os.path.join(build_dir, "bin", "flare")
    res = subprocess.run([flare, "status", "--daemon-http", "https://localhost:%d" % port],
                         capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    # Without the CA the certificate does not verify: a clear failure, not plaintext.
    env.pop("FLARE_TLS_CA")
    res = subprocess.run([flare, "status", "--daemon-http", "https://localhost:%d" % port],
                         capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 3, res.stdout + res.stderr
    # Plain HTTP on the HTTPS port: no HTTP answer.
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen("http://127.0.0.1:%d/healthz" % port, timeout=5).read()
