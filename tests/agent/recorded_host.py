"""A recorded server as the agent's libvirt host: the seam for topologies this machine does not have.

libvirt's test driver cannot stand for a big server: ``test:///default`` is fixed at 2 NUMA cells of
8 CPUs without SMT, and ``test:///node.xml`` gives only the node info counts, without cells. The agent
reads the host's CPUs, cores, sockets and NUMA nodes from one call, ``getCapabilities()``
(virt/host.py ``read_topology``). :class:`RecordedHost` is a test-driver connection whose
``getCapabilities()`` answers with a recorded capabilities document instead; everything else (guests,
events, metadata, pins) is the test driver's own. Hand it to the agent through ``Agent(opener=...)``.

What stays the test driver's: a pin keeps only CPUs 0-7 of its fixed CPU map (virt/apply.py
``Caps.pinnable``), so on a recorded host the agent's allocations, refusals, views and facts are what
it would decide on that server, while pins beyond CPU 7 are not written there. Real pins are tested on
real QEMU (tests/e2e/libvirt).

The recorded documents are in tests/agent/capabilities/ (README.md there says what each one is).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import libvirt

CAPABILITIES = Path(__file__).resolve().parent / "capabilities"


def capabilities(name: str) -> str:
    """A recorded capabilities document by its file name without ``.xml``."""
    return (CAPABILITIES / f"{name}.xml").read_text()


class RecordedHost:
    """A libvirt connection to ``uri`` (a test-driver URI) whose capabilities are ``xml``."""

    def __init__(self, uri: str, xml: str) -> None:
        self.conn = libvirt.open(uri)
        self.xml = xml

    def getCapabilities(self) -> str:  # noqa: N802 - libvirt's name
        return self.xml

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def opener(name: str) -> Callable[[str], RecordedHost]:
    """``Agent(opener=...)`` for the recorded server ``name``."""
    xml = capabilities(name)
    return lambda uri: RecordedHost(uri, xml)
