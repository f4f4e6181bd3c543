#!/usr/bin/env python3
"""Turns the raw output of scripts/bench.sh into the table of ratios (printed), BENCHMARKS.md
and an SVG bar chart. Standard library only.

    python3 scripts/bench_report.py RAW_DIR BENCHMARKS.md benchmarks.svg
"""

import csv
import glob
import json
import os
import re
import statistics
import sys

RAW, MD, SVG = sys.argv[1], sys.argv[2], sys.argv[3]


def kv(path):
    out = {}
    if os.path.exists(path):
        for line in open(path):
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                out[k] = v
    return out


def raw_text(name):
    path = os.path.join(RAW, name)
    return open(path).read().rstrip("\n") if os.path.exists(path) else "(not measured in this run)"


def results(name, script):
    """A section another script measures and writes (benches/results/NAME.md): kept as it is
    from the run of that script, which takes too long to be part of this one."""
    path = os.path.join("benches", "results", name)
    if not os.path.exists(path):
        return f"(not measured yet: run `{script}`)"
    return f"From the last run of `{script}`:\n\n" + open(path).read().rstrip("\n")


def runs(pattern):
    return sorted(glob.glob(os.path.join(RAW, pattern)))


def median_kv(pattern, field):
    vals = [float(kv(p)[field]) for p in runs(pattern) if field in kv(p)]
    return statistics.median(vals) if vals else None


def median_rb(pattern, column):
    """A column of redis-benchmark --csv (latencies in ms are returned in microseconds)."""
    vals = []
    for p in runs(pattern):
        rows = list(csv.DictReader(open(p)))
        if rows:
            v = float(rows[-1][column])
            vals.append(v * 1000 if column.endswith("_ms") else v)
    return statistics.median(vals) if vals else None


UNITS = {"us": 1.0, "ms": 1000.0, "s": 1e6}


def wrk(path):
    text = open(path).read()
    rps = re.search(r"Requests/sec:\s*([\d.]+)", text)
    p99 = re.search(r"^\s*99%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", text)
    total = re.search(r"(\d+) requests in", text)
    return (
        float(rps.group(1)) if rps else None,
        float(p99.group(1)) * UNITS[p99.group(2)] if p99 else None,
        int(non2xx.group(1)) if non2xx else 0,
        int(total.group(1)) if total else 0,
    )


def median_wrk(mode, index):
    vals = [wrk(p)[index] for p in runs(f"http-{mode}.*.txt")]
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def criterion_ns(name, group="criterion"):
    path = os.path.join(RAW, group, name, "new", "estimates.json")
    if not os.path.exists(path):
        return None
    return json.load(open(path))["median"]["point_estimate"]


machine = kv(os.path.join(RAW, "machine.txt"))
rows = []  # (comparison, ours label, ours, baseline label, baseline, unit, ratio, goal, verdict)


def add(comp, what, ours, base_what, base, unit, goal_op=None, goal=None, ratio=None):
    """A row; `ratio` when the benchmark measured it itself (else ours / base)."""
    if ratio is None:
        ratio = ours / base if ours is not None and base else None
    if ratio is None:
        verdict = "n/a"
    elif goal_op == ">=":
        verdict = "PASS" if ratio >= goal else "MISS"
    elif goal_op == "<=":
        verdict = "PASS" if ratio <= goal else "MISS"
    else:
        verdict = "info"
    goal_text = f"{goal_op} {goal}x" if goal_op else "-"
    rows.append((comp, what, ours, base_what, base, unit, ratio, goal_text, verdict))


# 1. Redis decisions/s, 50 concurrent.
ours_c50 = median_kv("ours_c50.*.txt", "rps")
add("1 Redis decisions/s, 50 tasks", "ours (multiplexed)", ours_c50,
    "redis-benchmark -c 50 -P 1", median_rb("rb_c50.*.csv", "rps"), "req/s", ">=", 0.9)
add("1 Redis decisions/s, 50 tasks", "ours (multiplexed)", ours_c50,
    "redis-benchmark -c 50 -P 16", median_rb("rb_p16.*.csv", "rps"), "req/s")
# 2. Latency at concurrency 1.
add("2 Redis latency p50, 1 task", "ours", median_kv("ours_c1.*.txt", "p50_us"),
    "redis-benchmark -c 1", median_rb("rb_c1.*.csv", "p50_latency_ms"), "µs", "<=", 1.3)
add("2 Redis latency p99, 1 task", "ours", median_kv("ours_c1.*.txt", "p99_us"),
    "redis-benchmark -c 1", median_rb("rb_c1.*.csv", "p99_latency_ms"), "µs")
