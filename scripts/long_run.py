#!/usr/bin/env python3
"""The long run, driven: `scripts/long_run.sh` builds the demo server and calls this.

    long_run.py SERVER OUT REPORT.md
    long_run.py --report OUT REPORT.md   # the tables again from OUT's samples

Steady traffic, on each store in turn (the memory store, then Redis): the demo server with
GCRA at RATE_LIMIT=3/min per `x-key`, and wrk (one thread, 8 connections, each waiting 2 ms
between its requests) sending `GET /` with a key drawn from 50,000
(scripts/steady_keys.lua), so that some keys are limited and the same share of them is
active at any time. Every minute for LONG_RUN_MINUTES (30) it
samples the server's resident memory (VmRSS), its open sockets, its live tokio tasks
(`demo_tasks_alive` on /metrics), the store's keys (`demo_memory_store_keys`, or Redis's
DBSIZE) and, on Redis, redis-server's resident memory and clients. Flat: every sample from
the fifth minute on within 5% of their median.

Then the memory store bound to MAX_KEYS=1,000,000 with GCRA at 10/h (a key's state lasts six
minutes, so nothing is dropped as back to fresh within the run) is fed LONG_RUN_KEYS
(10,000,000) distinct keys (scripts/cold_keys.lua), in 10-second runs of wrk, sampled after
each: the keys never above the bound, and bytes per key the growth of the resident memory
from before the first request to the first sample at the bound, over its keys.

Writes the tables in Markdown to REPORT.md (BENCHMARKS.md's "Long run" section) and prints
them; the samples are kept in OUT as CSV.
"""

import csv
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

MINUTES = int(os.environ.get("LONG_RUN_MINUTES", "30"))
DISTINCT = int(os.environ.get("LONG_RUN_KEYS", "10000000"))
MAX_KEYS = 1_000_000
WARM_UP = 4  # samples before the flatness is judged


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, cond, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if cond():
                return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"long_run: {what} did not come up")


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) * 1024


def sockets(pid):
    fds = f"/proc/{pid}/fd"
    n = 0
    for fd in os.listdir(fds):
        try:
            n += os.readlink(f"{fds}/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def gauges(admin):
    text = urllib.request.urlopen(f"http://{admin}/metrics", timeout=10).read().decode()
    found = {}
    for name in ("demo_tasks_alive", "demo_memory_store_keys"):
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        found[name] = int(float(m.group(1))) if m else None
    return found


def redis_cli(port, *args):
    out = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True)
    return out.stdout.strip()


class Server:
    """The demo server on free ports, with `env` added."""

    def __init__(self, binary, env):
        self.bind = f"127.0.0.1:{free_port()}"
        self.admin = f"127.0.0.1:{free_port()}"
        inherited = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        env = {**inherited, "BIND": self.bind, "ADMIN_BIND": self.admin, **env}
        self.proc = subprocess.Popen([binary], env=env, stdout=subprocess.DEVNULL)
        wait_for("the demo server", lambda: gauges(self.admin) is not None)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)


