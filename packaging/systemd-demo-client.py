"""The HTTP side of ``packaging/systemd-demo.sh``, run inside the demo's namespaces (standard
library only): requests to Cortex on 127.0.0.1:8080 around ``systemctl reload`` and
``systemctl stop``, printing one line per fact the demo shows.

    systemd-demo-client.py chat      # two routed requests: the second one a cache hit
    systemd-demo-client.py reload    # keep-alive + streamed response across systemctl reload
    systemd-demo-client.py stop      # a streamed response in flight during systemctl stop
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time

PORT = 8080
SYSTEM = ("You are the demo assistant of a KV-cache-aware gateway; this system prompt is long "
          "enough to fill several KV blocks so that a second request finds it cached. " * 4)


def body(question: str, max_tokens: int, stream: bool = False) -> bytes:
    return json.dumps({"model": "deepseek", "max_tokens": max_tokens, "stream": stream,
                       "messages": [{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": question}]}).encode()


def post(conn: http.client.HTTPConnection, question: str, max_tokens: int = 3,
         stream: bool = False) -> http.client.HTTPResponse:
    conn.request("POST", "/v1/chat/completions", body(question, max_tokens, stream),
                 {"content-type": "application/json"})
    return conn.getresponse()


def headers(response: http.client.HTTPResponse) -> str:
    return " ".join(f"{k}={response.getheader(k)}" for k in (
        "x-cortex-assigned-worker", "x-cortex-match-mode", "x-cortex-cache-hit-tokens"))


class Stream(threading.Thread):
    """A streamed chat completion read to its end on its own connection."""

    def __init__(self, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.max_tokens = max_tokens
        self.first = threading.Event()
        self.chunks = 0
        self.done = False
        self.error: str | None = None

    def run(self) -> None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
            response = post(conn, "stream a long answer", self.max_tokens, stream=True)
            while line := response.readline():
                if line.startswith(b"data: "):
                    self.chunks += 1
                    self.first.set()
                    self.done = self.done or line.strip() == b"data: [DONE]"
            conn.close()
        except OSError as error:
            self.error = repr(error)
        finally:
            self.first.set()

    def report(self) -> str:
        return f"stream: {self.chunks} chunks, [DONE] {'seen' if self.done else 'MISSING'}" + (
            f", error {self.error}" if self.error else "")


def systemctl(*args: str) -> str:
    done = subprocess.run(["systemctl", *args], check=False, capture_output=True, text=True,
                          timeout=120)
    return (done.stdout + done.stderr).strip()


def show(*props: str) -> str:
    return systemctl("show", "cortex", *(f"-p{p}" for p in props)).replace("\n", " ")


def chat() -> None:
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
    first = post(conn, "first question")
    first.read()
    print(f"request 1: {first.status} {headers(first)}")
    for attempt in range(100):  # the holder's KV events reach Cortex asynchronously
        again = post(conn, "second question")
        again.read()
        if again.getheader("x-cortex-match-mode") == "exact_kv_events":
            break
        time.sleep(0.05)
    print(f"request 2: {again.status} {headers(again)}")


def reload() -> None:
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
    before = post(conn, "before the reload")
    before.read()
    local = conn.sock.getsockname()
    stream = Stream(max_tokens=600)
    stream.start()
    stream.first.wait(30)
    pid = show("MainPID")
    print(f"keep-alive connection from port {local[1]}: {before.status}; stream started; "
          f"`systemctl reload cortex` -> {systemctl('reload', 'cortex') or 'ok'}")
    stream.join(60)
    after = post(conn, "after the reload")
    after.read()
    print(f"after the reload: same connection (port {conn.sock.getsockname()[1]}): "
          f"{after.status}; {stream.report()}; {pid} -> {show('MainPID')}")


def stop() -> None:
    stream = Stream(max_tokens=600)
    stream.start()
    stream.first.wait(30)
    stopper = threading.Thread(target=systemctl, args=("stop", "cortex"), daemon=True)
    started = time.monotonic()
    stopper.start()
    seen = set()
    while stopper.is_alive():
        state = show("ActiveState", "SubState", "StatusText")
        if state not in seen:
            seen.add(state)
            print(f"  during stop: {state}")
        time.sleep(0.05)
    stream.join(60)
    print(f"`systemctl stop cortex` returned after {time.monotonic() - started:.1f} s; "
          f"{stream.report()}; {show('ActiveState', 'Result', 'ExecMainStatus')}")


if __name__ == "__main__":
    {"chat": chat, "reload": reload, "stop": stop}[sys.argv[1]]()
