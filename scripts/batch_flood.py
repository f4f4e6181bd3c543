#!/usr/bin/env python3
"""A single call's latency beside a flood of the largest batch allowed, driven:
`scripts/batch_flood.sh` builds the demo server and calls this.

    batch_flood.py SERVER

The demo server with JSONRPC=true (a policy per client and JSON-RPC method, POST /mcp) and a
limit that never denies (RATE_LIMIT=1000000/s), in memory and on a local 3-node Redis Cluster
the script starts. A probe client sends single `tools/call` requests one after another over
one kept-alive connection for FLOOD_SECONDS (10) and records each latency; three phases, in
one run: the probe alone, beside a flood of single calls, and beside a flood of batches of
32 calls of 8 methods (the demo's BATCH_CALLS and BATCH_KEYS bounds: the largest batch it
admits). The floods are wrk, 2 threads and 16 connections. Prints the probe's p50 and p99
and the flood's requests a second for each phase, and the p99 beside batches against the
p99 beside single calls (the same flood, each request 32 calls instead of 1).
"""

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

SECONDS = float(os.environ.get("FLOOD_SECONDS", "10"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_cluster_port():
    """A free port whose cluster bus port (10,000 above) is free and valid too."""
    while True:
        port = random.randint(20000, 50000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue


def wait_port(port, what):
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"batch_flood: {what} did not come up")


class Cluster:
    """Three Redis Cluster primaries on free ports, in a directory of their own."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="batch-flood-")
        self.ports = [free_cluster_port() for _ in range(3)]
        self.procs = []
        for port in self.ports:
            self.procs.append(subprocess.Popen(
                ["redis-server", "--port", str(port), "--cluster-enabled", "yes",
                 "--cluster-config-file", f"nodes-{port}.conf", "--save", "",
                 "--appendonly", "no", "--dir", self.dir],
                stdout=subprocess.DEVNULL))
        for port in self.ports:
            wait_port(port, "redis-server")
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        subprocess.run(["redis-cli", "--cluster", "create", *nodes, "--cluster-yes"],
                       check=True, stdout=subprocess.DEVNULL)
        deadline = time.time() + 30
        while time.time() < deadline:
            info = subprocess.run(["redis-cli", "-p", str(self.ports[0]), "cluster", "info"],
                                  capture_output=True, text=True).stdout
            if "cluster_state:ok" in info:
                return
            time.sleep(0.2)
        sys.exit("batch_flood: the cluster did not come up")

    def url(self):
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def stop(self):
        for proc in self.procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Server:
    """The demo server on a free port with `env`."""

    def __init__(self, binary, env):
        self.port = free_port()
        inherited = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        env = {**inherited, "BIND": f"127.0.0.1:{self.port}", **env}
        self.proc = subprocess.Popen([binary], env=env, stdout=subprocess.DEVNULL)
        wait_port(self.port, "the demo server")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def call(i, method, name):
    return {"jsonrpc": "2.0", "id": i, "method": method, "params": {"name": name}}


SINGLE = json.dumps(call(1, "tools/call", "search"))
BATCH = json.dumps([call(i, "tools/call", f"tool{i % 8}") for i in range(32)])
PROBE = json.dumps(call(1, "tools/call", "probe")).encode()


def probe(port, seconds):
    """Latencies in microseconds of single calls, one after another, for `seconds`."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    request = (f"POST /mcp HTTP/1.1\r\nHost: bench\r\ncontent-type: application/json\r\n"
               f"content-length: {len(PROBE)}\r\n\r\n").encode() + PROBE
    reader = sock.makefile("rb")
    seen, end = [], time.time() + seconds
    while time.time() < end:
        start = time.perf_counter()
        sock.sendall(request)
        status = int(reader.readline().split()[1])
        length = 0
        while (line := reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        reader.read(length)
        seen.append((time.perf_counter() - start) * 1e6)
        if status != 200:
            sys.exit(f"batch_flood: the probe was answered {status}")
    sock.close()
    return seen


def flood(port, body, seconds, out):
    """wrk posting `body` to /mcp for `seconds`: its requests a second into `out`."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as lua:
        lua.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n')
        lua.write(f"wrk.body = {json.dumps(body)}\n")
    result = subprocess.run(
        ["wrk", "-t2", "-c16", f"-d{int(seconds)}s", "-s", lua.name, f"http://127.0.0.1:{port}/mcp"],
        capture_output=True, text=True)
    os.unlink(lua.name)
    rate = [l for l in result.stdout.splitlines() if l.startswith("Requests/sec")]
    non2xx = [l for l in result.stdout.splitlines() if "Non-2xx" in l]
    if non2xx:
        sys.exit(f"batch_flood: the flood was refused: {non2xx[0]}")
    out.append(float(rate[0].split()[1]) if rate else 0.0)


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def phase(port, body):
    """The probe's latencies beside a flood of `body` (none: alone), and the flood's rate."""
    rate = []
    flooding = body and threading.Thread(target=flood, args=(port, body, SECONDS + 1, rate))
    if flooding:
        flooding.start()
        time.sleep(0.5)
    seen = probe(port, SECONDS)
    if flooding:
        flooding.join()
    return seen, (rate[0] if rate else 0.0)


def main():
    binary = sys.argv[1]
    env = {"JSONRPC": "true", "RATE_LIMIT": "1000000/s", "ALGORITHM": "fixed_window"}
    cluster = Cluster()
    try:
        stores = [("memory", {}), ("cluster", {"REDIS_URL": cluster.url()})]
        print(f"a single call's latency (us) beside floods ({SECONDS:.0f} s each phase):")
        for store, extra in stores:
            server = Server(binary, {**env, **extra})
            try:
                p99 = {}
                for name, body in [("alone", None), ("single calls", SINGLE),
                                   ("32-call batches", BATCH)]:
                    seen, rate = phase(server.port, body)
                    p99[name] = percentile(seen, 0.99)
                    flood_rate = f", flood {rate:,.0f} requests/s" if body else ""
                    print(f"  {store:8} {name:16} p50 {percentile(seen, 0.5):8.0f}"
                          f"  p99 {p99[name]:8.0f}{flood_rate}")
                ratio = p99["32-call batches"] / p99["single calls"]
                print(f"  {store:8} p99 beside batches / beside single calls: {ratio:.2f}x")
            finally:
                server.stop()
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
