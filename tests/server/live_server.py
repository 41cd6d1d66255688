"""Starts an m3serve (or scripted_server) process on a free loopback port and talks HTTP to it.

Standard library only. The server prints "listening on http://HOST:PORT" on stderr; the harness
reads the port from there, keeps draining stderr (so the pipe never fills) and waits for
/health to answer 200.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

LISTENING = re.compile(r"listening on https?://[^:]+:(\d+)")


class LiveServer:
    def __init__(self, argv, ready_timeout=180.0, wait_ready=True, env=None):
        self.argv = list(argv)
        self.log = []
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, errors="replace", env=env)
        self.port = None
        port_seen = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.log.append(line)
                m = LISTENING.search(line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                    port_seen.set()
            port_seen.set()

        self._drainer = threading.Thread(target=drain, daemon=True)
        self._drainer.start()
        if not port_seen.wait(ready_timeout) or self.port is None:
            self.kill()
            raise RuntimeError("server did not start:\n" + self.log_text())
        if wait_ready:
            self.wait_ready(ready_timeout)

    def log_text(self):
        return "".join(self.log[-200:])

    def wait_ready(self, timeout=180.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited with %s:\n%s" % (self.proc.returncode, self.log_text()))
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server not ready after %.0f s:\n%s" % (timeout, self.log_text()))

    def request(self, method, path, body=None, headers=None, timeout=120):
        """Returns (status, headers dict with lower-case names, body bytes)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            hdrs = {"Content-Type": "application/json"} if data is not None else {}
            hdrs.update(headers or {})
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def post(self, path, body, headers=None, expect=200):
        status, _, raw = self.request("POST", path, body, headers)
        if expect is not None and status != expect:
            raise AssertionError("POST %s -> %d (expected %d): %s" % (path, status, expect, raw[:2000]))
        return json.loads(raw)

    def stream(self, path, body, headers=None):
        """POST with stream=true; returns (events as dicts, saw [DONE], raw body)."""
        body = dict(body, stream=True)
        status, hdrs, raw = self.request("POST", path, body, headers)
        if status != 200:
            raise AssertionError("stream %s -> %d: %s" % (path, status, raw[:2000]))
        assert hdrs.get("content-type", "").startswith("text/event-stream"), hdrs
        return parse_sse(raw.decode()) + (raw,)

    def metrics(self):
        status, _, raw = self.request("GET", "/metrics")
        assert status == 200
        values = {}
        for line in raw.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def metric(self, name, **labels):
        """Sum of a metric's samples whose labels include `labels`."""
        total = 0.0
        for key, value in self.metrics().items():
            base = key.split("{", 1)[0]
            if base != name:
                continue
            if all('%s="%s"' % (k, v) in key for k, v in labels.items()):
                total += value
        return total

    def rss_bytes(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._drainer.join(5)
        self.proc.stderr.close()
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stderr.close()


def free_port():
    """A TCP port the kernel just handed out on loopback (free unless someone takes it meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MultiNodeServer(LiveServer):
    """`argv` (an m3serve serve command line) over `nnodes` processes on this host, as several
    hosts run it (--nnodes, --master-addr 127.0.0.1): node 0 is the server the harness talks to,
    the others follow its steps. stop() stops node 0 and returns its status once every follower
    has exited 0 (a follower that fails or lingers is an AssertionError with its log)."""

    def __init__(self, argv, nnodes, ready_timeout=180.0, **kwargs):
        self.master_port = free_port()
        nodes = ["--nnodes", str(nnodes), "--master-addr", "127.0.0.1", "--master-port", str(self.master_port)]
        self.followers = []
        for rank in range(1, nnodes):
            proc = subprocess.Popen(list(argv) + nodes + ["--node-rank", str(rank)], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
            log = []
            drainer = threading.Thread(target=lambda p=proc, l=log: l.extend(p.stderr), daemon=True)
            drainer.start()
            self.followers.append((proc, log, drainer))
        try:
            super().__init__(list(argv) + nodes + ["--node-rank", "0"], ready_timeout=ready_timeout, **kwargs)
        except Exception:
            self._kill_followers()
            raise

    def follower_logs(self):
        return "\n".join("--- node %d:\n%s" % (i + 1, "".join(log[-100:])) for i, (_, log, _) in enumerate(self.followers))

    def stop(self, sig=signal.SIGTERM, timeout=60):
        status = super().stop(sig, timeout)
        for i, (proc, log, drainer) in enumerate(self.followers):
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill_followers()
                raise AssertionError("node %d did not exit after node 0 stopped:\n%s" % (i + 1, self.follower_logs()))
            drainer.join(5)
            out = proc.stdout.read()
            proc.stdout.close()
            if proc.returncode != 0 or out:
                raise AssertionError("node %d exited %s (stdout %r):\n%s" % (i + 1, proc.returncode, out[:200],
                                                                             self.follower_logs()))
        return status

    def kill(self):
        super().kill()
        self._kill_followers()

    def _kill_followers(self):
        for proc, _, _ in self.followers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def post_all(server, path, bodies):
    """POSTs every body at the same instant (one thread each, released together); returns the
    parsed responses in order, raising AssertionError with every client error if any failed."""
    out = [None] * len(bodies)
    errors = []
    start = threading.Barrier(len(bodies))

    def one(k):
        try:
            start.wait()
            out[k] = server.post(path, bodies[k])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(k,)) for k in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return out


def parse_sse(text):
    """Splits an SSE body into JSON events; checks the framing strictly."""
    events, done = [], False
    assert text.endswith("\n\n"), "stream must end with a blank line: %r" % text[-80:]
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), "bad SSE event: %r" % block[:200]
        assert not done, "data after [DONE]"
        data = block[len("data: "):]
        if data == "[DONE]":
            done = True
            continue
        events.append(json.loads(data))
    return events, done


def open_stream(port, path, body):
    """A raw streaming request on a socket the caller can read from and close mid-stream."""
    payload = json.dumps(dict(body, stream=True)).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (path.encode(), len(payload)) + payload)
    return sock


def repo_root():
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
