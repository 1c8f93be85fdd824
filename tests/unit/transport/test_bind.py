"""Our process groups' sockets listen on the rendezvous route only, not on every interface."""

import datetime

import psutil
import torch
import torch.distributed as dist

from grpo_ray.transport.bind import gloo_options, local_address, tcp_store
from grpo_ray.transport.broadcast import free_port


def listening_here() -> set[tuple[str, int]]:
    return {
        (c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections("inet") if c.status == psutil.CONN_LISTEN
    }


def test_a_loopback_group_listens_on_loopback_only():
    timeout = datetime.timedelta(seconds=20)
    before = listening_here()
    port = free_port()
    store = tcp_store("127.0.0.1", port, 1, True, timeout)
    group = dist.ProcessGroupGloo(dist.PrefixStore("t", store), 0, 1, gloo_options("127.0.0.1", timeout))
    tensor = torch.arange(3.0)
    group.broadcast([tensor]).wait()  # the group works
    assert tensor.tolist() == [0.0, 1.0, 2.0]
    opened = listening_here() - before
    # The store's port, and gloo's own listener.
    assert ("127.0.0.1", port) in opened and len(opened) >= 2
    assert all(address == "127.0.0.1" for address, _ in opened), opened


def test_the_route_to_a_loopback_peer_is_loopback():
    assert local_address("127.0.0.1") == "127.0.0.1"