# 3. Pool vs multiplexed.
add("3 deadpool vs multiplexed, 50 tasks", "pool of 50", median_kv("pool50.*.txt", "rps"),
    "multiplexed", ours_c50, "req/s")
# 4. HTTP, memory store.
bare = median_wrk("bare", 0)
add("4 HTTP req/s, memory store", "with layer", median_wrk("memory", 0),
    "without", bare, "req/s", ">=", 0.9)
add("4 HTTP p99, memory store", "with layer", median_wrk("memory", 1),
    "without", median_wrk("bare", 1), "µs", "<=", 1.1)
add("4 HTTP req/s vs tower_governor, both with headers", "with layer", median_wrk("memory", 0),
    "tower_governor use_headers", median_wrk("governor-headers", 0), "req/s", ">=", 1.0)
add("4 HTTP req/s vs tower_governor, no headers", "HeaderStyle::None",
    median_wrk("memory-no-headers", 0), "tower_governor", median_wrk("governor", 0), "req/s",
    ">=", 1.0)
add("4 HTTP req/s, tower_governor vs bare", "tower_governor", median_wrk("governor", 0),
    "without", bare, "req/s")
# The same request through axum in process, without sockets (time per request: lower is
# better, so the goals read <= 1.0x).
request = lambda name: criterion_ns(name, "criterion-request")
add("4 one request through axum, in process", "with layer", request("ours"),
    "bare router", request("bare"), "ns")
add("4 one request through axum, in process, both with headers", "with layer", request("ours"),
    "tower_governor use_headers", request("tower_governor_headers"), "ns", "<=", 1.0)
add("4 one request through axum, in process, no headers", "HeaderStyle::None",
    request("ours_no_headers"), "tower_governor", request("tower_governor"), "ns", "<=", 1.0)
add("4 one request through axum, in process, both with headers", "lean: no extension, AxumBody",
    request("ours_lean"), "tower_governor use_headers", request("tower_governor_headers"), "ns",
    "<=", 1.0)
add("4 one request through axum, in process, no headers", "lean, HeaderStyle::None",
    request("ours_lean_no_headers"), "tower_governor", request("tower_governor"), "ns", "<=",
    1.0)
# 5. HTTP, Redis store.
add("5 HTTP req/s, Redis store", "with layer", median_wrk("redis", 0),
    "handler doing the same FCALL", median_wrk("evalsha", 0), "req/s", ">=", 0.9)
# 6. In-memory decision cost.
add("6 in-memory decision (GCRA)", "ours check()", criterion_ns("ours_gcra"),
    "governor keyed (Key)", criterion_ns("governor_keyed_key"), "ns", "<=", 1.5)
add("6 in-memory decision (GCRA)", "ours check()", criterion_ns("ours_gcra"),
    "governor keyed (u64)", criterion_ns("governor_keyed_u64"), "ns")
# 7. Deny cache flood.
add("7 flood of a limited key", "Redis + deny cache", median_wrk("deny-redis", 0),
    "memory store", median_wrk("deny-memory", 0), "req/s", ">=", 0.9)
# 8. Per algorithm: our script against a minimal script of the same algorithm.
algos = kv(os.path.join(RAW, "algorithms.txt"))
mem = kv(os.path.join(RAW, "memory.txt"))
names = ["fixed_window", "sliding_window", "sliding_log", "token_bucket", "leaky_bucket", "gcra"]
for a in names:
    add("8 Redis server µs/call, -P 16", a, median_kv(f"script-{a}-ours.*.txt", "usec_per_call"),
        f"minimal {a} script", median_kv(f"script-{a}-minimal.*.txt", "usec_per_call"), "µs",
        "<=", 1.25)

# 9. 1, 2, 4 and 8 threads deciding on the same keys (benches/contention.rs); the goals are
# on two threads (the machine's cores), the other counts are shown.
cont = kv(os.path.join(RAW, "contention.txt"))
num = lambda d, k: float(d[k]) if k in d else None
THREADS = [1, 2, 4, 8]
for w, label, goal in [("spread", "10,000 keys", 0.9), ("hot", "one hot key", 1.0)]:
    for t in THREADS:
        add(f"9 {t} thread{'s' if t > 1 else ''}, {label}", "ours check()",
            num(cont, f"ours/{w}/{t}"), "governor keyed", num(cont, f"governor/{w}/{t}"),
            "dec/s", *((">=", goal) if t == 2 else ()))
        add(f"9 {t} thread{'s' if t > 1 else ''}, {label}", "ours check(), one lock a shard",
            num(cont, f"ours_one_lock/{w}/{t}"), "governor keyed",
            num(cont, f"governor/{w}/{t}"), "dec/s")
