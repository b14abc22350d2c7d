"""Called by start-head.sh (not meant to be run by hand): does the Redis that GCS fault tolerance will use answer,
and does it take the password? One line and exit 2 when not, within a few seconds.

    python cluster/local/_redis_check.py HOST:PORT        # the password, if any, in $RAY_REDIS_PASSWORD

Why here and not left to Ray: `ray start --head` (Ray 2.60, measured) with a Redis address that refuses retries
for a minute (``RAY_redis_db_connect_retries`` x ``RAY_redis_db_connect_wait_milliseconds``) and exits 1 after 61 s
with 216 lines ending in a C++ stack trace; with a wrong password it exits 1 after 1 s with 94 such lines. Plain
sockets and the Redis protocol (RESP): no client library needed on the head.
"""

from __future__ import annotations

import os
import socket
import sys

TIMEOUT_S = 3.0


def _command(*parts: str) -> bytes:
    """One RESP array of bulk strings."""
    out = [f"*{len(parts)}\r\n".encode()]
    for p in parts:
        b = p.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def _replies(sock: socket.socket, want: int) -> list[str]:
    """The first line of each of ``want`` replies (simple strings and errors are one line)."""
    buf = b""
    while buf.count(b"\r\n") < want:
        chunk = sock.recv(4096)
        if not chunk:
            break
        buf += chunk
    return [line.decode(errors="replace") for line in buf.split(b"\r\n")[:want]]


def check(address: str, password: str | None, timeout_s: float = TIMEOUT_S) -> str | None:
    """None when ``address`` answers PING (after AUTH with ``password``); else the one-line reason."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        return f"RAY_REDIS_ADDRESS={address!r}: want HOST:PORT (e.g. 10.0.0.5:6379)"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            commands = ([_command("AUTH", password)] if password else []) + [_command("PING")]
            sock.sendall(b"".join(commands))
            replies = _replies(sock, len(commands))
    except TimeoutError:
        return f"RAY_REDIS_ADDRESS={address}: no answer within {timeout_s:g} s (is Redis running, and reachable here?)"
    except OSError as e:
        return f"RAY_REDIS_ADDRESS={address}: {e.strerror or e} (is Redis running, and reachable here?)"
    if len(replies) < len(commands):
        return f"RAY_REDIS_ADDRESS={address}: closed the connection without an answer (is it a Redis server?)"
    if password and not replies[0].startswith("+OK"):
        return f"RAY_REDIS_PASSWORD: refused by the Redis at {address}: {replies[0].lstrip('-')}"
    if replies[-1].startswith("-NOAUTH"):
        return f"RAY_REDIS_PASSWORD: the Redis at {address} needs a password and none was given"
    if not replies[-1].startswith("+PONG"):
        return f"RAY_REDIS_ADDRESS={address}: answered {replies[-1][:80]!r} to PING, not +PONG"
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: _redis_check.py HOST:PORT", file=sys.stderr)
        return 2
    problem = check(argv[0], os.environ.get("RAY_REDIS_PASSWORD") or None)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
