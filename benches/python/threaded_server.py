"""A thread-per-connection OpenAI chat server, as simple servers really are (issue: bisect
puts any server under the load a plain client can): Python's `http.server`
ThreadingHTTPServer with HTTP/1.1 keep-alive and the standard library's default listen
backlog of 5 (`request_queue_size`), one thread per connection, at least `--delay-ms`
per reply. The replies themselves come from the zero-work mock engine (`bisect
mock-engine --port P`), which answers each round with the call the task asks for, so
sessions run their full rounds; each handler thread keeps its own connection to it.

Its own load gauge: `running` counts requests between reading the body and writing the
reply. `/metrics` serves it as `threaded_running` (and `threaded_peak_running`, the exact
peak since the last reset), so bisect's metrics poller can read it; `/peak` answers JSON
with the exact peak and the peak of a 10 ms sampler (what the issue's measurement saw),
and `/peak/reset` starts both again.

    python threaded_server.py --port P --mock http://127.0.0.1:M [--delay-ms 20] [--backlog 5]
"""

import argparse
import http.client
import http.server
import json
import threading
import time
import urllib.parse


class Gauge:
    def __init__(self):
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.sampled_peak = 0
        self.requests = 0

    def enter(self):
        with self.lock:
            self.running += 1
            self.requests += 1
            self.peak = max(self.peak, self.running)

    def leave(self):
        with self.lock:
            self.running -= 1

    def sample(self):
        with self.lock:
            self.sampled_peak = max(self.sampled_peak, self.running)

    def reset(self):
        with self.lock:
            self.peak = self.running
            self.sampled_peak = self.running
            self.requests = 0


def make_handler(gauge, mock, delay_s):
    mock_url = urllib.parse.urlparse(mock)
    local = threading.local()

    def forward(body):
        for attempt in range(2):
            connection = getattr(local, "mock", None)
            if connection is None:
                connection = http.client.HTTPConnection(mock_url.hostname, mock_url.port, timeout=30)
                local.mock = connection
            try:
                connection.request(
                    "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"}
                )
                response = connection.getresponse()
                return response.status, response.read()
            except (http.client.HTTPException, OSError):
                connection.close()
                local.mock = None
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args):
            pass

        def reply(self, status, body, content_type="application/json"):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/metrics":
                text = (
                    f"threaded_running {gauge.running}\n"
                    f"threaded_peak_running {gauge.peak}\n"
                    f"threaded_requests_total {gauge.requests}\n"
                )
                self.reply(200, text.encode(), "text/plain; version=0.0.4")
            elif self.path == "/peak":
                body = {"peak": gauge.peak, "sampled_peak_10ms": gauge.sampled_peak, "requests": gauge.requests}
                self.reply(200, json.dumps(body).encode())
            elif self.path == "/peak/reset":
                gauge.reset()
                self.reply(200, b"{}")
            elif self.path in ("/health", "/v1/models"):
                self.reply(200, b'{"status":"ok"}')
            else:
                self.reply(404, b'{"error":"not found"}')

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            started = time.monotonic()
            gauge.enter()
            try:
                status, answer = forward(body)
                left = delay_s - (time.monotonic() - started)
                if left > 0:
                    time.sleep(left)
            finally:
                gauge.leave()
            self.reply(status, answer)

    return Handler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mock", required=True, help="the zero-work mock's base URL, http://127.0.0.1:M")
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--backlog", type=int, default=5, help="listen backlog (the standard library's default: 5)")
    args = parser.parse_args()

    gauge = Gauge()

    class Server(http.server.ThreadingHTTPServer):
        request_queue_size = args.backlog
        daemon_threads = True

    server = Server(("127.0.0.1", args.port), make_handler(gauge, args.mock, args.delay_ms / 1000.0))

    def sampler():
        while True:
            gauge.sample()
            time.sleep(0.01)

    threading.Thread(target=sampler, daemon=True).start()
    print(f"listening on 127.0.0.1:{args.port} backlog {args.backlog}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