for t in THREADS:
    add(f"9 {t} thread{'s' if t > 1 else ''}, two policies on 10,000 keys",
        "ours check() (defaults: per-thread reads)", num(cont, f"ours/two/{t}"),
        "ours check(), one lock a shard", num(cont, f"ours_one_lock/two/{t}"), "dec/s")
# Two policies against one (each decision of two is two policies' decisions).
for w, label in [("two", "GCRA and fixed window"), ("two_gcra", "two GCRAs")]:
    for t in THREADS:
        add(f"9 {t} thread{'s' if t > 1 else ''}, {label} on 10,000 keys",
            "ours check() of both", num(cont, f"ours/{w}/{t}"),
            "ours check() of one GCRA", num(cont, f"ours/spread/{t}"), "dec/s")
# 10. Allocations per request through axum (benches/allocations.rs); the baseline is the same
# router with a layer that does nothing but hold an Arc (what Router::layer itself allocates).
allocs = kv(os.path.join(RAW, "allocations.txt"))
add("10 allocations per request", "ours, no headers, no Decision extension, axum's body",
    num(allocs, "ours_no_headers_no_extension_axum_body"), "a layer doing nothing",
    num(allocs, "identity"), "allocs", "<=", 1.0)
add("10 allocations per request", "ours, no headers, no Decision extension",
    num(allocs, "ours_no_headers_no_extension"), "a layer doing nothing",
    num(allocs, "identity"), "allocs")
add("10 allocations per request", "ours (defaults: headers, Decision extension)",
    num(allocs, "ours"), "a layer doing nothing", num(allocs, "identity"), "allocs")
add("10 allocations per request", "ours (defaults) in axum's body",
    num(allocs, "ours_axum_body"), "a layer doing nothing", num(allocs, "identity"), "allocs")
add("10 allocations per request", "tower_governor", num(allocs, "tower_governor"),
    "a layer doing nothing", num(allocs, "identity"), "allocs")
add("10 allocations per request", "a layer doing nothing", num(allocs, "identity"),
    "bare router", num(allocs, "bare"), "allocs")
# 11. Leases (Policy::lease(20)) on the Redis store.
LEASE = 20
add("11 leases, one hot key: HTTP req/s", "Redis store, lease 20", median_wrk("redis-lease", 0),
    "memory store", median_wrk("memory", 0), "req/s", ">=", 0.9)
lease_calls, lease_requests = num(machine, "lease_evalsha_calls"), num(machine, "lease_requests")
add("11 leases, one hot key: FCALLs per request", "Redis store, lease 20",
    lease_calls / lease_requests if lease_calls is not None and lease_requests else None,
    "one per lease (1/20)", 1 / LEASE, "calls", "<=", 1.2)
add("11 leases, cold keys (one request each): HTTP req/s", "lease 20",
    median_wrk("redis-cold-lease", 0), "no lease", median_wrk("redis-cold", 0), "req/s", ">=",
    0.95)
# 13. Reading request bodies (benches/bodies.rs, criterion): what the layer adds to a 1 KiB
# JSON-RPC call (with the layer, less the bare router), against what serde_json's parse of that
# body adds in a handler of the same router (axum's Json<Value>, less the bare router: the
# parse where the allocator and caches are as the layer finds them), and against serde_json's
# parse alone in a loop; a 2 KiB GraphQL query's calculated cost against apollo-parser's own
# parse of it.
body = lambda name: criterion_ns(name, "criterion-bodies")
with_layer, bare_router, parsing = body("layer_jsonrpc"), body("bare"), body("bare_parsing")
added = lambda t: t - bare_router if t is not None and bare_router is not None else None
add("13 a 1 KiB JSON-RPC call, keyed per tool", "the layer's added time", added(with_layer),
    "a handler's parse of it (Json<Value>)", added(parsing), "ns", "<=", 1.5)
add("13 a 1 KiB JSON-RPC call, keyed per tool", "the layer's added time", added(with_layer),
    "serde_json's parse alone, in a loop", body("serde_json"), "ns")
add("13 a 2 KiB GraphQL query", "its calculated cost", body("graphql_cost"),
    "apollo-parser's parse of it", body("graphql_parse"), "ns", "<=", 1.5)
