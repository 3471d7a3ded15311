"""The plain client bisect's driver is held against on simple servers (issue: bisect puts
any server under the load a plain client can): one thread per session, each with its own
`http.client` keep-alive connection, the same session protocol as benches/python/client.py
(the conversations, expected calls and tool results of `cargo bench --bench driver --
--dump FILE N`). All sessions start at once (C = sessions); no connection is opened
before the clock: each thread connects on its first request, as a plain script does.

Prints one JSON line: sessions/s, classes, errors and timeouts, round latency p50/p99,
peak in flight (client side).

    python threaded_client.py --url http://127.0.0.1:P/v1 --dump sessions.jsonl --sessions N [--rounds R] [--timeout S]
"""

import argparse
import http.client
import json
import socket
import threading
import time
import urllib.parse

from session_protocol import ending, feed_back, load_dump, percentile, round_body


class Run:
    def __init__(self):
        self.lock = threading.Lock()
        self.inflight = 0
        self.peak_inflight = 0
        self.requests = 0
        self.latencies = []
        self.classes = {}


def run_session(run, url, header, session, rounds, timeout):
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    path = url.path.rstrip("/") + "/chat/completions"
    messages = list(session["messages"])
    steps = session["steps"]
    step = 0
    outcome = "maxrounds"
    for _round in range(rounds):
        body = json.dumps(round_body(header, messages))
        started = time.perf_counter()
        with run.lock:
            run.inflight += 1
            run.peak_inflight = max(run.peak_inflight, run.inflight)
        try:
            connection.request("POST", path, body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            text = response.read()
            status = response.status
        except socket.timeout:
            outcome = "timeout"
            status = None
        except (http.client.HTTPException, OSError):
            outcome = "error"
            status = None
        with run.lock:
            run.inflight -= 1
            if status is not None:
                run.requests += 1
                run.latencies.append(time.perf_counter() - started)
        if status is None:
            break
        if status != 200:
            outcome = "error"
            break
        message = json.loads(text)["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        end = ending(calls, step, steps)
        if end is not None:
            outcome = end
            break
        feed_back(messages, message, calls, steps[step]["result"])
        step += 1
    connection.close()
    with run.lock:
        run.classes[outcome] = run.classes.get(outcome, 0) + 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--dump", required=True)
    parser.add_argument("--sessions", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=0, help="0: the dump's rounds")
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args()
    header, sessions = load_dump(args.dump, args.sessions)
    rounds = args.rounds or header["rounds"]
    url = urllib.parse.urlparse(args.url)
    run = Run()
    threads = [
        threading.Thread(target=run_session, args=(run, url, header, s, rounds, args.timeout)) for s in sessions
    ]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    latencies = sorted(run.latencies)
    print(
        json.dumps(
            {
                "client": "python-threads",
                "sessions": args.sessions,
                "classes": run.classes,
                "errors": run.classes.get("error", 0),
                "timeouts": run.classes.get("timeout", 0),
                "wall_s": wall,
                "sessions_per_s": args.sessions / wall if wall > 0 else 0.0,
                "requests": run.requests,
                "round_p50_ms": percentile(latencies, 0.5) * 1000.0,
                "round_p99_ms": percentile(latencies, 0.99) * 1000.0,
                "peak_inflight": run.peak_inflight,
            }
        )
    )


if __name__ == "__main__":
    main()
