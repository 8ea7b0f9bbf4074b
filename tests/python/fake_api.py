"""A stand-in for flared's HTTP API in the CLI and client tests: `RoutesApi` answers GETs from its
`routes` table (a dict or list is sent as JSON, a str as it is, a missing path is a 404), and
`serving(handler)` runs a handler class on a free loopback port for the length of a `with`."""
import contextlib
import http.server
import json
import threading


class RoutesApi(http.server.BaseHTTPRequestHandler):
    routes = {}

    def do_GET(self):
        body = self.routes.get(self.path)
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serving(handler):
    """The server (its address: "127.0.0.1:%d" % server.server_address[1])."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
