"""The engine link with a real agent on the real libvirtd and a QEMU guest, over the real RabbitMQ.

The real agent reports libvirt's host UUID (capabilities host/uuid); without /etc/vdsm/vdsm.id that is
also what vdsm registers the host with, the engine's ``hw_id``. The fake engine (tests/support/fake_engine.py)
knows the host as E-qemu. The gateway's and the scoring service's engine links map E-qemu to the agent
(``/v1/hosts/E-qemu/facts``), and a VM defined but not started is known from the engine (its memory and
vCPUs, source "engine"); once it runs (a transient guest, as vdsm starts them), from its host's facts
(source "host facts"). Asked through XML-RPC like the engine asks.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.support.stack import Stack
from tests.support.waiting import wait_until
from tests.e2e.libvirt import helpers as h
from tests.support.fake_engine import FakeEngine
from tests.services.test_engine_link_e2e import engine, stack  # noqa: F401 - the fixtures

pytestmark = [pytest.mark.rabbitmq, pytest.mark.libvirt]


def score(stack: Stack, unit: str, host: str, vm: str) -> float | None:  # noqa: F811
    reply = stack.xmlrpc("runCostFunctions", [[unit, 1]], [host], vm, {})
    return None if reply.get("plugin_errors") else float(dict(reply["result"])[host])


def test_a_real_agent_is_mapped_and_a_vm_is_sized_by_the_engine_then_by_facts(
        env, guests, agent_factory, tmp_path: Path, rabbit_vhost: str, stack: Stack, engine: FakeEngine) -> None:  # noqa: F811
    url_file = tmp_path / "amqp-url"
    url_file.write_text(rabbit_vhost + "\n")
    url_file.chmod(0o600)
    agent_factory(host_id="hv-qemu", extra_args=("--amqp-url-file", str(url_file), "--facts-interval", "1"))
    facts = wait_until(lambda: (r := stack.get("/v1/hosts/hv-qemu/facts")).status_code == 200 and r.json(), 30, 0.2,
                       "facts of the real agent")
    host_uuid = facts["host"]["libvirt_uuid"]
    assert host_uuid and not facts["host"]["vdsm_id"]
    engine.add_host("E-qemu", host_uuid.upper(), hardware_uuid=host_uuid.upper())

    vm_id = str(uuid.uuid4())  # the engine's VM ID, libvirt's UUID once vdsm starts it
    engine.add_vm(vm_id, 96, sockets=1, cores=2)

    def mapped() -> bool:
        r = stack.get("/v1/hosts/E-qemu/facts")
        return r.status_code == 200 and r.json()["agent_host_id"] == "hv-qemu"

    wait_until(mapped, 30, 0.5, "the gateway's engine link to map E-qemu to the real agent")
    # the first ask may already have it (--engine-link-wait), or not yet while the scoring service's own
    # link maps E-qemu (host mappings never wait): either way it comes within the deadline
    wait_until(lambda: score(stack, "VmSource", "E-qemu", vm_id) == 1, 30, 0.3, "the VM's size from the engine")
    assert score(stack, "VmSize", "E-qemu", vm_id) == 96 * 10 + 2

    name = f"{h.PREFIX}link-{vm_id[:8]}"
    guests.names.append(name)  # removed at teardown
    xml = h.guest_xml(name, vcpus=2, memory_mib=96).replace("<name>", f"<uuid>{vm_id}</uuid><name>", 1)
    env.conn.createXML(xml)  # transient, as vdsm starts a VM
    wait_until(lambda: score(stack, "VmSource", "E-qemu", vm_id) == 2, 30, 0.3, "the VM's size from host facts")
    assert score(stack, "VmSize", "E-qemu", vm_id) == 96 * 10 + 2  # its balloon and vCPUs as the agent measured
    guests.destroy(name)
