"""Emulated hosts for multi-node tests: network namespaces joined by a veth pair.

Each host is a network namespace with its own loopback and one veth end holding a private
address; a process runs "on" a host under ``ip netns exec`` plus a UTS namespace, so it also
has its own hostname. Nothing is added to the root namespace: the veth pair is created
directly inside the two namespaces, and deleting the namespaces deletes it. Needs root and
iproute2; callers skip otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Host:
    netns: str
    ifname: str
    address: str
    hostname: str

    def command(
        self, argv: list[str], *, hostname: str | None = None, hosts_file: str | os.PathLike[str] | None = None
    ) -> list[str]:
        """``argv`` run on this host, with its own hostname (``hostname``: another one, as a pod
        has its pod's name). ``hosts_file``: the test's own file, bind-mounted over /etc/hosts in
        a mount namespace of this process alone, so names resolve as the test says, when it
        says (the file can be rewritten in place while the process runs; glibc reads it at
        every lookup)."""
        name = hostname or self.hostname
        if hosts_file is not None:
            script = 'mount --bind "$1" /etc/hosts && hostname "$0" && shift && exec "$@"'
            unshare = ["unshare", "--uts", "--mount", "--propagation", "private"]
            return ["ip", "netns", "exec", self.netns, *unshare, "sh", "-c", script, name, str(hosts_file), *argv]
        script = 'hostname "$0" && exec "$@"'
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c", script, name, *argv]


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "emulated hosts need root (ip netns)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"emulated hosts need `{tool}` (Debian: iproute2, util-linux)"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def create_pair(tag: str, subnet: str = "10.213.7") -> tuple[Host, Host]:
    a = Host(f"{tag}a", f"{tag}-va", f"{subnet}.1", f"{tag}-host-a")
    b = Host(f"{tag}b", f"{tag}-vb", f"{subnet}.2", f"{tag}-host-b")
    destroy_pair((a, b))
    for host in (a, b):
        _ip("netns", "add", host.netns)
        _ip("-n", host.netns, "link", "set", "lo", "up")
    _ip("link", "add", a.ifname, "netns", a.netns, "type", "veth", "peer", "name", b.ifname, "netns", b.netns)
    for host in (a, b):
        _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.ifname)
        _ip("-n", host.netns, "link", "set", host.ifname, "up")
    return a, b


def destroy_pair(hosts) -> None:
    for host in hosts:
        subprocess.run(["ip", "netns", "del", host.netns], capture_output=True, timeout=30)