# 14. WebSocket messages (benches/streams.rs): an echo over loopback, messages of 100 bytes
# written ready-made by a client that does little per message, each decided by a
# StreamLimiter (GCRA 1,000,000/s, never limiting) against the same echo without it, in
# alternating runs; the ratio is the median of each limited run's against the plain run beside
# it: per second of the server thread's CPU time (the goal: a saturated core's throughput),
# and of the wall clock (info); with Redis and leases of 20, the store's calls per message
# against one per lease.
streams = kv(os.path.join(RAW, "streams.txt"))
add("14 WebSocket echo, messages per second of the server's CPU", "each decided (memory store)",
    num(streams, "ws_memory_msgs_per_cpu_s"), "the same echo without limits",
    num(streams, "ws_plain_msgs_per_cpu_s"), "msg/s", ">=", 0.9,
    ratio=num(streams, "ws_memory_cpu_ratio"))
add("14 WebSocket echo, messages per second of the wall clock", "each decided (memory store)",
    num(streams, "ws_memory_msgs_per_s"), "the same echo without limits",
    num(streams, "ws_plain_msgs_per_s"), "msg/s", ratio=num(streams, "ws_memory_ratio"))
ws_calls, ws_messages = num(streams, "ws_lease_store_calls"), num(streams, "ws_lease_messages")
add("14 WebSocket messages on Redis, leases of 20: store calls per message", "lease 20",
    ws_calls / ws_messages if ws_calls is not None and ws_messages else None,
    "one per lease (1/20)", 1 / LEASE, "calls", "<=", 1.2)
# 15. Outbound calls (benches/egress.rs): hyper-util's client calling an axum upstream in
# process over loopback, one call after another, through an EgressLayer (GCRA 1,000,000/s,
# never limiting) against the same client without it, in alternating runs (the ratio: the
# median of each limited run's time per call against the plain run beside it); on Redis, the
# store's calls per call sent, without and with leases of 20.
egress = kv(os.path.join(RAW, "egress.txt"))
add("15 an outbound call through an EgressLayer (memory store)", "through the layer",
    num(egress, "egress_memory_us"), "the same call without it", num(egress, "egress_plain_us"),
    "µs", "<=", 1.1, ratio=num(egress, "egress_memory_ratio"))
for what, label, goal in (("redis", "no lease", 1.0), ("lease", "lease 20", None)):
    calls, sent = num(egress, f"egress_{what}_store_calls"), num(egress, f"egress_{what}_calls")
    add("15 outbound calls on Redis: store calls per call sent", label,
        calls / sent if calls is not None and sent else None, "one per call", 1.0, "calls",
        *(("<=", goal) if goal else ()))


def fmt(v, unit):
    if v is None:
        return "n/a"
    if unit == "calls":
        return f"{v:.4f}"
    if unit in ("req/s", "ns", "dec/s", "msg/s") and v >= 100:
        return f"{v:,.0f}"
    return f"{v:,.1f}"


header = ["comparison", "ours", "value", "baseline", "value", "ratio", "goal", "result"]
table = [header, ["---"] * len(header)]
for comp, what, ours, bwhat, base, unit, ratio, goal, verdict in rows:
    table.append([comp, what, f"{fmt(ours, unit)} {unit}", bwhat, f"{fmt(base, unit)} {unit}",
                  f"{ratio:.2f}x" if ratio is not None else "n/a", goal, verdict])
md_table = "\n".join("| " + " | ".join(r) + " |" for r in table)

deny_calls = machine.get("deny_redis_evalsha_calls", "n/a")
mem_rows = ["| algorithm | Redis µs/call | Redis bytes/key (MEMORY USAGE) | memory store bytes/key (RSS growth) |",
            "|---|---|---|---|"]
for a in names:
    mem_rows.append(f"| {a} | {algos.get(a + '.usec_per_call', 'n/a')} | "
                    f"{algos.get(a + '.redis_bytes_per_key', 'n/a')} | "
                    f"{mem.get(a + '.memory_bytes_per_key', 'n/a')} |")

# The chart: one bar per ratio, a line at 1.0x and a tick at the goal.
W, LABEL, BAR_H, GAP, MAXR = 760, 330, 18, 8, 2.0
scale = (W - LABEL - 60) / MAXR
chart = [r for r in rows if r[6] is not None]
H = 40 + len(chart) * (BAR_H + GAP) + 20
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
       f'font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="10" y="20" font-size="14" font-weight="bold">Ratios, ours / baseline '
       f'(same run); tick = goal</text>']
