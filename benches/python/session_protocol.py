"""What the Python bench clients (client.py, threaded_client.py) share: the dump they read
(`cargo bench --bench driver -- --dump FILE N`), the request body of a round, how a reply
without a call (or with one past the last step) ends a session, the tool results fed back,
and the percentile their reports use. Each client keeps its own transport and checks.
"""

import json


def percentile(sorted_values, q):
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 1))))
    return sorted_values[rank - 1]


def load_dump(path, count):
    """The dump's header line and its first `count` sessions (fewer if it holds fewer)."""
    with open(path, encoding="utf-8") as f:
        header = json.loads(f.readline())
        sessions = [json.loads(line) for _, line in zip(range(count), f)]
    return header, sessions


def round_body(header, messages):
    """The chat completion request of one round, as bisect's driver sends it."""
    return {
        "model": header["model"],
        "messages": messages,
        "tools": header["tools"],
        "max_tokens": header["max_tokens"],
        "temperature": header["temperature"],
        "stream": False,
    }


def ending(calls, step, steps):
    """The outcome that ends the session at this reply, or None when it goes on:
    no call is `done` after the last step and `no_tool` before it; a call past the last
    step is `extra_call`."""
    if not calls:
        return "done" if step == len(steps) else "no_tool"
    if step >= len(steps):
        return "extra_call"
    return None


def feed_back(messages, message, calls, result):
    """Appends the assistant's reply and one tool result per call to the conversation."""
    messages.append(message)
    for call in calls:
        messages.append({"role": "tool", "content": result, "tool_call_id": call.get("id", "")})
