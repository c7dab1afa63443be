"""The network partition's plumbing (tests/chaos/netns.py), with real sockets across the veth.

Covered: a TCP connection from the host to a process inside the namespace carries data; after
`cut()` data sent does not arrive and the connection is not reset, nor does a new
connection open; after `heal()` the data sent during the cut arrives (TCP retransmits it); on
exit the namespace, the veth pair and the bridge are gone, also when the body raised; two
trials of the same seed at once get distinct slots (names and subnets); a victim
placement runs inside the namespace and the others on the host's address. Skipped, with the
reason, where namespaces cannot be made (not root, no iproute2).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from planaria.contract import plan
from tests.chaos import netns

pytestmark = pytest.mark.skipif(not netns.available(), reason=netns.unavailable() or "-")

# Inside the namespace: accept one connection, print the port first, echo every byte back.
ECHO = """
import socket, sys
server = socket.create_server((sys.argv[1], 0))
print(server.getsockname()[1], flush=True)
connection, _ = server.accept()
while data := connection.recv(1024):
    connection.sendall(data)
"""


@pytest.fixture
def echo() -> Iterator[tuple[netns.Net, socket.socket]]:
    with netns.partition(4242) as net:
        prefix = net.placement(plan.WorkerId(0))(plan.WorkerId(0)).prefix
        command = [*prefix, sys.executable, "-c", ECHO, net.inner_ip]
        with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as server:
            try:
                assert server.stdout is not None
                port = int(server.stdout.readline())
                with socket.create_connection((net.inner_ip, port), timeout=5.0) as client:
                    yield net, client
            finally:
                server.kill()


def test_a_cut_drops_the_traffic_without_a_reset_and_a_heal_delivers_it(
    echo: tuple[netns.Net, socket.socket],
) -> None:
    net, client = echo
    client.sendall(b"before")
    assert client.recv(16) == b"before"
    net.cut()
    client.sendall(b"during")
    client.settimeout(0.5)
    with pytest.raises(TimeoutError):
        client.recv(16)
    with pytest.raises(OSError):  # no answer to the handshake (a timeout, or no neighbour)
        socket.create_connection((net.inner_ip, 9), timeout=0.5).close()
    net.heal()
    client.settimeout(10.0)
    assert client.recv(16) == b"during"


def test_teardown_removes_the_namespace_and_its_links_also_after_an_error() -> None:
    with pytest.raises(RuntimeError, match="boom"), netns.partition(77) as net:
        assert set(net.leftovers()) == {
            f"netns {net.namespace}",
            f"link {net.bridge}",
            f"link {net.host_if}",
        }
        raise RuntimeError("boom")
    assert net.leftovers() == ()


def test_a_taken_slot_is_skipped() -> None:
    with netns.partition(500) as first, netns.partition(500) as second:
        assert (first.slot, second.slot) == (500, 501)
        assert first.namespace != second.namespace and first.host_ip != second.host_ip
    assert first.leftovers() == second.leftovers() == ()


def test_the_victim_is_placed_inside_and_the_others_on_the_hosts_address() -> None:
    net = netns.Net(slot=3)
    place = net.placement(plan.WorkerId(2))
    inside, outside = place(plan.WorkerId(2)), place(plan.WorkerId(0))
    assert (inside.host, inside.prefix[-1], inside.env) == (
        "10.213.0.14",
        "pln3",
        {"GLOO_SOCKET_IFNAME": "pln3n"},
    )
    assert (outside.host, outside.prefix, outside.env) == (
        "10.213.0.13",
        (),
        {"GLOO_SOCKET_IFNAME": "pln3b"},
    )