colors = {"PASS": "#2e8b57", "MISS": "#c0392b", "info": "#7f8c8d"}
for i, (comp, what, _, bwhat, _, _, ratio, goal, verdict) in enumerate(chart):
    y = 40 + i * (BAR_H + GAP)
    label = f"{comp.split(' ', 1)[1]}: vs {bwhat}"
    label = label if len(label) <= 52 else label[:51] + "…"
    label = label.replace("&", "&amp;").replace("<", "&lt;")
    svg.append(f'<text x="{LABEL - 6}" y="{y + 13}" text-anchor="end">{comp.split()[0]}. {label}</text>')
    width = min(ratio, MAXR) * scale
    svg.append(f'<rect x="{LABEL}" y="{y}" width="{width:.1f}" height="{BAR_H}" fill="{colors[verdict]}"/>')
    svg.append(f'<text x="{LABEL + width + 4:.1f}" y="{y + 13}">{ratio:.2f}x</text>')
    m = re.match(r"[<>]= ([\d.]+)x", goal)
    if m:
        gx = LABEL + float(m.group(1)) * scale
        svg.append(f'<line x1="{gx:.1f}" y1="{y - 2}" x2="{gx:.1f}" y2="{y + BAR_H + 2}" '
                   f'stroke="black" stroke-width="2"/>')
one = LABEL + scale
svg.append(f'<line x1="{one:.1f}" y1="30" x2="{one:.1f}" y2="{H - 10}" stroke="#999" '
           f'stroke-dasharray="4 3"/>')
svg.append(f'<text x="{one:.1f}" y="{H - 2}" text-anchor="middle" fill="#555">1.0x</text>')
svg.append("</svg>")
open(SVG, "w").write("\n".join(svg) + "\n")

# Decisions per second against threads (row 9), ours and governor's, both workloads.
CSVG = os.path.join(os.path.dirname(SVG) or ".", "contention.svg")
series = [(f"{who}/{w}", color, dash)
          for w, dash in [("hot", ""), ("spread", ' stroke-dasharray="6 4"')]
          for who, color in [("ours", "#1f77b4"), ("ours_one_lock", "#2ca02c"),
                             ("governor", "#ff7f0e")]]
points = {k: [num(cont, f"{k}/{t}") for t in THREADS] for k, _, _ in series}
top = max([v for vs in points.values() for v in vs if v] or [1.0])
CW, CH, L, B, T, R = 640, 330, 70, 40, 34, 170
px = lambda i: L + i * (CW - L - R) / (len(THREADS) - 1)
py = lambda v: CH - B - v / top * (CH - B - T)
c = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{CW}" height="{CH}" '
     'font-family="sans-serif" font-size="12">',
     f'<rect width="{CW}" height="{CH}" fill="white"/>',
     f'<line x1="{L}" y1="{CH - B}" x2="{CW - R}" y2="{CH - B}" stroke="#999"/>',
     f'<line x1="{L}" y1="{T}" x2="{L}" y2="{CH - B}" stroke="#999"/>',
     f'<text x="{(L + CW - R) / 2}" y="{CH - 6}" text-anchor="middle">threads</text>',
     f'<text x="{L}" y="16" text-anchor="middle">M dec/s</text>']
for i, t in enumerate(THREADS):
    c.append(f'<text x="{px(i):.1f}" y="{CH - B + 16}" text-anchor="middle">{t}</text>')
for f in [0, 0.25, 0.5, 0.75, 1]:
    c.append(f'<text x="{L - 6}" y="{py(top * f) + 4:.1f}" text-anchor="end">'
             f'{top * f / 1e6:.1f}</text>')
