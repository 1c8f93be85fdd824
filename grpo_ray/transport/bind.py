"""Sockets of our own process groups that listen only on the address the processes meet at.

torch's TCPStore server listens on every interface ("::") whatever host it is given, and gloo's
default device on the address this machine's hostname resolves to. A laptop Ray bound to
127.0.0.1 (cluster/session.py) would still put the learners' rendezvous and the weight broadcast
on the network; on a cluster node they need the node's own address, not every interface.
Ray-free: the learner and rollout actors call these with the address the driver gave them.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket

import psutil
import torch.distributed as dist


def tcp_store(host: str, port: int, world_size: int, is_master: bool, timeout: datetime.timedelta) -> dist.TCPStore:
    """A TCPStore whose server (rank 0's) listens on `host` only."""
    if not is_master:
        return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(max(world_size, 128))
    # The store takes the socket over; detached, Python never closes it under the store.
    return dist.TCPStore(host, port, world_size, is_master=True, timeout=timeout, master_listen_fd=listener.detach())


def local_address(peer: str) -> str:
    """This machine's address on the route to `peer` (127.0.0.1 for a loopback peer). A UDP
    socket's connect() only picks the route: nothing is sent."""
    family = socket.AF_INET6 if ipaddress.ip_address(peer).version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((peer, 9))
        return str(probe.getsockname()[0])


def gloo_options(peer: str, timeout: datetime.timedelta) -> dist.ProcessGroupGloo._Options:
    """Options of a ProcessGroupGloo whose device listens on this machine's address towards `peer`
    (the group's rendezvous host)."""
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=local_address(peer))]
    options._timeout = timeout
    return options


def pin_default_gloo_interface(peer: str) -> None:
    """Make the groups init_process_group builds (DeepSpeed's) listen on the interface towards
    `peer`: they take no device, only GLOO_SOCKET_IFNAME. A user's own GLOO_SOCKET_IFNAME wins."""
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return
    here = local_address(peer)
    for name, addresses in psutil.net_if_addrs().items():
        if any(address.address.split("%")[0] == here for address in addresses):
            os.environ["GLOO_SOCKET_IFNAME"] = name
            return
