"""Two emulated "nodes" on one machine, joined by a rate-limited link.

Each node is a network namespace; a veth pair joins them, with a ``tc`` token-bucket filter (``tbf``)
limiting the rate on both ends and, optionally, a ``netem`` delay. Processes started with
:meth:`EmulatedLink.command` run inside a node; traffic between two processes of the same node stays on
that namespace's loopback, traffic between nodes crosses the veth pair, whose byte counters say how much
really went over the link.

Needs root and iproute2 (``ip``, ``tc``; ``apt-get install iproute2``), and a kernel with ``sch_tbf``
(and ``sch_netem`` for a delay). Everything it creates lives in two namespaces named
``fdmlink-<pid>-<token>-<node>``: parallel runs never clash, and leftovers of a run whose process is gone
(killed with SIGKILL) are removed by the next run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from types import FrameType

PREFIX = "fdmlink"
INTERFACES = ("fdm0", "fdm1")
ADDRESSES = ("10.77.0.1", "10.77.0.2")
MTU = 1500


class LinkSetupError(RuntimeError):
    """The link could not be set up here (no root, no iproute2, a kernel without the qdisc, ...)."""


@dataclass(frozen=True)
class LinkCounters:
    """Byte counters of one end of the veth pair."""

    tx_bytes: int
    rx_bytes: int

    @property
    def total(self) -> int:
        """Bytes that crossed the link in either direction."""
        return self.tx_bytes + self.rx_bytes


def link_rate(text: str) -> float | None:
    """A link setting from the command line (``--links``): a rate in Mbit/s, or ``unlimited`` (None)."""
    if text == "unlimited":
        return None
    try:
        rate = float(text)
    except ValueError:
        rate = -1.0
    if rate <= 0:
        raise argparse.ArgumentTypeError(f"--links takes rates > 0 in Mbit/s or 'unlimited', got {text!r}")
    return rate


def link_label(rate: float | None) -> str:
    return "unlimited" if rate is None else f"{rate:g} Mbit/s"


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def _checked(argv: list[str], why: str) -> str:
    done = _run(argv)
    if done.returncode != 0:
        detail = done.stderr.strip() or done.stdout.strip()
        raise LinkSetupError(f"{why} failed: `{' '.join(argv)}`: {detail}")
    return done.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_namespaces() -> list[str]:
    """Delete namespaces of this prefix whose creating process is gone, and kill what still runs in them."""
    listing = _run(["ip", "-j", "netns", "list"])
    if listing.returncode != 0 or not listing.stdout.strip():
        return []
    removed = []
    for entry in json.loads(listing.stdout):
        name = entry["name"]
        parts = name.split("-")
        if len(parts) != 4 or parts[0] != PREFIX or not parts[1].isdigit():
            continue
        if not _pid_alive(int(parts[1])):
            for pid in _run(["ip", "netns", "pids", name]).stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)  # an orphaned rank of the dead run
            _run(["ip", "netns", "del", name])
            removed.append(name)
    return removed


def tbf_arguments(rate_mbit: float) -> list[str]:
    """``tc`` arguments of a token bucket at ``rate_mbit`` (10^6 bit/s).

    The bucket holds 1 ms of traffic (at least 4 packets), so short messages see the rate rather than a
    burst at memory speed; the queue holds 100 ms, so TCP keeps the link busy without heavy drops.
    """
    rate_bytes = rate_mbit * 1e6 / 8
    burst = max(4 * MTU, int(rate_bytes * 1e-3))
    return ["tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "100ms"]


class EmulatedLink:
    """Context manager: two namespaces joined by a veth pair limited to ``rate_mbit`` each way.

    ``rate_mbit=None`` leaves the link unlimited (veth at memory speed). ``latency_ms`` adds a one-way
    ``netem`` delay on each end. SIGINT and SIGTERM received in the main thread while the link is up
    unwind through ``__exit__``, which removes both namespaces (and with them the veth pair).
    """

    def __init__(self, rate_mbit: float | None, latency_ms: float = 0.0) -> None:
        if rate_mbit is not None and rate_mbit <= 0:
            raise ValueError(f"rate_mbit must be a positive number or None (unlimited), got {rate_mbit!r}")
        if latency_ms < 0:
            raise ValueError(f"latency_ms must be >= 0, got {latency_ms!r}")
        self.rate_mbit = rate_mbit
        self.latency_ms = latency_ms
        token = secrets.token_hex(3)
        self.namespaces = tuple(f"{PREFIX}-{os.getpid()}-{token}-{node}" for node in range(2))
        self.interfaces = INTERFACES
        self.addresses = ADDRESSES
        self._created: list[str] = []
        self._previous_handlers: dict[int, object] = {}

    def __enter__(self) -> EmulatedLink:
        self._check_prerequisites()
        remove_stale_namespaces()
        self._install_signal_handlers()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def command(self, node: int, argv: list[str]) -> list[str]:
        """``argv`` run inside node ``node``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[node], *argv]

    def counters(self, node: int = 0) -> LinkCounters:
        """Byte counters of node ``node``'s end of the link (its tx is the other end's rx)."""
        out = _checked(
            ["ip", "-n", self.namespaces[node], "-j", "-s", "link", "show", "dev", self.interfaces[node]],
            "reading the veth counters",
        )
        stats = json.loads(out)[0]["stats64"]
        return LinkCounters(tx_bytes=stats["tx"]["bytes"], rx_bytes=stats["rx"]["bytes"])

    def describe(self) -> dict[str, object]:
        """The link as recorded in benchmark results."""
        return {
            "rate_mbit": self.rate_mbit,
            "latency_ms": self.latency_ms,
            "qdisc": tbf_arguments(self.rate_mbit) if self.rate_mbit is not None else None,
            "mtu": MTU,
            "interfaces": list(self.interfaces),
            "addresses": list(self.addresses),
        }

    def close(self) -> None:
        """Delete the namespaces this link created (signals ignored meanwhile); safe to call twice."""
        for sig in self._previous_handlers:
            signal.signal(sig, signal.SIG_IGN)
        try:
            while self._created:
                _run(["ip", "netns", "del", self._created.pop()])
        finally:
            while self._previous_handlers:
                sig, handler = self._previous_handlers.popitem()
                signal.signal(sig, handler)

    def _check_prerequisites(self) -> None:
        if os.geteuid() != 0:
            raise LinkSetupError("the emulated link needs root (network namespaces, veth, tc); run as root")
        missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
        if missing:
            raise LinkSetupError(
                f"{', '.join(missing)} not found: install iproute2 (apt-get install iproute2)"
            )

    def _create(self) -> None:
        for name in self.namespaces:
            _checked(["ip", "netns", "add", name], "creating a network namespace")
            self._created.append(name)
        ns0, ns1 = self.namespaces
        if0, if1 = self.interfaces
        _checked(
            ["ip", "link", "add", if0, "netns", ns0, "mtu", str(MTU), "type", "veth",
             "peer", "name", if1, "netns", ns1, "mtu", str(MTU)],
            "creating the veth pair",
        )
        ends = zip(self.namespaces, self.interfaces, self.addresses, strict=True)
        for node, (ns, interface, address) in enumerate(ends):
            _checked(["ip", "-n", ns, "addr", "add", f"{address}/30", "dev", interface],
                     f"addressing node {node}'s veth")
            _checked(["ip", "-n", ns, "link", "set", "lo", "up"], f"bringing up node {node}'s loopback")
            _checked(["ip", "-n", ns, "link", "set", interface, "up"], f"bringing up node {node}'s veth")
            self._shape(ns, interface)

    def _shape(self, ns: str, interface: str) -> None:
        tc = ["tc", "-n", ns, "qdisc", "add", "dev", interface]
        if self.latency_ms > 0:
            done = _run([*tc, "root", "handle", "1:", "netem", "delay", f"{self.latency_ms}ms"])
            if done.returncode != 0:
                raise LinkSetupError(
                    f"cannot add a {self.latency_ms} ms delay (`tc ... netem`: {done.stderr.strip()}): "
                    "this kernel lacks sch_netem (CONFIG_NET_SCH_NETEM); rerun without a latency"
                )
            parent = ["parent", "1:1", "handle", "10:"]
        else:
            parent = ["root", "handle", "1:"]
        if self.rate_mbit is not None:
            _checked([*tc, *parent, *tbf_arguments(self.rate_mbit)], "limiting the rate (tc tbf, sch_tbf)")

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous_handlers[sig] = signal.signal(sig, _raise_on_signal)


def _raise_on_signal(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")


def read_counters(interface: str) -> LinkCounters:
    """Byte counters of ``interface`` as seen from the current namespace (for processes inside a node)."""
    stats = f"/sys/class/net/{interface}/statistics"
    with open(f"{stats}/tx_bytes") as tx, open(f"{stats}/rx_bytes") as rx:
        return LinkCounters(tx_bytes=int(tx.read()), rx_bytes=int(rx.read()))