for n, (k, color, dash) in enumerate(series):
    pts = [(px(i), py(v)) for i, v in enumerate(points[k]) if v is not None]
    if pts:
        c.append(f'<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="'
                 + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
    ly = T + 10 + n * 18
    c.append(f'<line x1="{CW - R + 12}" y1="{ly}" x2="{CW - R + 40}" y2="{ly}" '
             f'stroke="{color}" stroke-width="2"{dash}/>')
    c.append(f'<text x="{CW - R + 46}" y="{ly + 4}">{k.replace("/", ", ")}</text>')
c.append("</svg>")
open(CSVG, "w").write("\n".join(c) + "\n")

misses = [r for r in rows if r[8] == "MISS"]
md = f"""# Benchmarks

Written by `scripts/bench.sh` (do not edit by hand; run it again). Every figure is the median
of {machine.get('runs', '?')} runs after a warm-up, next to its baseline measured in the same
run on the same machine (runs interleaved), with the same script bytes, keyspace (10,000 keys)
and concurrency. The ratio is ours / baseline.

![ratios]({os.path.basename(SVG)})

{md_table}

Row 9 as a chart: decisions per second against threads, one hot key (solid) and 10,000 keys
(dashed), ours (with its defaults, which give a layer of one GCRA a reader lock per thread
group, and with one lock a shard) and governor's. The machine has {machine.get('nproc', '?')} cores: more threads
than cores show oversubscription, and still whether a limiter's cost grows with threads.

![decisions per second against threads](contention.svg)

## Machine

| | |
|---|---|
| date | {machine.get('date', '?')} |
| cores (`nproc`) | {machine.get('nproc', '?')} |
| CPU | {machine.get('cpu', '?')} |
| Redis | {machine.get('redis', '?')} |
| rustc | {machine.get('rustc', '?')} |
| wrk | {machine.get('wrk', '?')} |
| load average before / after | {machine.get('load_before', '?')} / {machine.get('load_after', '?')} (waited {machine.get('waited_s', '?')} s for a 1-minute load ≤ 1.0) |

**Two cores share client and server.** Redis comparisons: redis-server (one thread) plus either
our driver (`benches/driver_redis.rs`, a tokio runtime with one worker thread, 50 tasks sharing
one multiplexed connection) or `redis-benchmark` (one thread, 50 connections). HTTP
comparisons: the server (`benches/driver_http.rs`, one tokio worker) plus `wrk -t1 -c32
-d{machine.get('http_seconds', '?')}s`, and redis-server for modes that use it: three
processes on two cores, so absolute numbers are low and HTTP figures are bounded by the
machine, not by the middleware alone. Other engineers' builds may share the machine; the
load average above says how busy it was.

## What is measured

1. Redis decisions/s with 50 concurrent tasks and no HTTP: `RateLimitLayer::check` on the
   Redis store against `redis-benchmark -c 50 -r 10000 FCALL <function> …` with the exact
   arguments our store sends (`{machine.get('evalsha', '?')}`, a GCRA policy at 1,000,000/s so
   every decision admits and writes), and with `-P 16` as the server's ceiling.
2. Single-decision latency at concurrency 1: our p50/p99 (client-side, per call, from a task
   on the runtime's worker thread, as a server's handlers run) against `redis-benchmark -c 1`'s.
3. The same as 1 with a deadpool pool of 50 connections instead of the multiplexed
   connection.
4. axum hello-world under wrk: with our layer (memory store, GCRA per peer IP, never limits)
   vs without it, and vs `tower_governor` (GCRA per peer IP, never limits) like for like:
   both sending their rate-limit headers (`tower_governor`'s `use_headers`), and neither
   (`HeaderStyle::None`). Also the same five routers without sockets, and ours "lean" (as a
   service that never reads the `Decision` configures it: `decision_extension(false)` and
   `body::<AxumBody>()`): one request built with
   its `ConnectInfo` and sent through the `Router` in process (criterion, `benches/peers.rs`,
   `request/*`), where the middleware's own cost per request shows without the kernel's
   networking (which dominates the wrk figures here and moves them by ±10% between runs).
5. The same with the Redis store vs a handler that sends the same `FCALL` on one
   multiplexed connection and nothing else.
6. In-memory decision cost (criterion, `benches/peers.rs`): `RateLimitLayer::check` on the
   memory store polled once, vs `governor::RateLimiter::keyed` `check_key` on the same
   10,000 keys (as our `Key` values, and as `u64`).
7. A flood of one limited key (fixed window 1/h): Redis store with the deny cache vs the memory
   store. Decision calls (`FCALL`) seen by Redis (`INFO commandstats`) during the measured runs:
   **{deny_calls}**.
8. Each algorithm's server time per call (`INFO commandstats` usec_per_call), our `FCALL`
   against a minimal script of the same algorithm (`benches/reference/`, written for this
   comparison and not used by the crate: `TIME` and the algorithm's own reads and writes for
   one policy, no blocks, no multi-policy, replying with the three integers ours replies for
   one policy: the verdict or retry time, remaining, reset), both with the same quota from
   `redis-benchmark -c 50 -P 16 -r 10000`, interleaved. Below, the same from our own client
   (50 tasks, no pipelining), and memory per key:

{chr(10).join(mem_rows)}

Redis bytes per key: `MEMORY USAGE` of one key after one admitted request. Memory store bytes
per key: growth of the process's resident memory over 200,000 keys divided by 200,000
(includes the hash map's spare capacity).
9. 1, 2, 4 and 8 threads deciding at once for a second (`benches/contention.rs`, median of
   the runs, ours and governor's alternating): `RateLimitLayer::check` on the memory store
   (with its defaults, where the layer gives its store a reader lock per thread group, and
   with one lock a shard: `MemoryStoreBuilder::per_thread_reads(false)`) against governor's
   keyed `check_key`, both GCRA of one unit a minute with a burst of
   1,000,000 (a key's state outlives the run, as governor's entries do; the hot key is denied
   once its burst is spent, by both), on the same 10,000 keys (the threads start evenly apart
   in the keyspace) and on one hot key; and two policies (the GCRA and a fixed window, or two
   GCRAs) decided together on the 10,000 keys, where the defaults give reader locks too,
   against one lock a shard and against one GCRA. The goals are on two threads.
10. Heap allocations per request through the axum router of 4, counted by a counting global
   allocator (`benches/allocations.rs`, dhat's) over 10,240 requests after 20,480 of warm-up:
   against the same router with a layer that does nothing but hold an `Arc` (as any
   configured layer does), which is what `Router::layer` allocates for any such layer. The first row is ours with no
   headers, `RateLimitLayerBuilder::decision_extension(false)` and `RateLimitLayer::body::<AxumBody>()`
   (responses in axum's own body, which axum does not box again); the second the same in the
   default body.
11. Leases (`Policy::lease(20)`, `benches/driver_http.rs`): the Redis store's router of 5 with
   leases of 20 units, one hot key (the peer's address) that is never limited, against the
   memory store's router of 4; the decision calls Redis saw (`INFO commandstats`) per request
   in those runs, against one call per lease; and cold keys, a new `x-key` header per request
   (`scripts/cold_keys.lua`), with leases of 20 against none.

12. Redis in production (`scripts/redis_memory.sh`, `scripts/tls_bench.sh`): Redis bytes per
   key after one decision on each of 100,000 keys (a quota of 100 a day, so every key lives
   through the run), ours against the minimal script of the same algorithm on the same key
   names: `MEMORY USAGE` of one key, and `used_memory` grown per key; then GCRA decisions over
   plain TCP and over TLS (rustls, a P-256 certificate) to the same servers, each listening on
   both, per topology (standalone; a cluster of three primaries with `tls-cluster yes`; the
   standalone server found through a sentinel of each kind), three rounds interleaved: 50 tasks
   on the store's connection, and one decision at a time with its p50 and p99; beside them the
   server's own ceiling, `redis-benchmark` sending our call (50 connections; one connection
   pipelining 50), and redis-server's instructions per decision (callgrind, the whole server,
   50 tasks deciding).

```text
{raw_text("redis_memory.txt")}
{raw_text("tls.txt")}
```

13. Reading request bodies (`benches/bodies.rs`, criterion): a JSON-RPC `tools/call` of
   1 KiB `POST`ed to an axum router, in process, through a layer built with `read_bodies`
   whose one policy is keyed per client and tool (`key::all((PeerIp, key::jsonrpc()))`): its
   time less the same request's through the bare router, against what a handler of the same
   router adds by parsing the call itself (axum's `Json<Value>`: serde_json into a `Value`,
   in a request, as the layer parses it), and against `serde_json::from_slice` alone in a
   loop (where the allocator's and the caches' state flatter it); and `graphql::query_cost` of a 2 KiB query (nine
   connections with variables, a fragment) against apollo-parser's parse of it, with the same
   limits. A route without a body policy is measured by `scripts/instructions.sh` (its rows
   are those of a layer without one).
14. WebSocket messages (`benches/streams.rs`): an axum echo server on loopback, on a thread
   and runtime of its own; a client on another thread opens the socket with tokio-tungstenite,
   then writes 100,000 text frames of 100 bytes ready-made, many per write, while counting
   the echoed bytes, so that it does little per message and the server is the one kept busy.
   Each message is decided by a `StreamLimiter` on the memory store (GCRA 1,000,000/s, which
   never limits), against the same echo without it: 101 runs of each, alternating (each going
   first in turn). The kernel's work on loopback, most of the echo's, moves its pace by up to a
   fifth from run to run on a shared 2-core machine, so the ratio is the median of each limited
   run's rate against the plain run beside it (the columns are the medians of the rates). The
   goal row counts messages per second of the server thread's CPU time
   (`/proc/thread-self/schedstat`), the throughput of a saturated core; the wall clock's is
   info. Then the same through the Redis store with leases of 20 units: the store's calls
   (`INFO commandstats`) per message, against one per lease.
15. Outbound calls (`benches/egress.rs`): hyper-util's client (its connections without
   Nagle's delay) calling an axum upstream in process over loopback, on a thread and runtime of
   its own, one call after another; each call through an `EgressLayer` on the memory store
   (GCRA 1,000,000/s, which never limits) against the same client without it: 31 runs of
   5,000 calls each, alternating (each going first in turn), the ratio being the median of
   each limited run's time per call against the plain run's beside it. Then through the Redis
   store, 2,000 calls without leases and 2,000 with leases of 20: the store's calls
   (`INFO commandstats`) per call sent. A call that waits for its booked time makes one look
   more before it is sent (none here: nothing waits).

## Overload: the adaptive concurrency limit and the reserve

{results("overload.md", "scripts/overload.sh")}

## Long run: 30 minutes of steady traffic, and 10 million keys

{results("long_run.md", "scripts/long_run.sh")}

## Goals missed in this run

{chr(10).join(f"- {r[0]}: {r[6]:.2f}x against a goal of {r[7]}" for r in misses) or "None."}

## Where the time goes

From `perf record` of the servers under wrk and of the criterion benchmarks (the figures
below are from such profiles, not from this run's table):

- **HTTP against the bare router.** Three processes share two cores. The layer's own work
  (the in-process rows above) makes the server a little slower per request, and that slower
  server then pays more kernel time per request for waking wrk on the other core (the
  `_raw_spin_unlock_irqrestore` of the wake-up path grew by about 0.4 to 0.7 µs per
  request). So the wrk ratios fall further than the in-process ones, and they move by ±10%
  from one run to the next.
- **Against `tower_governor`.** Our layer does three things per request that it does not,
  each of which can be turned off:
  - it puts the `Decision` in the request's extensions, one allocation
    (`decision_extension(false)`);
  - its default response body is a wrapper, which axum boxes into its own body type, one
    allocation (`body::<AxumBody>()`);
  - it counts a metric.

  Each decision hashes (policy, key) once with SipHash (governor hashes its key twice: for
  DashMap's shard, then for its table); a GCRA decision on a key already seen then takes its
  shard's read lock and makes one compare-and-swap, as governor does.
- **The in-memory decision** (callgrind of `benches/instructions.rs check`, 10,000 keys; about
  740 instructions against governor's 576):
  - SipHash of (policy, key), about 180; the table's lookup and the compare-and-swap, about
    150; GCRA's arithmetic with what it reports (remaining, reset), about 70; the clock (`quanta`,
    as governor reads it), about 40; the `Decision` (the tier's `Arc`, the outcome, moved to
    the caller through a ready future), about 100, which governor's `check_key` does not build.
    The policy set is read in place (no `arc-swap` load) until the layer is first reloaded.
  - A GCRA entry is 64 bytes (the key held inline, the policy and its definition, the packed
    state); governor's about 48. The first touch of an entry is a cache miss for both.
  - In wall-clock time the gap is wider than in instructions: a `check` moves its 80-byte
    `Decision` through four frames (about 350 loads and stores against governor's 190, counted
    by callgrind's cache simulation), and takes and drops the tier's reference count, two
    locked operations governor does not make.
- **One hot key from several threads.** Both make three atomic read-modify-writes on lines
  the threads share per decision (the shard lock's read and release, the compare-and-swap).
  A `check` makes two more on a line of its own thread (the tier's reference count, taken for
  the `Decision` and dropped with it); a request through the layer makes none when nothing
  reads its `Decision`. On this two-core virtual machine the multi-thread rows move by up to
  ±50% from one run to the next; the instruction counts (`scripts/instructions.sh`) are the
  stable figure.
- **HTTP on the Redis store.** The layer's cost, plus these per decision:
  - a tokio timer for the deadline, registered and then removed;
  - one 1 KB boxed future;
  - the key's formatting and the reply's parsing.

  All of it is amplified by the shared cores, as above.
- **Leases, one hot key.** Per request the server does what the memory store does (a hash,
  a shard's lock, a lookup), and one request in about 17 asks Redis for the next lease, whose
  client work and reply cost the server a few microseconds. The server's CPU time per request
  is about 5% above the memory store's; the rest of the gap is Redis's own CPU (about a sixth
  of a core at 2,300 calls a second, most of it waking up for each call), taken from the two
  cores wrk and the server share, which the memory store's run does not pay.
"""
open(MD, "w").write(md)

print()
print(md_table)
print()
print(f"deny cache flood: {deny_calls} decision calls (FCALL) during the measured runs")
print(f"machine: nproc={machine.get('nproc')} {machine.get('redis')} | {machine.get('rustc')} | "
      f"load before {machine.get('load_before')} after {machine.get('load_after')}")
print(f"wrote {MD} and {SVG}")
