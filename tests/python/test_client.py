"""flare.Client's generic calls and typed errors (the CLI makes every daemon call through it)."""
import http.server
import json
import os
import socket
import sys
import threading

import pytest
from fake_api import serving

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import flare  # noqa: E402


class Api(http.server.BaseHTTPRequestHandler):
    seen = []

    def answer(self, code, body, content_type="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        Api.seen.append(("GET", self.path, self.headers.get("X-Flare-Token"), None))
        if self.path == "/bytes":
            self.answer(200, b"\x00\x01\xff", "application/x-protobuf")
        elif self.path == "/list":
            self.answer(200, b"[1, 2]")
        elif self.path == "/html":
            self.answer(200, b"<html>", "text/html")
        elif self.path == "/api/v1/jobs/j/ranks":
            self.answer(404, b'{"error":"no such job"}')
        else:
            self.answer(400, json.dumps({"error": "bad %s" % self.path}).encode())

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Api.seen.append(("POST", self.path, self.headers.get("X-Flare-Token"), body))
        self.answer(200, json.dumps({"echo": body}).encode())

    def do_DELETE(self):
        Api.seen.append(("DELETE", self.path, self.headers.get("X-Flare-Token"), None))
        self.answer(200, b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture
def api():
    Api.seen = []
    with serving(Api) as server:
        yield "127.0.0.1:%d" % server.server_address[1]


def test_generic_calls_send_the_token_and_return_json_or_bytes(api):
    c = flare.Client(api, timeout=5, token="t0k")
    assert c.get("/list") == [1, 2]
    assert c.get_bytes("/bytes") == b"\x00\x01\xff"
    assert c.post("/p", {"a": [1]}) == {"echo": {"a": [1]}}
    assert c.delete("/d") == {}
    assert Api.seen == [("GET", "/list", "t0k", None), ("GET", "/bytes", "t0k", None),
                        ("POST", "/p", "t0k", {"a": [1]}), ("DELETE", "/d", "t0k", None)]
    # A scheme in the address is kept.
    assert flare.Client("http://" + api).get("/list") == [1, 2]
    assert flare.Client("https://host:1/").url("/x") == "https://host:1/x"


def test_errors_carry_status_and_the_daemons_words(api):
    c = flare.Client(api, timeout=5)
    with pytest.raises(flare.ApiError) as e:
        c.get("/nope")
    assert e.value.status == 400 and e.value.detail == "bad /nope"
    assert "answered 400 for /nope: bad /nope" in str(e.value)
    with pytest.raises(flare.ApiError) as e:
        c.get("/html")
    assert e.value.status == 0 and "not JSON" in str(e.value)
    with pytest.raises(flare.UnknownJob):
        c.ranks("j")
    with pytest.raises(flare.ApiError) as e:  # without a job, a 404 is an ApiError
        c.get("/api/v1/jobs/j/ranks")
    assert e.value.status == 404 and e.value.detail == "no such job"


def test_a_port_that_does_not_speak_http_is_not_http(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def garbage():
        conn, _ = listener.accept()
        conn.recv(4096)
        conn.sendall(b"\x00\x00\x12\x04\x00\x00\x00\x00\x00garbage, not HTTP/1.1\r\n\r\n")
        conn.close()

    threading.Thread(target=garbage, daemon=True).start()
    c = flare.Client("127.0.0.1:%d" % listener.getsockname()[1], timeout=5)
    with pytest.raises(flare.NotHttp) as e:
        c.get("/api/v1/jobs")
    assert isinstance(e.value, flare.DaemonUnreachable) and e.value.reason
    listener.close()
    with pytest.raises(flare.DaemonUnreachable) as e:
        flare.Client("127.0.0.1:1", timeout=5).get("/api/v1/jobs")
    assert not isinstance(e.value, flare.NotHttp) and e.value.reason
