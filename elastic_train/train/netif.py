"""Which network interface holds an address: the one gloo must use on a host with several.

gloo, unless told otherwise, resolves the machine's hostname and binds there; on hosts whose hostname maps to
127.0.0.1 (a common ``/etc/hosts``, and every host made by ``cluster.sim``) each rank then advertises loopback
and a process group over two hosts fails (``connectFullMesh ... remote=[127.0.0.1]``). ``GLOO_SOCKET_IFNAME``
naming the interface that holds the node's Ray address fixes it; every worker knows that address, so the engine
sets it (:func:`gloo_interface_env`) and no user has to. A value the user set wins.
"""

from __future__ import annotations

import fcntl
import socket
import struct

SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address
GLOO_ENV = "GLOO_SOCKET_IFNAME"


def interface_of(ip: str) -> str | None:
    """The name of the interface whose IPv4 address is ``ip`` (None: no such interface, or not Linux)."""
    if ip.startswith("127."):
        return _loopback()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            if socket.inet_ntoa(raw[20:24]) == ip:
                return name
    return None


def _loopback() -> str | None:
    names = [name for _, name in socket.if_nameindex()]
    return "lo" if "lo" in names else None


def gloo_interface_env(node_ip: str, environ: dict[str, str]) -> dict[str, str]:
    """What to add to ``environ`` so gloo binds to the interface holding ``node_ip``: {} when the user already
    chose one or no interface holds it."""
    if environ.get(GLOO_ENV):
        return {}
    name = interface_of(node_ip)
    return {GLOO_ENV: name} if name else {}
