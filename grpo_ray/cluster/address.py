"""Does a Ray cluster answer at an address: asked in seconds, before anything joins it.

`ray.init(address=...)` with no cluster there never returns: Ray's GCS client retries for good,
prints "Failed to connect to GCS at address ... within 5 seconds" every five seconds, and its C++
loop holds off Ctrl-C and SIGTERM (a user's `validate --address 127.0.0.1:6399` ran 637 s until
SIGKILL). So a run first opens a TCP connection to the address as typed (refused, unknown host or
silent: one line at once), then to the address Ray will use (it swaps a loopback host for this
machine's network address), then asks that GCS for its cluster id with a deadline, in a child
process so that Ctrl-C still ends the command meanwhile.
"""

from __future__ import annotations

import socket
import subprocess
import sys

from grpo_ray.errors import ClusterError, first_line

CONNECT_TIMEOUT_S = 3.0
# The GCS's answer: Ray's client adds about 10 s of its own retries to this deadline (11 s in all
# on this machine), so that a refused port, a silent host and a server that is no GCS each end
# within 15 s.
GCS_TIMEOUT_MS = 1000
GCS_DEADLINE_S = 14.0  # the child's whole life, Python and Ray's import included
GCS_DEFAULT_PORT = 6379
CLIENT_DEFAULT_PORT = 10001  # ray:// (Ray Client)
# Addresses that start a Ray here rather than join one.
NOT_A_CLUSTER = ("", "local")


def check_cluster_answers(address: str, named_by: str) -> None:
    """ClusterError (one line naming `named_by`, the address and what to check) unless a Ray
    cluster answers at `address` (host:port, ray://host:port, or auto)."""
    if address in NOT_A_CLUSTER:
        return
    if address == "auto":
        address = _auto_address(named_by)
        named_by = f"{named_by} auto:"  # the messages below then read "--address auto: 10.0.0.5:6379: ..."
    if address.startswith("ray://"):
        host, port = _host_port(address.removeprefix("ray://"), CLIENT_DEFAULT_PORT)
        if why := _tcp_refusal(host, port):
            raise ClusterError(
                f"{named_by} {address}: no Ray Client server answers there ({why}); start the cluster there "
                f"with `ray start --head --ray-client-server-port {port}`, or correct {named_by}"
            )
        return
    host, port = _host_port(address, GCS_DEFAULT_PORT)
    fix = f"start one there with `ray start --head --port {port}`, or correct {named_by}"
    if why := _tcp_refusal(host, port):
        raise ClusterError(f"{named_by} {address}: no Ray cluster answers there ({why}); {fix}")
    gcs = _address_ray_uses(address)
    if gcs != f"{host}:{port}" and (why := _tcp_refusal(*_host_port(gcs, port))):
        raise ClusterError(
            f"{named_by} {address}: Ray connects to {gcs} for it (this machine's network address), and "
            f"nothing answers there ({why}); start the cluster with `ray start --head --port {port}` "
            "(it listens on every interface), or give that address"
        )
    if why := _gcs_refusal(gcs):
        raise ClusterError(f"{named_by} {address}: a server answers there, but no Ray cluster's GCS ({why}); {fix}")


def _auto_address(named_by: str) -> str:
    """`auto`: the cluster `ray start` last started on this machine, as Ray finds it."""
    from ray._private.services import canonicalize_bootstrap_address

    try:
        found = canonicalize_bootstrap_address("auto")
    except ConnectionError as err:
        found, why = None, first_line(err)
    else:
        why = "no cluster recorded"
    if not found:
        raise ClusterError(
            f"{named_by} auto: no Ray cluster started on this machine ({why}); run `ray start --head` first, "
            f"or give the head's host:port"
        )
    return found


def _host_port(address: str, default_port: int) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return address.strip("[]"), default_port
    return host.strip("[]"), int(port)


def _tcp_refusal(host: str, port: int) -> str | None:
    """Why a TCP connection to host:port fails, or None when it opens."""
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return None
    except socket.gaierror:
        return f"unknown host {host}"
    except ConnectionRefusedError:
        return f"connection to port {port} refused"
    except TimeoutError:
        return f"no answer from {host}:{port} within {CONNECT_TIMEOUT_S:g} s"
    except OSError as err:
        return first_line(err)


def _address_ray_uses(address: str) -> str:
    from ray._private.services import canonicalize_bootstrap_address

    try:
        return canonicalize_bootstrap_address(address) or address
    except (ConnectionError, ValueError):
        return address


def _gcs_refusal(gcs: str) -> str | None:
    """Why the GCS at `gcs` gives no cluster id within the deadline, or None when it does.

    Asked by a child process: Ray's C++ client blocks (Ctrl-C would wait for it) and prints a warning
    line per retry, even after the question is abandoned; a child is silenced whole and killed at
    once when the command is interrupted."""
    child = subprocess.Popen(
        [sys.executable, "-c", _ASK_GCS, gcs, str(GCS_TIMEOUT_MS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        answer, _ = child.communicate(timeout=GCS_DEADLINE_S)
    except subprocess.TimeoutExpired:
        return f"no answer within {GCS_DEADLINE_S:g} s"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return (
        None if child.returncode == 0 else (answer.strip() or f"the question ended with exit code {child.returncode}")
    )


# The child's question: exit 0 when the GCS answers (or this Ray has no standalone client to ask
# with: the TCP check is then what is left), else print why and exit 1.
_ASK_GCS = """
import sys
from ray import _raylet
standalone = getattr(getattr(_raylet, "InnerGcsClient", None), "standalone", None)
if standalone is None:
    sys.exit(0)
try:
    standalone(sys.argv[1], None, int(sys.argv[2]))
except Exception as err:
    print(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__)
    sys.exit(1)
"""
