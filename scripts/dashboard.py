#!/usr/bin/env python3
"""Loads the demo server, scrapes its /metrics every second and draws the dashboard's panels.

    python3 scripts/dashboard.py PUBLIC_ADDR ADMIN_ADDR SECONDS OUT.svg

Run by scripts/dashboard.sh, which starts the server and its Redis. The load, per client
(the server limits each to 30 requests a second):

    steady    20/s all along                       (under the limit)
    ramp      0 -> 120/s over the run              (crosses the limit a quarter in)
    burst     200/s for the middle sixth           (far over it)
    scanners  8 new clients a second in the last third, 40 requests each at once
"""

import http.client
import json
import math
import sys
import threading
import time

PUBLIC, ADMIN, SECONDS, OUT = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
host, port = PUBLIC.rsplit(":", 1)
start = time.monotonic() + 1.0


counts = {}


def count(name, status):
    counts[(name, status)] = counts.get((name, status), 0) + 1


def client(name, rate_at):
    """Sends requests for `name` at `rate_at(t)` per second until the run ends."""
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    due, sent, last = 0.0, 0, start
    while True:
        now = time.monotonic()
        if now - start >= SECONDS:
            return
        if now < start:
            time.sleep(start - now)
            continue
        # Requests due: the integral of the rate so far.
        due += rate_at(now - start) * (now - last)
        last = now
        if sent >= due:
            time.sleep(0.002)
            continue
        sent += 1
        try:
            conn.request("GET", "/", headers={"x-user": name})
            response = conn.getresponse()
            response.read()
            count(name, response.status)
        except (OSError, http.client.HTTPException):
            count(name, "error")
            conn.close()
            conn = http.client.HTTPConnection(host, int(port), timeout=5)


def scanners():
    """8 new clients a second in the last third, each sending 40 requests at once."""
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    n = 0
    while time.monotonic() - start < SECONDS:
        t = time.monotonic() - start
        if t < SECONDS * 2 / 3:
            time.sleep(0.05)
            continue
        for _ in range(8):
            n += 1
            for _ in range(40):
                conn.request("GET", "/", headers={"x-user": f"scanner-{n}"})
                response = conn.getresponse()
                response.read()
                count("scanner", response.status)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - start - t)))


def steady(t):
    return 20


def ramp(t):
    return 120 * t / SECONDS


def burst(t):
    return 200 if SECONDS * 5 / 12 <= t < SECONDS * 7 / 12 else 0


def scrape():
    conn = http.client.HTTPConnection(*ADMIN.rsplit(":", 1), timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    allowed = limited = 0.0
    buckets = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name_labels, value = line.rsplit(" ", 1)
        if name_labels.startswith("ratelimit_decisions_total{"):
            if 'outcome="allowed"' in name_labels:
                allowed += float(value)
            elif 'outcome="limited"' in name_labels:
                limited += float(value)
        elif name_labels.startswith("ratelimit_store_duration_seconds_bucket{"):
            le = name_labels.split('le="', 1)[1].split('"', 1)[0]
            buckets[math.inf if le == "+Inf" else float(le)] = float(value)
    return allowed, limited, buckets


def quantile(q, deltas):
    """histogram_quantile over bucket counts (upper bound -> cumulative count)."""
    bounds = sorted(deltas)
    total = deltas[bounds[-1]] if bounds else 0
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for b in bounds:
        if deltas[b] >= rank:
            if math.isinf(b):
                return prev_bound
            return prev_bound + (b - prev_bound) * (rank - prev_count) / max(deltas[b] - prev_count, 1e-9)
        prev_bound, prev_count = b, deltas[b]
    return prev_bound


threads = [threading.Thread(target=client, args=(n, f), daemon=True)
           for n, f in [("steady", steady), ("ramp", ramp), ("burst", burst)]]
threads.append(threading.Thread(target=scanners, daemon=True))
for th in threads:
    th.start()

samples = []  # (t, allowed/s, limited/s, p50 ms, p99 ms)
prev = scrape()
prev_t = time.monotonic()
time.sleep(max(0.0, start - time.monotonic()))
while time.monotonic() - start < SECONDS:
    time.sleep(1.0 - ((time.monotonic() - start) % 1.0))
    cur = scrape()
    now = time.monotonic()
    dt = now - prev_t
    deltas = {b: cur[2].get(b, 0) - prev[2].get(b, 0) for b in cur[2]}
    p50, p99 = quantile(0.5, deltas), quantile(0.99, deltas)
    samples.append((now - start, (cur[0] - prev[0]) / dt, (cur[1] - prev[1]) / dt,
                    None if p50 is None else p50 * 1000, None if p99 is None else p99 * 1000))
    prev, prev_t = cur, now
for th in threads:
    th.join(timeout=10)

conn = http.client.HTTPConnection(*ADMIN.rsplit(":", 1), timeout=5)
conn.request("GET", "/admin/top?n=6")
top = json.loads(conn.getresponse().read())
policy = top["policies"][0]

# ----- SVG -----
W, PANEL_H, PAD, LEFT = 900, 220, 24, 56
H = 40 + 2 * (PANEL_H + PAD) + 190
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="#111217"/>',
       f'<text x="{PAD}" y="26" fill="#ccccdc" font-size="16">tower-ratelimit: the demo server on Redis, 30 requests/s per client, '
       f'{SECONDS} s of load (scraped every second)</text>']


