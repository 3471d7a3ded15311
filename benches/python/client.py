"""The fair Python baseline for `bisect`'s workload driver (issue: the harness is never
the bottleneck). An asyncio + aiohttp client that runs the same session protocol as
bisect's driver against the same server: N sessions x R rounds of chat completions with
the workload's `tools`, each reply's tool call checked against the expected step (name and
arguments), the tool result fed back, closed loop at constant concurrency C (when a session
ends the next one starts). The conversations, expected calls and tool results come from
`cargo bench --bench driver -- --dump FILE N`, so both clients send the same bytes.

This is how the usual clients for this job are written (the seeds' repro agent, the
engines' multi-turn benchmarks): one event loop, one shared connection pool. Like
bisect's driver, it opens its C connections before the clock starts (one concurrent
`GET /health` each, the pool keeps them), so both clients' opening burst is requests, not
connects; `--no-warm` skips that.

Prints one JSON line per run: sessions/s, client CPU seconds per 1000 requests, round
latency and send lag (reply arrival to the same session's next request) p50/p99, achieved
peak in-flight vs target, peak RSS.

    python client.py --url http://127.0.0.1:P/v1 --dump sessions.jsonl --sessions N [--concurrency C]
"""

import argparse
import asyncio
import json
import resource
import time

import aiohttp

from session_protocol import ending, feed_back, load_dump, percentile, round_body


class Run:
    def __init__(self, header, sessions, concurrency):
        self.header = header
        self.sessions = sessions
        self.concurrency = concurrency
        self.next_index = 0
        self.inflight = 0
        self.peak_inflight = 0
        self.requests = 0
        self.latencies = []
        self.lags = []
        self.classes = {}


async def run_session(run, http, url, session):
    header = run.header
    messages = list(session["messages"])
    steps = session["steps"]
    step = 0
    replied_at = None
    outcome = "maxrounds"
    for _round in range(header["rounds"]):
        body = round_body(header, messages)
        started = time.perf_counter()
        if replied_at is not None:
            run.lags.append(started - replied_at)
        run.inflight += 1
        run.peak_inflight = max(run.peak_inflight, run.inflight)
        try:
            async with http.post(url, json=body) as response:
                text = await response.text()
                status = response.status
        except Exception:  # noqa: BLE001 - any transport failure ends the session
            run.inflight -= 1
            outcome = "error"
            break
        run.inflight -= 1
        replied_at = time.perf_counter()
        run.requests += 1
        run.latencies.append(replied_at - started)
        if status != 200:
            outcome = "error"
            break
        try:
            message = json.loads(text)["choices"][0]["message"]
        except (ValueError, KeyError, IndexError):
            outcome = "error"
            break
        calls = message.get("tool_calls") or []
        end = ending(calls, step, steps)
        if end is not None:
            outcome = end
            break
        expected = steps[step]
        call = calls[0]["function"]
        try:
            arguments = json.loads(call["arguments"])
        except ValueError:
            outcome = "bad_args"
            break
        if call["name"] != expected["name"] or arguments != expected["arguments"]:
            outcome = "wrong_args"
            break
        feed_back(messages, message, calls, expected["result"])
        step += 1
    run.classes[outcome] = run.classes.get(outcome, 0) + 1


async def slot(run, http, url, sessions):
    while True:
        index = run.next_index
        if index >= run.sessions:
            return
        run.next_index += 1
        await run_session(run, http, url, sessions[index])


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True, help="OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--dump", required=True, help="JSON lines from the driver bench's --dump")
    parser.add_argument("--sessions", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=0, help="0: all sessions at once")
    parser.add_argument("--no-warm", action="store_true", help="do not open connections before the clock")
    args = parser.parse_args()

    header, sessions = load_dump(args.dump, args.sessions)
    if len(sessions) < args.sessions:
        raise SystemExit(f"{args.dump} holds only {len(sessions)} sessions")
    concurrency = args.concurrency or args.sessions
    concurrency = min(concurrency, args.sessions)
    run = Run(header, args.sessions, concurrency)
    url = args.url.rstrip("/") + "/chat/completions"
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=90)
    timeout = aiohttp.ClientTimeout(total=120)
    cpu_before = time.process_time()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        if not args.no_warm:
            health = url.rsplit("/v1/", 1)[0] + "/health"

            async def warm():
                async with http.get(health) as response:
                    await response.read()

            await asyncio.gather(*(warm() for _ in range(concurrency)))
        started = time.perf_counter()
        await asyncio.gather(*(slot(run, http, url, sessions) for _ in range(concurrency)))
        wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_before
    latencies = sorted(run.latencies)
    lags = sorted(run.lags)
    print(
        json.dumps(
            {
                "client": "python-aiohttp",
                "sessions": args.sessions,
                "done": run.classes.get("done", 0),
                "classes": run.classes,
                "wall_s": wall,
                "sessions_per_s": args.sessions / wall if wall > 0 else 0.0,
                "requests": run.requests,
                "cpu_s_per_1000_requests": cpu * 1000.0 / max(run.requests, 1),
                "round_p50_ms": percentile(latencies, 0.50) * 1000.0,
                "round_p99_ms": percentile(latencies, 0.99) * 1000.0,
                "lag_p50_ms": percentile(lags, 0.50) * 1000.0,
                "lag_p99_ms": percentile(lags, 0.99) * 1000.0,
                "target_inflight": concurrency,
                "peak_inflight": run.peak_inflight,
                # ru_maxrss is KiB on Linux.
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
