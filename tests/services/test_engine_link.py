"""The engine link against a fake of the engine's REST resources over HTTPS (tests/support/fake_engine.py).

Covered: engine host IDs mapped to agents by hw_id (the vdsm ID, else the
libvirt UUID) and by the host's hardware UUID, never when ambiguous, and
after an explicit mapping; a starting VM's memory and vCPUs; the answer
cache and its TTL; an engine that is down, slow or refuses the credentials
(bounded, a clear error, the request path never waits); an expired token;
HTTP basic; TLS verification against the configured CA.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.net import free_port
from tests.support.waiting import wait_until
from tests.support.facts import full_form, reading
from tests.support.fake_engine import API, FakeEngine
from tests.support.tls_certs import CertSet, make_certs
from vmsched.config import Settings
from vmsched.engine_link import EngineLink, calls, facts_cache
from vmsched.engine_link.client import LinkConfig, load_config
from vmsched.facts.model import FactsMessage, GuestFacts, HostFacts
from vmsched.facts.cache import FactsCache
from vmsched.metrics import REGISTRY
from vmsched.plugin import facts as api


def message(host: str, vdsm_id: str = "", libvirt_uuid: str = "", guests: list | None = None) -> bytes:
    return FactsMessage(host_id=host, instance="i1", seq=1, time=time.time(), interval=5.0,
                        host=HostFacts(vdsm_id=vdsm_id, libvirt_uuid=libvirt_uuid), guests=guests).model_dump_json().encode()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    return make_certs(tmp_path_factory.mktemp("engine-certs"))


@pytest.fixture
def engine(certs: CertSet) -> Iterator[FakeEngine]:
    fake = FakeEngine(certs).start()
    yield fake
    fake.stop()


def start(cache: FactsCache, engine: FakeEngine, certs: CertSet, **kw) -> EngineLink:
    config = LinkConfig(engine.url, engine.username, kw.pop("password", engine.password), kw.pop("auth", "oauth"))
    link = EngineLink(config, ca=certs.ca, service=cache.service, **{"timeout": 2.0, "retry": 0.2, **kw})
    cache.link = link
    return link.start(cache.identities)


@pytest.fixture
def cache(request: pytest.FixtureRequest) -> Iterator[FactsCache]:
    cache = FactsCache(f"link-{request.node.name[:40]}")
    yield cache
    if cache.link is not None:
        cache.link.stop()


def resolved(cache: FactsCache, engine_id: str) -> str | None:
    return cache.resolve(engine_id)[1] if cache.resolve(engine_id)[0] is not None else None


def test_the_link_file(tmp_path: Path) -> None:
    path = tmp_path / "link.yaml"
    path.write_text("url: https://engine.example/ovirt-engine/api/\nusername: u@internal\npassword: pw-123\n")
    config = load_config(path)
    assert config.url == "https://engine.example/ovirt-engine/api" and config.auth == "oauth"
    assert "pw-123" not in repr(config)
    for text, error in [("url: http://engine/ovirt-engine/api\nusername: u\npassword: p\n", "https"),
                        ("url: https://u:p@engine/ovirt-engine/api\nusername: u\npassword: p\n", "not in the URL"),
                        ("url: https://engine/ovirt-engine/api\nusername: u\n", "lacks password"),
                        ("url: https://e/a\nusername: u\npassword: p\nauth: kerberos\n", "oauth or basic"),
                        ("url: https://e/a\nusername: u\npassword: p\ninsecure: true\n", "unknown keys"),
                        ("[1, 2]\n", "mapping")]:
        path.write_text(text)
        with pytest.raises(ValueError, match=error):
            load_config(path)


def test_engine_hosts_map_to_agents_by_hw_id_and_hardware_uuid(engine: FakeEngine, certs: CertSet,
                                                               cache: FactsCache) -> None:
    cache.ingest(message("hv-a", vdsm_id="5b0c9a52-0000-4000-8000-00000000000a"))
    cache.ingest(message("hv-b", libvirt_uuid="0e5ea2f0-0000-4000-8000-00000000000b"))  # no vdsm.id: vdsm used the UUID
    cache.ingest(message("hv-c", vdsm_id="not-registered", libvirt_uuid="0e5ea2f0-0000-4000-8000-00000000000c"))
    cache.ingest(message("hv-d1", libvirt_uuid="0e5ea2f0-0000-4000-8000-00000000000d"))
    cache.ingest(message("hv-d2", libvirt_uuid="0e5ea2f0-0000-4000-8000-00000000000d"))  # a cloned machine
    engine.add_host("E-a", "5b0c9a52-0000-4000-8000-00000000000a")
    engine.add_host("E-b", "0E5EA2F0-0000-4000-8000-00000000000B")  # the search compares case-insensitively
    engine.add_host("E-c", "something-else", hardware_uuid="0E5EA2F0-0000-4000-8000-00000000000C")
    engine.add_host("E-d", "0e5ea2f0-0000-4000-8000-00000000000d")
    engine.add_host("E-x", "no-agent-here")
    start(cache, engine, certs)

    entry, why = cache.resolve("E-a")  # the first ask: not known yet, never a guess
    assert entry is None and "not known yet" in why
    wait_until(lambda: resolved(cache, "E-a") == "hv-a", 10, what="E-a mapped by its vdsm ID")
    assert resolved(cache, "E-b") == "hv-b"
    wait_until(lambda: resolved(cache, "E-c") == "hv-c", 10, what="E-c mapped by its hardware UUID")
    for engine_id, reason in [("E-d", "more than one"), ("E-x", "found no agent"), ("E-none", "found no agent")]:
        wait_until(lambda: reason in cache.resolve(engine_id)[1], 10, what=f"{engine_id}: {reason}")
        assert cache.resolve(engine_id)[0] is None
    payload = full_form(cache, ["E-a", "E-x"])
    assert payload["hosts"]["E-a"]["agent_host_id"] == "hv-a" and "no facts" in payload["missing"]["E-x"]
    assert "engine link" in cache.view("E-a")["source"] and cache.view("E-x") is None
    searches = engine.calls[f"{API}/hosts"]
    for _ in range(50):
        cache.prepared(["E-a", "E-b", "E-x"])  # answers come from the cache
    time.sleep(0.5)
    assert engine.calls[f"{API}/hosts"] == searches and engine.calls[f"{API}/hosts/E-x"] == 1

    cache.host_map["E-a"] = "hv-b"  # an explicit mapping comes first
    assert resolved(cache, "E-a") == "hv-b"


def test_a_host_added_to_the_engine_later_is_found(engine: FakeEngine, certs: CertSet, cache: FactsCache) -> None:
    cache.ingest(message("hv-late", vdsm_id="7a1e0000-0000-4000-8000-00000000000e"))
    link = start(cache, engine, certs)
    link.negative = 0.5  # "no agent" holds this long (default: a minute)
    cache.resolve("E-late")
    wait_until(lambda: "found no agent" in cache.resolve("E-late")[1], 10, what="E-late unknown to the engine")
    searches = engine.calls[f"{API}/hosts"]
    engine.add_host("E-late", "7a1e0000-0000-4000-8000-00000000000e")  # the engine registers the host now
    wait_until(lambda: resolved(cache, "E-late") == "hv-late", 10, 0.1, "E-late found after it was added")
    assert engine.calls[f"{API}/hosts"] == searches + 1  # the agent searched again once, not per request


def test_a_starting_vm_from_the_engine_and_a_running_one_from_facts(engine: FakeEngine, certs: CertSet,
                                                                    cache: FactsCache) -> None:
    running = GuestFacts(uuid="vm-running", state="running", vcpus=2, memory_mib=1024)
    cache.ingest(message("hv-a", guests=[running]))
    engine.add_vm("vm-new", 3072, sockets=2, cores=2, threads=1, pinning="dedicated")
    engine.add_vm("vm-running", 999)
    start(cache, engine, certs, first_wait=0)

    first = full_form(cache, ["hv-a"], "vm-new")  # no first wait: the first call is told, and nothing blocks
    assert first["vm"] is None and "not known yet" in first["vm_problem"]
    payload = wait_until(lambda: (p := full_form(cache, ["hv-a"], "vm-new"))["vm"] and p, 10, what="the VM from the engine")
    assert payload["vm"]["memory_mib"] == 3072 and payload["vm"]["vcpus"] == 4 and payload["vm"]["source"] == "engine"
    assert payload["vm"]["cpu_pinning_policy"] == "dedicated"
    with reading(payload):  # what a unit sees
        assert api.vm().memory_mib == 3072 and api.vm().vcpus == 4 and api.vm().source == "engine"

    on_host = cache.vm("vm-running")[0]
    assert on_host["memory_mib"] == 1024 and on_host["source"] == "host facts"
    assert engine.calls[f"{API}/vms/vm-running"] == 0  # a running VM needs no engine call

    cache.vm("vm-gone")
    wait_until(lambda: "knows no such VM" in cache.vm("vm-gone")[1], 10, what="an unknown VM")
    cache.vm("../../hosts")
    wait_until(lambda: "knows no such VM" in cache.vm("../../hosts")[1], 10, what="a bad ID")
    assert not any("hosts" in path for path in engine.calls)  # a bad ID never goes into a URL


def test_the_first_call_about_a_vm_waits_a_bounded_time_for_the_engine(engine: FakeEngine, certs: CertSet,
                                                                      cache: FactsCache) -> None:
    engine.add_vm("vm-new", 2048, sockets=1, cores=2, threads=1)
    start(cache, engine, certs, first_wait=2.0)
    first, _ = cache.vm("vm-new")  # the engine's first call (runFilters) already knows the VM
    assert first is not None and first["memory_mib"] == 2048, first

    engine.delay = 1.5  # a slow engine: the wait ends at its bound, the call is told "not known yet"
    link = start(cache, engine, certs, first_wait=0.3, timeout=5.0)
    try:
        t0 = time.monotonic()
        slow = cache.vm("vm-slow")
        waited = time.monotonic() - t0
        assert slow[0] is None and "not known yet" in slow[1], slow
        assert 0.25 <= waited < 1.4, waited  # bounded by first_wait, not by the engine's delay
    finally:
        link.stop()


def test_answers_are_cached_for_the_ttl(engine: FakeEngine, certs: CertSet, cache: FactsCache) -> None:
    engine.add_vm("vm-1", 512)
    start(cache, engine, certs, ttl=3.0)
    cache.vm("vm-1")
    wait_until(lambda: cache.vm("vm-1")[0], 10, what="the first answer")
    for _ in range(20):
        assert cache.vm("vm-1")[0]["memory_mib"] == 512
    assert engine.calls[f"{API}/vms/vm-1"] == 1
    engine.add_vm("vm-1", 2048)  # hot-plugged memory: seen after the TTL
    wait_until(lambda: cache.vm("vm-1")[0]["memory_mib"] == 2048, 15, 0.2, "the answer after the TTL")
    assert engine.calls[f"{API}/vms/vm-1"] == 2


def test_an_engine_that_is_down_or_slow_never_holds_a_request(engine: FakeEngine, certs: CertSet,
                                                              cache: FactsCache) -> None:
    down = FactsCache("link-down", link=None)
    config = LinkConfig(f"https://localhost:{free_port()}/ovirt-engine/api", "u", "p")
    down.link = EngineLink(config, ca=certs.ca, timeout=1.0, retry=0.2, service="link-down").start(down.identities)
    try:
        wait_until(lambda: "cannot reach the engine" in down.vm("vm-1")[1], 10, what="down")
        calls()  # the counter is registered on first use
        errors = REGISTRY.get_sample_value("vmsched_engine_link_calls_total",
                                           {"service": "link-down", "resource": "vm", "outcome": "error"})
        assert errors is not None and errors >= 1
    finally:
        down.link.stop()

    engine.add_vm("vm-slow", 256)
    engine.delay = 3.0
    start(cache, engine, certs, timeout=0.5)
    begun = time.monotonic()
    for _ in range(5):
        assert cache.vm("vm-slow")[0] is None  # answered from the cache while the engine is stuck
    assert time.monotonic() - begun < engine.delay
    wait_until(lambda: "in time" in cache.vm("vm-slow")[1], 15, what="the timeout as the problem")
    engine.delay = 0.0
    wait_until(lambda: cache.vm("vm-slow")[0], 15, what="the answer once the engine is quick again")
    begun = time.monotonic()
    cache.link.stop()
    assert time.monotonic() - begun < 5


def test_bad_credentials_say_so_and_never_show_the_password(engine: FakeEngine, certs: CertSet, cache: FactsCache,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="vmsched.engine_link")
    engine.add_vm("vm-1", 512)
    start(cache, engine, certs, password="wrong-password-42")
    problem = wait_until(lambda: (p := cache.vm("vm-1")[1]) and "login" in p and p, 10,
                         what="the refused login as the problem")
    assert "refused the login of 'vmsched@internal'" in problem and "incorrect" in problem
    # the problem is stored (and a waiting call woken) just before the failure is logged
    wait_until(lambda: "refused the login" in caplog.text, 10, what="the refused login in the log")
    assert "wrong-password-42" not in problem + caplog.text


def test_an_expired_token_means_one_new_login(engine: FakeEngine, certs: CertSet, cache: FactsCache) -> None:
    engine.add_vm("vm-1", 512)
    engine.add_vm("vm-2", 768)
    start(cache, engine, certs)
    cache.vm("vm-1")
    wait_until(lambda: cache.vm("vm-1")[0], 10, what="vm-1")
    engine.expire_tokens()
    cache.vm("vm-2")
    wait_until(lambda: cache.vm("vm-2")[0], 10, what="vm-2 after the token expired")
    assert engine.logins == 2
    cache.link.stop()
    assert not engine.tokens  # the SSO session ended with the link


def test_basic_authentication(engine: FakeEngine, certs: CertSet, cache: FactsCache) -> None:
    engine.add_vm("vm-1", 640)
    start(cache, engine, certs, auth="basic")
    cache.vm("vm-1")
    assert wait_until(lambda: cache.vm("vm-1")[0], 10, what="vm-1")["memory_mib"] == 640
    assert engine.logins == 0


def test_the_engine_certificate_is_verified(engine: FakeEngine, certs: CertSet, tmp_path: Path) -> None:
    settings = Settings(engine_link_file=engine.link_file(tmp_path), engine_link_ca=certs.other_ca,
                        engine_link_timeout=2.0)
    cache = facts_cache(settings, "link-tls")
    assert cache is not None and cache.link is not None
    try:
        cache.vm("vm-1")
        wait_until(lambda: "CERTIFICATE_VERIFY_FAILED" in cache.vm("vm-1")[1], 10,
                   what="a verification failure")
        assert engine.logins == 0  # the password never left
    finally:
        cache.link.stop()
