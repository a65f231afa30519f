"""The nodes of a Slurm test cluster of several: each a network namespace with its own address and hostname.

A bridge on this host (the controller's address) and, per node, a namespace joined to it by a veth pair.
Each node's slurmd runs inside its namespace with a hostname and ``/etc/hosts`` of its own (a private
mount namespace), so the job's processes there see a machine of their own: their own address, name and
ports, as on a real cluster. Not ``ip netns exec``: it remounts /sys and slurmd finds no cgroup
filesystem. The private ``/etc/resolv.conf`` names no server: a lookup the hosts file cannot answer
fails at once instead of waiting on a nameserver no namespace can reach (TESTBED.md).

The subnet is fixed, so one such network exists at a time: ``LOCK`` is held while it does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
from pathlib import Path

#: Held from the network's making to its removal (tests/conftest.py's ``slurm_nodes`` serial group too).
LOCK = "/tmp/jrc-slurm-nodes.lock"
SUBNET = "10.77.0"
HOST_ADDR = f"{SUBNET}.1"


def _ip(*args: str, check: bool = True) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclasses.dataclass
class NodeNetwork:
    """A bridge and one namespace per node; ``nodes`` as slurm.conf's (name, NodeAddr, NodeHostname)."""

    tag: str
    folder: Path
    nodes: list[tuple[str, str, str]]

    @property
    def bridge(self) -> str:
        return f"jrc{self.tag[:6]}br"

    def namespace(self, i: int) -> str:
        return f"jrc{self.tag}n{i}"

    def veth(self, i: int) -> str:
        return f"jrc{self.tag[:6]}v{i}"

    @classmethod
    def make(cls, folder: Path, tag: str, count: int) -> NodeNetwork:
        nodes = [(f"jrcn{tag[:4]}{i}", f"{SUBNET}.{10 + i}", f"jrcn{tag[:4]}{i}") for i in range(1, count + 1)]
        net = cls(tag, folder, nodes)
        try:
            _ip("link", "add", net.bridge, "type", "bridge")
            _ip("addr", "add", f"{HOST_ADDR}/24", "dev", net.bridge)
            _ip("link", "set", net.bridge, "up")
            hosts = f"127.0.0.1 localhost\n{HOST_ADDR} {subprocess.getoutput('hostname')}\n"
            hosts += "".join(f"{addr} {name}\n" for name, addr, _ in nodes)
            (folder / "hosts").write_text(hosts)
            (folder / "resolv.conf").write_text("options timeout:1 attempts:1\n")
            for i, (_, addr, _) in enumerate(nodes, start=1):
                ns = net.namespace(i)
                _ip("netns", "add", ns)
                _ip("link", "add", net.veth(i), "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("link", "set", net.veth(i), "master", net.bridge, "up")
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            net.remove()
            raise
        return net

    def enter(self, i: int, argv: list[str]) -> list[str]:
        """``argv`` run as node ``i`` (from 1): in its namespace, with its hostname and hosts file."""
        name = self.nodes[i - 1][2]
        inner = (
            f"mount --bind {self.folder / 'hosts'} /etc/hosts && "
            f"mount --bind {self.folder / 'resolv.conf'} /etc/resolv.conf && "
            f'hostname {name} && exec "$@"'
        )
        return ["nsenter", f"--net=/run/netns/{self.namespace(i)}", "unshare", "--uts", "--mount", "sh", "-c", inner,
                "sh", *argv]  # fmt: skip

    def remove(self) -> None:
        # The host's ends first: deleting a namespace removes its veths only later, in the background.
        for i in range(1, len(self.nodes) + 1):
            _ip("link", "del", self.veth(i), check=False)
            _ip("netns", "del", self.namespace(i), check=False)
        with contextlib.suppress(Exception):
            _ip("link", "del", self.bridge, check=False)
