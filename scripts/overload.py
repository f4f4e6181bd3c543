#!/usr/bin/env python3
"""The overload benchmarks, driven: `scripts/overload.sh` builds the demo server and calls this.

    overload.py SERVER OUT.md

1. The adaptive limit. The demo server with WORK_CAPACITY=8 (GET /work?ms=20: 8 served at a
   time, 20 ms each, 400 a second at most; RATE_LIMIT=1000000/s, which never limits), with
   ADAPTIVE=gradient2, with ADAPTIVE=aimd and without either, side by side. The unloaded latency first: one client, 100
   requests one after another (median). Then 64 clients (HTTP/1.1 connections kept alive, each
   sending its next request when its last is answered; a shed one 5 ms later) for
   OVERLOAD_WARM (20) seconds, then OVERLOAD_SECONDS (30) measured: admitted requests a
   second, their p50 and p99 latency, and the latency of the shed ones.
2. The reserve. RATE_LIMIT=100/s (GCRA, one key for everyone: KEY=global) with
   PRIORITY_HEADER=x-priority RESERVE=20, on the memory store and on Redis: a flood of normal
   requests at 1,000 a second (10x the limit: 40 connections at 25 a second each) and critical
   ones at 10 a second (2 connections), for OVERLOAD_SECONDS: the share of each admitted.

Writes OUT.md (the section of BENCHMARKS.md) and prints it.
"""

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

WARM = float(os.environ.get("OVERLOAD_WARM", "20"))
SECONDS = float(os.environ.get("OVERLOAD_SECONDS", "30"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The demo server on a free port with `env`, stopped by `stop`."""

    def __init__(self, binary, env):
        self.port = free_port()
        inherited = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        env = {**inherited, "BIND": f"127.0.0.1:{self.port}", **env}
        self.proc = subprocess.Popen([binary], env=env, stdout=subprocess.DEVNULL)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        sys.exit("overload: the demo server did not come up")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


class Conn:
    """One HTTP/1.1 connection kept alive."""

    async def open(self, port):
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        return self

    async def get(self, path, headers=()):
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n{extra}\r\n".encode())
        await self.writer.drain()
        status = int((await self.reader.readline()).split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        await self.reader.readexactly(length)
        return status


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))] if values else float("nan")


async def unloaded(port):
    conn = await Conn().open(port)
    took = []
    for _ in range(100):
        started = time.perf_counter()
        assert await conn.get("/work?ms=20") == 200
        took.append(time.perf_counter() - started)
    return statistics.median(took)


async def closed_loop(port, clients, warm, seconds):
    """`clients` connections sending one request after another; what the measured part saw."""
    begin = time.perf_counter()
    start, end = begin + warm, begin + warm + seconds
    admitted, shed = [], []

    async def client():
        conn = await Conn().open(port)
        while time.perf_counter() < end:
            sent = time.perf_counter()
            status = await conn.get("/work?ms=20")
            now = time.perf_counter()
            if now >= start:
                (admitted if status == 200 else shed).append(now - sent)
            if status != 200:
                await asyncio.sleep(0.005)

    await asyncio.gather(*(client() for _ in range(clients)))
    return admitted, shed


def adaptive_rows(binary):
    rows = []
    limits = (
        ("adaptive (gradient2)", {"ADAPTIVE": "gradient2"}),
        ("adaptive (aimd)", {"ADAPTIVE": "aimd"}),
        ("none", {}),
    )
    for label, extra in limits:
        env = {"WORK_CAPACITY": "8", "RATE_LIMIT": "1000000/s", **extra}
        server = Server(binary, env)
        try:
            base = asyncio.run(unloaded(server.port))
            admitted, shed = asyncio.run(closed_loop(server.port, 64, WARM, SECONDS))
        finally:
            server.stop()
        rows.append((label, base, admitted, shed))
        print(f"{label}: {len(admitted) / SECONDS:.0f}/s", file=sys.stderr, flush=True)
    return rows


async def paced(port, rate, seconds, headers):
    """A connection sending `rate` requests a second for `seconds`; the statuses."""
    conn = await Conn().open(port)
    statuses, begin = [], time.perf_counter()
    for i in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, begin + i / rate - time.perf_counter()))
        statuses.append(await conn.get("/", headers))
    return statuses


async def flood(port, seconds):
    critical = [("x-priority", "critical")]
    normal = [paced(port, 25, seconds, ()) for _ in range(40)]
    urgent = [paced(port, 5, seconds, critical) for _ in range(2)]
    results = await asyncio.gather(*normal, *urgent)
    flat = lambda lists: [s for l in lists for s in l]
    return flat(results[:40]), flat(results[40:])


def reserve_rows(binary):
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        redis = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.DEVNULL,
        )
        try:
            time.sleep(0.5)
            for store, extra in (("memory", {}), ("redis", {"REDIS_URL": f"redis://127.0.0.1:{port}"})):
                env = {"RATE_LIMIT": "100/s", "KEY": "global", "PRIORITY_HEADER": "x-priority",
                       "RESERVE": "20", **extra}
                server = Server(binary, env)
                try:
                    normal, critical = asyncio.run(flood(server.port, SECONDS))
                finally:
                    server.stop()
                rows.append((store, normal, critical))
                print(f"reserve on {store}: {critical.count(200)}/{len(critical)} critical admitted",
                      file=sys.stderr, flush=True)
        finally:
            redis.terminate()
            redis.wait()
    return rows


def report(adaptive, reserve):
    ms = lambda s: f"{s * 1000:.1f} ms"
    lines = [
        "64 clients against `WORK_CAPACITY=8` (`GET /work?ms=20`: 400 a second at most), "
        f"{SECONDS:.0f} s measured after {WARM:.0f} s of warm-up (`scripts/overload.sh`):",
        "",
        "| limit | admitted/s | share of capacity | p50 | p99 | p99 / unloaded | shed/s | shed p99 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, base, admitted, shed in adaptive:
        rate = len(admitted) / SECONDS
        p99 = percentile(admitted, 0.99)
        shed_p99 = ms(percentile(shed, 0.99)) if shed else "none shed"
        lines.append(
            f"| {label} | {rate:.0f} | {rate / 400:.0%} | {ms(percentile(admitted, 0.5))} | "
            f"{ms(p99)} | {p99 / base:.1f}x (unloaded {ms(base)}) | {len(shed) / SECONDS:.0f} | {shed_p99} |"
        )
    lines += [
        "",
        "Goals: with the adaptive limit, p99 at most 3x the unloaded latency, at least 85% of the "
        "capacity, shed requests answered in under 5 ms.",
        "",
        "A flood of normal requests at 1,000 a second on `RATE_LIMIT=100/s` (one key for "
        "everyone) with `RESERVE=20`, and critical ones at 10 a second:",
        "",
        "| store | normal admitted | critical admitted |",
        "|---|---|---|",
    ]
    for store, normal, critical in reserve:
        lines.append(
            f"| {store} | {normal.count(200):,} of {len(normal):,} ({normal.count(200) / SECONDS:.0f}/s) | "
            f"{critical.count(200)} of {len(critical)} ({critical.count(200) / max(1, len(critical)):.0%}) |"
        )
    lines += ["", "Goal: at least 95% of the critical requests admitted."]
    return "\n".join(lines) + "\n"


def main():
    binary, out = sys.argv[1], sys.argv[2]
    text = report(adaptive_rows(binary), reserve_rows(binary))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