def wrk(url, script, seconds):
    """Runs wrk; the requests it sent."""
    out = subprocess.run(
        ["wrk", "-t1", "-c8", f"-d{seconds}s", "-s", script, url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(re.search(r"(\d+) requests in", out).group(1))


def steady(binary, store, redis_port, out):
    """MINUTES of steady traffic; the samples."""
    env = {"RATE_LIMIT": "3/min", "KEY": "header:x-key"}
    if store == "redis":
        env["REDIS_URL"] = f"redis://127.0.0.1:{redis_port}"
        env["PREFIX"] = f"long-{time.time_ns()}:"
    server = Server(binary, env)
    traffic = subprocess.Popen(
        ["wrk", "-t1", "-c8", f"-d{MINUTES * 60 + 30}s", "-s", "scripts/steady_keys.lua",
         f"http://{server.bind}/"],
        stdout=subprocess.PIPE,
        text=True,
    )
    redis_pid = int(redis_cli(redis_port, "INFO", "server").split("process_id:")[1].split()[0])
    rows = []
    started = time.time()
    for minute in range(1, MINUTES + 1):
        time.sleep(max(0, started + minute * 60 - time.time()))
        # The sockets counted before /metrics is read: its own connection is not one of them.
        row = {
            "minute": minute,
            "rss_bytes": rss(server.proc.pid),
            "sockets": sockets(server.proc.pid),
        }
        g = gauges(server.admin)
        row["tasks"] = g["demo_tasks_alive"]
        if store == "memory":
            row["keys"] = g["demo_memory_store_keys"]
        else:
            row["keys"] = int(redis_cli(redis_port, "DBSIZE"))
            row["redis_rss_bytes"] = rss(redis_pid)
            row["redis_clients"] = int(
                redis_cli(redis_port, "INFO", "clients").split("connected_clients:")[1].split()[0]
            )
        rows.append(row)
        print(f"{store} {row}", file=sys.stderr, flush=True)
    summary = traffic.communicate()[0]
    server.stop()
    write(out, f"steady_{store}.csv", rows)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", summary)
    return rows, float(rate.group(1)) if rate else None


def distinct(binary, out):
    """DISTINCT keys into the memory store bound to MAX_KEYS; the samples."""
    env = {"RATE_LIMIT": "10/h", "KEY": "header:x-key", "MAX_KEYS": str(MAX_KEYS)}
    server = Server(binary, env)
    before = rss(server.proc.pid)
    # The first row is the idle server's.
    rows, sent = [{"sent": 0, "keys": 0, "rss_bytes": before}], 0
    while sent < DISTINCT:
        sent += wrk(f"http://{server.bind}/", "scripts/cold_keys.lua", 10)
        keys = gauges(server.admin)["demo_memory_store_keys"]
        rows.append({"sent": sent, "keys": keys, "rss_bytes": rss(server.proc.pid)})
        print(f"distinct {rows[-1]}", file=sys.stderr, flush=True)
    server.stop()
    write(out, "distinct_keys.csv", rows)
    return before, rows


def write(out, name, rows):
    with open(os.path.join(out, name), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


# Counts of a few (sockets, tasks, clients): one more or less is a connection opening or
# closing as it is sampled, not a trend.
SMALL_COUNTS = ("sockets", "tasks", "redis_clients")


def flat(rows, column):
    """The spread of a column after the warm-up, as a share of its median (a small count's
    spread one less)."""
    values = [r[column] for r in rows[WARM_UP:]] or [r[column] for r in rows]
    median = statistics.median(values)
    spread = max(abs(v - median) for v in values)
    if column in SMALL_COUNTS:
        spread = max(0, spread - 1)
    return spread / median if median else 0.0


def report(steadies, before, rows):
    out = []
    print = lambda text="": out.append(text)  # noqa: E731 (the report's lines, collected)
    columns = [
        ("rss_bytes", "server RSS (MiB)", lambda v: f"{v / 2**20:.1f}"),
        ("sockets", "open sockets", str),
        ("tasks", "live tasks", str),
        ("keys", "store keys", lambda v: f"{v:,}"),
        ("redis_rss_bytes", "redis-server RSS (MiB)", lambda v: f"{v / 2**20:.1f}"),
        ("redis_clients", "Redis clients", str),
    ]
    for store, (samples, rate) in steadies.items():
        present = [c for c in columns if c[0] in samples[0]]
        print(f"\n{store} store, {MINUTES} minutes of steady traffic ({rate or 0:,.0f} requests/s):\n")
        print("| minute | " + " | ".join(c[1] for c in present) + " |")
        print("|---" * (len(present) + 1) + "|")
        for r in samples:
            print(f"| {r['minute']} | " + " | ".join(c[2](r[c[0]]) for c in present) + " |")
        spreads = ", ".join(f"{c[1]} {flat(samples, c[0]) * 100:.1f}%" for c in present)
        verdict = all(flat(samples, c[0]) <= 0.05 for c in present)
        print(
            f"\nLargest distance from the median from minute {WARM_UP + 1} on: {spreads}: "
            + ("flat within 5%." if verdict else "NOT flat within 5%.")
        )
    bound = max(r["keys"] for r in rows)
    at_bound = next((r for r in rows if r["keys"] >= 0.99 * MAX_KEYS), rows[-1])
    per_key = (at_bound["rss_bytes"] - before) / at_bound["keys"]
    print(
        f"\nmemory store, MAX_KEYS={MAX_KEYS:,}, fed {rows[-1]['sent']:,} distinct keys: at "
        f"most {bound:,} keys held ({'within' if bound <= MAX_KEYS else 'PAST'} the bound); "
        f"{at_bound['keys']:,} keys after {at_bound['sent']:,} requests took "
        f"{(at_bound['rss_bytes'] - before) / 2**20:.1f} MiB more than the idle server: "
        f"{per_key:.0f} bytes per key; resident memory at the end "
        f"{rows[-1]['rss_bytes'] / 2**20:.1f} MiB."
    )
    return "\n".join(out) + "\n"


def read(out, name):
    with open(os.path.join(out, name)) as f:
        return [{k: int(v) for k, v in row.items()} for row in csv.DictReader(f)]


def main():
    binary, out, markdown = sys.argv[1], sys.argv[2], sys.argv[3]
    if binary == "--report":
        # The tables again from the samples kept in OUT (BEFORE: the idle server's RSS).
        steadies = {s: (read(out, f"steady_{s}.csv"), None) for s in ("memory", "redis")}
        rows = read(out, "distinct_keys.csv")
        before = int(os.environ.get("BEFORE", rows[0]["rss_bytes"]))
        text = report(steadies, before, [r for r in rows if r["sent"] > 0])
        sys.stdout.write(text)
        return
    os.makedirs(out, exist_ok=True)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        redis = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.DEVNULL,
        )
        try:
            wait_for("redis-server", lambda: redis_cli(port, "PING") == "PONG")
            steadies = {s: steady(binary, s, port, out) for s in ("memory", "redis")}
            before, rows = distinct(binary, out)
        finally:
            redis.terminate()
            redis.wait()
    text = report(steadies, before, rows[1:])
    os.makedirs(os.path.dirname(markdown), exist_ok=True)
    with open(markdown, "w") as f:
        f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
