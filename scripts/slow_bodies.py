"""What slow bodies make the demo server hold: the resident memory it grows by when
CONNECTIONS clients each send a head saying `Content-Length: 65000`, then a few bytes
(`few`) or nearly all of it (`most`), and hold the body unfinished, each with a key of its
own, then all with one key (at most BODY_READING_PER_KEY, 16, are read; the others are
answered 429 at once). The demo cuts a body off at its deadline (10 s); the figures are
taken before that.

    cargo build --release --example server
    python3 scripts/slow_bodies.py target/release/examples/server [CONNECTIONS]
"""

import os
import resource
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from batch_flood import Server  # noqa: E402

HEAD = (b"POST /echo HTTP/1.1\r\nHost: demo\r\nContent-Type: application/json\r\n"
        b"x-api-key: k{i}\r\nContent-Length: 65000\r\n\r\n")


def resident_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def hold(port, connections, sent, keys):
    """`connections` sockets, each a head and `sent` bytes of its body, left open, with
    `keys` keys among them."""
    held = []
    for i in range(connections):
        sock = socket.create_connection(("127.0.0.1", port))
        key = str(i % keys).encode()
        try:
            sock.sendall(HEAD.replace(b"{i}", key) + b"{\"n\":" + b" " * (sent - 5))
        except OSError:
            pass  # answered and closed at once (429 bodies_in_flight)
        held.append(sock)
    return held


def main():
    binary = sys.argv[1]
    connections = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    env = {"BODY_COST": "/n", "RATE_LIMIT": "1000000/min", "KEY": "header:x-api-key"}
    print(f"{connections} unfinished bodies of 65,000 bytes declared, held open:")
    rows = [("few", 6, connections), ("most", 60_000, connections), ("one key", 60_000, 1)]
    for name, sent, keys in rows:
        server = Server(binary, env)
        try:
            time.sleep(0.5)
            idle = resident_kib(server.proc.pid)
            held = hold(server.port, connections, sent, keys)
            time.sleep(2)
            grown = resident_kib(server.proc.pid) - idle
            print(f"  {name:7} ({sent:>6} bytes sent each): {grown / 1024:7.1f} MiB above idle,"
                  f" {grown * 1024 / connections / 1000:6.1f} KB a connection")
            for sock in held:
                sock.close()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
