"""A network partition of one worker: its own network namespace, a veth pair, a link to cut.

    with netns.partition(seed) as net:       # NetnsError when it cannot be set up
        backend = LocalBackend(..., store_host=net.host_ip, placement=net.placement(victim))
        net.cut()                            # the victim's traffic is dropped, both ways
        net.heal()                           # and flows again

The layout (`Net`), one per trial, named after a free slot (`pln<slot>`, names <= 15 chars):

    host namespace                                       namespace pln<slot>
    bridge pln<slot>b (10.213.x.y+1/30) -- veth pln<slot>h ==== veth pln<slot>n (x.y+2/30), lo

The host's address sits on a bridge whose only port is the host end of the veth pair, so
`cut()` (that port's link down) drops every packet without touching a route: the host keeps
its address and its route to the namespace, the namespace its route to the host (marked
linkdown, still used), and both sides' frames die in the veth. Nothing is reset or answered: an
open TCP connection retransmits into the void until `heal()`; a new one finds no neighbour
and fails after 3-4 s with "No route to host" (ARP unanswered), as on a pulled cable. With
the address on the veth itself a link down would remove the host's route to the namespace
and send its packets out of the default route instead.

Every other worker, and the controller's rendezvous store, use the host's address; gloo binds
where GLOO_SOCKET_IFNAME says (torch's gloo device for an interface takes its address), so the
victim's peers reach it at its namespace's address and it reaches them at the host's. Layer
copies between agents travel over the same gloo groups, gRPC to the agents over their listen
addresses: all of a worker's traffic crosses the veth.

Slots are taken by creating the namespace (`ip netns add` fails when the name exists), so
parallel trials never share one; the seed picks the first slot tried. Teardown deletes the
veth pair (both ends), the bridge and the namespace, each attempted even when another fails;
`leftovers` lists what is still there.

Needs root and iproute2 (`available`, `unavailable` says why not). Errors: `NetnsError` (an
`ip` command failed; the message has its output).
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from planaria.contract import plan
from planaria.local import launching

PREFIX = "pln"
NETWORK = ipaddress.IPv4Network("10.213.0.0/16")
SLOTS = NETWORK.num_addresses // 4  # one /30 per slot
_IP_TIMEOUT_S = 10.0


class NetnsError(RuntimeError):
    """An `ip` command failed; the message names it and what it printed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Net:
    """One trial's namespace, its links and addresses (module docstring)."""

    slot: int

    @property
    def namespace(self) -> str:
        return f"{PREFIX}{self.slot}"

    @property
    def bridge(self) -> str:
        return f"{self.namespace}b"

    @property
    def host_if(self) -> str:
        return f"{self.namespace}h"

    @property
    def inner_if(self) -> str:
        return f"{self.namespace}n"

    @property
    def host_ip(self) -> str:
        return str(NETWORK.network_address + 4 * self.slot + 1)

    @property
    def inner_ip(self) -> str:
        return str(NETWORK.network_address + 4 * self.slot + 2)

    def placement(self, victim: plan.WorkerId) -> Callable[[plan.WorkerId], launching.Placement]:
        """A LocalBackend placement: `victim` inside the namespace, the others on the host's
        address (`victim` -> `Placement`)."""
        inside = launching.Placement(
            host=self.inner_ip,
            prefix=("ip", "netns", "exec", self.namespace),
            env={"GLOO_SOCKET_IFNAME": self.inner_if},
        )
        outside = launching.Placement(host=self.host_ip, env={"GLOO_SOCKET_IFNAME": self.bridge})
        return lambda worker: inside if worker == victim else outside

    def cut(self) -> None:
        """Drop every packet between the namespace and the host, both ways."""
        _ip("link", "set", self.host_if, "down")

    def heal(self) -> None:
        """Let the packets through again."""
        _ip("link", "set", self.host_if, "up")

    def leftovers(self) -> tuple[str, ...]:
        """What of this net still exists ("netns pln7", "link pln7b"), after teardown: none."""
        found = [f"netns {self.namespace}"] if self.namespace in _namespaces() else []
        links = _links()
        found += [f"link {n}" for n in (self.bridge, self.host_if) if n in links]
        return tuple(found)


@contextlib.contextmanager
def partition(seed: int) -> Iterator[Net]:
    """A set-up `Net` in a free slot (the first tried picked by `seed`), torn down on exit."""
    net = _claim(seed)
    try:
        _build(net)
        yield net
    finally:
        _teardown(net)


def unavailable() -> str:
    """Why partitions cannot run here ("" when they can): not root, no `ip`, or a namespace
    with a veth pair and a bridge cannot be made (checked once per process)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's `ip`"
    return _probe()


def available() -> bool:
    return not unavailable()


@functools.cache
def _probe() -> str:
    try:
        with partition(os.getpid()):
            return ""
    except NetnsError as exc:
        return f"cannot set up a network namespace: {exc}"


def _claim(seed: int) -> Net:
    """Create the namespace of the first free slot from `seed` on: the creation is the claim."""
    for offset in range(SLOTS):
        net = Net(slot=(seed + offset) % SLOTS)
        done = _run("ip", "netns", "add", net.namespace)
        if done.returncode == 0:
            return net
        if "File exists" not in done.stderr:  # not taken, but refused: no slot will do
            raise NetnsError(f"`ip netns add {net.namespace}` failed: {done.stderr.strip()}")
    raise NetnsError(f"no free slot among {SLOTS} namespaces {PREFIX}N")


def _build(net: Net) -> None:
    _ip("link", "add", net.bridge, "type", "bridge")
    _ip("link", "add", net.host_if, "type", "veth", "peer", "name", net.inner_if)
    _ip("link", "set", net.inner_if, "netns", net.namespace)
    _ip("link", "set", net.host_if, "master", net.bridge)
    _ip("addr", "add", f"{net.host_ip}/30", "dev", net.bridge)
    _ip("addr", "add", f"{net.inner_ip}/30", "dev", net.inner_if, namespace=net.namespace)
    for name in (net.bridge, net.host_if):
        _ip("link", "set", name, "up")
    for name in ("lo", net.inner_if):
        _ip("link", "set", name, "up", namespace=net.namespace)


def _teardown(net: Net) -> None:
    """Delete the veth pair (both ends go together), the bridge, the namespace: each tried."""
    failures = []
    links = _links()
    for name in (net.host_if, net.bridge):
        if name in links and _run("ip", "link", "del", name).returncode != 0:
            failures.append(f"link {name}")
    if _run("ip", "netns", "del", net.namespace).returncode != 0:
        failures.append(f"netns {net.namespace}")
    if failures:
        raise NetnsError(f"could not delete {', '.join(failures)}")


def _ip(*args: str, namespace: str | None = None) -> None:
    where = ("-n", namespace) if namespace else ()
    done = _run("ip", *where, *args)
    if done.returncode != 0:
        words = " ".join(("ip", *where, *args))
        raise NetnsError(f"`{words}` failed: {done.stderr.strip() or done.returncode}")


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=_IP_TIMEOUT_S)


def _namespaces() -> set[str]:
    listed = _run("ip", "netns", "list").stdout.splitlines()
    return {line.split()[0] for line in listed if line.strip()}


def _links() -> set[str]:
    # `ip -o link` prints "7: name@peer: <FLAGS> ...", one link a line.
    listed = _run("ip", "-o", "link", "show").stdout.splitlines()
    return {line.split(": ")[1].split("@")[0] for line in listed if ": " in line}