def panel(y, title, series, unit, width=W - 2 * PAD):
    """A time-series panel at y: series = [(label, colour, [(t, v)])]."""
    x0, y0, w, h = PAD, y, width, PANEL_H
    svg.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="#181b1f" stroke="#2c3235"/>')
    svg.append(f'<text x="{x0 + 10}" y="{y0 + 18}" fill="#ccccdc" font-size="13">{title}</text>')
    values = [v for _, _, pts in series for _, v in pts if v is not None]
    top_v = max(values + [1e-9]) * 1.1
    step = 10 ** math.floor(math.log10(top_v / 4)) if top_v > 0 else 1
    for m in (1, 2, 5, 10):
        if top_v / (step * m) <= 5:
            step *= m
            break
    px0, py0, pw, ph = x0 + LEFT, y0 + 30, w - LEFT - 170, h - 52
    v = 0.0
    while v <= top_v:
        yy = py0 + ph - ph * v / top_v
        svg.append(f'<line x1="{px0}" y1="{yy:.1f}" x2="{px0 + pw}" y2="{yy:.1f}" stroke="#2c3235"/>')
        label = f"{v:g}{unit}"
        svg.append(f'<text x="{px0 - 6}" y="{yy + 4:.1f}" text-anchor="end" fill="#8e8e8e">{label}</text>')
        v += step
    for s in range(0, SECONDS + 1, 10):
        xx = px0 + pw * s / SECONDS
        svg.append(f'<text x="{xx:.1f}" y="{py0 + ph + 16}" text-anchor="middle" fill="#8e8e8e">{s}s</text>')
    for i, (label, colour, pts) in enumerate(series):
        path = " ".join(f"{px0 + pw * t / SECONDS:.1f},{py0 + ph - ph * v / top_v:.1f}"
                        for t, v in pts if v is not None)
        svg.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        ly = py0 + 14 + 20 * i
        svg.append(f'<rect x="{px0 + pw + 16}" y="{ly - 9}" width="12" height="3" fill="{colour}"/>')
        svg.append(f'<text x="{px0 + pw + 34}" y="{ly - 4}" fill="#ccccdc">{label}</text>')


y = 40
panel(y, "Decisions per second by outcome  (ratelimit_decisions_total by outcome, per second)",
      [("allowed", "#73bf69", [(t, a) for t, a, _, _, _ in samples]),
       ("limited", "#f2495c", [(t, lim) for t, _, lim, _, _ in samples])], "")
y += PANEL_H + PAD
panel(y, "Store latency  (histogram_quantile of ratelimit_store_duration_seconds_bucket, per second)",
      [("p50", "#5794f2", [(t, p) for t, _, _, p, _ in samples]),
       ("p99", "#ff9830", [(t, p) for t, _, _, _, p in samples])], " ms")
y += PANEL_H + PAD
svg.append(f'<rect x="{PAD}" y="{y}" width="{W - 2 * PAD}" height="170" fill="#181b1f" stroke="#2c3235"/>')
svg.append(f'<text x="{PAD + 10}" y="{y + 18}" fill="#ccccdc" font-size="13">Top limited keys, last minute  '
           f'(GET /admin/top: {policy["limited"]:,} requests limited by {policy["policy"]})</text>')
for i, head in enumerate(["key", "limited", "error"]):
    svg.append(f'<text x="{PAD + 20 + 220 * i}" y="{y + 42}" fill="#8e8e8e">{head}</text>')
for j, k in enumerate(policy["keys"]):
    for i, cell in enumerate([k["key"], f'{k["count"]:,}', str(k["error"])]):
        svg.append(f'<text x="{PAD + 20 + 220 * i}" y="{y + 62 + 17 * j}" fill="#ccccdc">{cell}</text>')
svg.append("</svg>")
open(OUT, "w").write("\n".join(svg) + "\n")

allowed = sum(a for _, a, _, _, _ in samples)
limited = sum(lim for _, _, lim, _, _ in samples)
print(sorted(counts.items(), key=str))
print(f"{OUT}: {len(samples)} scrapes, about {allowed:,.0f} allowed and {limited:,.0f} limited; "
      f"top: {[(k['key'], k['count']) for k in policy['keys']]}")
