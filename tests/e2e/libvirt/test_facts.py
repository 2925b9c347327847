"""Host facts from a real agent on the real libvirtd with QEMU guests, over the real RabbitMQ.

Two hosts: the real agent (``hv-qemu``) and a second agent on libvirt's test
driver (``hv-td``). Starting QEMU guests on hv-qemu is published at once
(a facts message of reason ``event``, not at the next interval) with the new
guest count and memory; the scoring service's cache and the gateway hold
them; and the FewestGuests unit, asked through XML-RPC like the engine,
changes its choice from hv-qemu to hv-td.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.services.test_facts_bus import best, facts_of, stack  # noqa: F401 - the stack fixture
from tests.support.agents import EventTap
from tests.support.agents import agent as start_td_agent
from tests.support.stack import Stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.rabbitmq, pytest.mark.libvirt]


def test_guest_start_changes_facts_and_the_decision(env, guests, agent_factory, tmp_path: Path,
                                                    rabbit_vhost: str, stack: Stack) -> None:  # noqa: F811
    url_file = tmp_path / "amqp-url"
    url_file.write_text(rabbit_vhost + "\n")
    url_file.chmod(0o600)
    tap = EventTap(rabbit_vhost, "agent.hv-qemu.facts")
    try:
        agent_factory(host_id="hv-qemu", extra_args=("--amqp-url-file", str(url_file), "--facts-interval", "1"))
        wait_until(lambda: facts_of(stack, "hv-qemu"), 30, 0.1, "facts of the real agent")
        before = facts_of(stack, "hv-qemu")["host"]
        n = before["guests_running"]  # guests of other tests may run on this libvirtd
        assert before["memory_total_mib"] > 0 and before["cpus"] >= 1 and before["libvirt_uuid"]
        other = start_td_agent(tmp_path, rabbit_vhost, "hv-td", [(f"t{i}", 64) for i in range(n + 1)], "1")
        stack.procs.append(other)
        wait_until(lambda: facts_of(stack, "hv-td"), 30, 0.1, "facts of the test-driver agent")
        hosts = ["hv-qemu", "hv-td"]
        wait_until(lambda: best(stack, hosts)[0] == "hv-qemu", 10, 0.1, "hv-qemu chosen: it has the fewest guests")

        names = [guests.define(vcpus=1, memory_mib=64) for _ in range(2)]
        for name in names:
            guests.start(name)
        # published on the lifecycle event itself, with the new count and memory
        wait_until(lambda: any(e.get("reason") == "event" and e["host"]["guests_running"] >= n + 1
                               for _, e in tap.events), 10, 0.05, "an event-driven facts message")
        wait_until(lambda: facts_of(stack, "hv-qemu")["host"]["guests_running"] == n + 2, 10, 0.1, "two more guests")
        after = facts_of(stack, "hv-qemu")
        assert after["host"]["guest_memory_mib"] == before["guest_memory_mib"] + 128
        started = {g["name"]: g for g in after["guests"] if g["name"] in names}
        assert {(g["state"], g["vcpus"], g["memory_mib"]) for g in started.values()} == {("running", 1, 64)}
        # the unit, in the scoring service, now prefers the other host
        wait_until(lambda: best(stack, hosts)[0] == "hv-td", 10, 0.1, "hv-td chosen after the guests started")
        for name in names:
            guests.destroy(name)
        wait_until(lambda: facts_of(stack, "hv-qemu")["host"]["guests_running"] == n, 10, 0.1, "guests gone")
    finally:
        tap.close()
