"""A guest redefined by another writer (its manager, an admin) while the agent repairs it, on libvirt's test
driver: the agent never writes a repair decided from the older definition over the newer one.

libvirt has no conditional write: the agent reads the definition again just before writing and checks what
it wrote afterwards (virt/apply.py); a changed definition makes it decide again from a new read. The agent's
lock held by the test plays the worker that has read the guest and not yet written.
"""

from __future__ import annotations

import logging
import re

import libvirt
import pytest

from vmsched.services.policy_agent.enforce.enforcer import CHANGED_RETRIES
from vmsched.services.policy_agent.errors import DefinitionChanged
from vmsched.services.policy_agent.policy.validation import Desired
from vmsched.services.policy_agent.virt import snapshot
from tests.support.agent_driver import domain_xml, emulator_pin
from tests.support.agent_driver import conn, make_agent, state_dir  # noqa: F401 - fixtures

INACTIVE = libvirt.VIR_DOMAIN_XML_INACTIVE


def with_cputune(xml: str, tune: str) -> str:
    """``xml`` with its <cputune> (if any) replaced by ``tune``: what a manager's edit of the definition does."""
    return re.sub(r"<cputune>.*?</cputune>\s*", "", xml, flags=re.S).replace("</domain>", f"{tune}</domain>")


MANAGER_TUNE = "<cputune><vcpupin vcpu='0' cpuset='1'/><vcpupin vcpu='1' cpuset='2'/></cputune>"


class Redefining:
    """A domain whose manager redefines it right after the agent's first call of ``method`` (then forwards
    every call to the real domain)."""

    def __init__(self, dom: libvirt.virDomain, method: str, xml: str, before: bool = False, every: bool = False):
        self._dom, self._method, self._xml, self._before, self._every = dom, method, xml, before, every
        self.defines = 0

    def _define(self) -> None:
        self.defines += 1
        self._dom.connect().defineXML(self._xml.replace("</domain>", f"<description>v{self.defines}</description>"
                                                                     "</domain>") if self._every else self._xml)

    def __getattr__(self, name: str):
        attr = getattr(self._dom, name)
        if name != self._method:
            return attr

        def call(*args):
            if self._before and (self._every or not self.defines):
                self._define()
            out = attr(*args)
            if not self._before and not self.defines:
                self._define()
            return out

        return call


def test_a_define_between_the_read_and_the_repair_is_not_overwritten(conn, make_agent, caplog):  # noqa: F811
    caplog.set_level(logging.INFO)
    a = make_agent(dedicated_pool="4-7")
    with a.enforcer.lock:  # the worker has taken the guest's DEFINED event and reads it: no pins yet
        dom = conn.defineXML(domain_xml("t-edit"))
        stale = a.enforcer.read(dom)
        # its manager pins it (a define of its own) before the agent's repair is written
        conn.defineXML(with_cputune(dom.XMLDesc(INACTIVE), MANAGER_TUNE))
        a.enforcer.sync(stale, "defined")
    assert a.wait_idle()
    xml = dom.XMLDesc(INACTIVE)
    assert "<vcpupin vcpu='0' cpuset='1'/>" in xml and "<vcpupin vcpu='1' cpuset='2'/>" in xml, xml
    assert "<emulatorpin" not in xml, "the confinement decided from the older definition was written over it"
    view = a.get_policy("t-edit")
    assert view["status"] == "unmanaged" and view["desired"]["vcpus"] is None, view  # left to its manager
    assert "defined: the definition of 't-edit' changed since it was read; deciding again" in caplog.text


def test_the_applier_writes_nothing_over_a_changed_definition(conn, make_agent):  # noqa: F811
    a = make_agent(dedicated_pool="4-7")
    with a.enforcer.lock:
        dom = conn.defineXML(domain_xml("t-edit"))
        stale = a.enforcer.read(dom)
        conn.defineXML(with_cputune(dom.XMLDesc(INACTIVE), MANAGER_TUNE))
        confine = Desired({0: frozenset(range(4)), 1: frozenset(range(4))}, frozenset(range(4)), {})
        with pytest.raises(DefinitionChanged, match="changed since it was read"):
            a.enforcer.applier.verify_and_repair(dom, confine, False, True, stale.cfg)
        assert "<emulatorpin" not in dom.XMLDesc(INACTIVE)
        # without a snapshot to compare with (a request's own read), the write goes ahead as before
        a.enforcer.applier.verify_and_repair(dom, confine, False, True)
        assert emulator_pin(dom, libvirt.VIR_DOMAIN_AFFECT_CONFIG) == "0-3"


def test_a_define_landing_between_the_writes_is_seen_after_them(conn, make_agent):  # noqa: F811
    a = make_agent(dedicated_pool="4-7")
    with a.enforcer.lock:
        dom = conn.defineXML(domain_xml("t-edit"))
        snap = a.enforcer.read(dom)
        # the manager's define lands just after the agent's emulator pin is written: it sets its own
        manager = with_cputune(dom.XMLDesc(INACTIVE), "<cputune><emulatorpin cpuset='1'/></cputune>")
        racing = Redefining(dom, "pinEmulator", manager)
        confine = Desired({0: frozenset(range(4)), 1: frozenset(range(4))}, frozenset(range(4)), {})
        with pytest.raises(DefinitionChanged, match=r"changed while it was written \(now emulator 1 -> 0-3\)"):
            a.enforcer.applier.verify_and_repair(racing, confine, False, True, snap.cfg)
        assert racing.defines == 1 and emulator_pin(dom, libvirt.VIR_DOMAIN_AFFECT_CONFIG) == "1"


def test_a_definition_that_keeps_changing_is_an_error_not_a_loop(conn, make_agent):  # noqa: F811
    a = make_agent(dedicated_pool="4-7")
    with a.enforcer.lock:
        dom = conn.defineXML(domain_xml("t-edit"))
        # a writer that redefines the guest (unpinned) before every read of its definition
        racing = Redefining(dom, "XMLDesc", dom.XMLDesc(INACTIVE), before=True, every=True)
        stale = snapshot.read(a.enforcer.applier, racing, 0)
        assert a.enforcer.sync(stale, "sweep")[0] is None
        g = a.enforcer.inv.get(dom.UUIDString())
        assert g is not None and g.status == "error"
        assert f"the definition of 't-edit' changed under each of {CHANGED_RETRIES} repairs" in (g.error or "")
        assert "<emulatorpin" not in dom.XMLDesc(INACTIVE)  # nothing written
    assert a.wait_idle()
    # once the writer stops, the next sync confines it as usual
    a.enforcer.sync(a.enforcer.read(dom), "sweep")
    assert emulator_pin(dom, libvirt.VIR_DOMAIN_AFFECT_CONFIG) == "0-3"
    assert a.get_policy("t-edit")["status"] == "unmanaged"
