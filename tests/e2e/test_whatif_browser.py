"""The console's What if page in a real headless browser, offline (the browser and helpers of
test_console_browser.py): shadow comparisons published on a private RabbitMQ vhost, as a candidate's service
publishes them, a decision's Shadow section, and a replay report. Hostile text from plugins stays text, nothing
is loaded from elsewhere, and no CSP violation is logged. ``VMSCHED_CONSOLE_SCREENSHOT=docs/console.png`` also
saves ``console-whatif.png`` beside it (in docs/console.md)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Iterator

import pytest

from tests.e2e.test_console_browser import _assert_local, _screenshot, _wait, browser  # noqa: F401 - a fixture
from tests.gateway.console.test_whatif import report
from tests.support.shadow import HOSTS, comparison, publish
from tests.support.stack import TEST_TOKEN, Stack, plugin_copy, start_all_in_one
from tests.support.waiting import wait_until
from vmsched.bus.interface import Transport
from vmsched.bus.options import BusOptions
from vmsched.bus.transport import open_transport

pytestmark = [pytest.mark.slow, pytest.mark.rabbitmq]

MARKUP = '<b id="injected">markup</b> stays text'


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, rabbit_vhost: str) -> Iterator[tuple[Stack, Transport]]:
    tmp = tmp_path_factory.mktemp("whatif-browser")
    reports = tmp / "reports"
    reports.mkdir()
    (reports / "monday.json").write_text(json.dumps(report()))
    (reports / "broken.json").write_text("{")
    stack = start_all_in_one(tmp, rabbit_vhost, "--whatif-reports", str(reports), plugins=plugin_copy(tmp))
    try:
        yield stack, open_transport(BusOptions(url=rabbit_vhost))
    finally:
        stack.stop()


def _published(stack: Stack, transport: Transport, body: dict[str, Any]) -> None:
    """Publish until the gateway has it: its subscription may still be starting (then the event has no queue)."""
    def kept() -> bool:
        publish(transport, body)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            if stack.get(f"/v1/shadow/{body['id']}").status_code == 200:
                return True
            time.sleep(0.1)
        return False

    wait_until(kept, 30, 0.1, f"the gateway to keep comparison {body['id']}")


def test_whatif_page_shadow_section_and_report(browser: Any, gateway: tuple[Stack, Transport]) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    stack, transport = gateway
    vm = str(uuid.uuid4())
    stack.xmlrpc("runFilters", ["KeepEven"], HOSTS, vm, {})
    record_id = wait_until(lambda: stack.get("/v1/decisions", params={"vm": vm}).json()["decisions"], 10, 0.1,
                           "the decision")[0]["id"]
    _published(stack, transport, comparison(record_id, vm=vm, what=f"drops {HOSTS[2]}: {MARKUP}", rows=[
        {"host": HOSTS[2], "live": {"KeepEven": "kept", "result": "kept"},
         "candidate": {"KeepEven": f"dropped: {MARKUP}", "result": "dropped"}}]))
    _published(stack, transport, comparison(uuid.uuid4().hex, op="score", status="error",
                                            what="MostGuests timed out", errors={"MostGuests": "timed out"}, rows=[]))

    driver = browser
    driver.get(stack.url + "/login")
    _wait(driver, "input#token").send_keys(TEST_TOKEN)
    driver.find_element(By.CSS_SELECTOR, "form.login button").click()
    _wait(driver, "#units-table")
    driver.find_element(By.LINK_TEXT, "What if").click()  # from the navigation
    table = _wait(driver, "#shadow-table")
    rows = table.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[3].text for r in rows] == ["error", "changed"]  # newest first
    assert rows[1].find_elements(By.TAG_NAME, "td")[4].text == f"drops {HOSTS[2]}: {MARKUP}"
    assert not driver.find_elements(By.ID, "injected")
    counts = {r.find_elements(By.TAG_NAME, "td")[0].text: r.find_elements(By.TAG_NAME, "td")[1].text
              for r in driver.find_elements(By.CSS_SELECTOR, "#shadow-counts tbody tr")}
    assert counts == {"same": "0", "changed": "1", "unknown": "0", "error": "1"}
    reports = {r.find_elements(By.TAG_NAME, "td")[0].text: r.text
               for r in driver.find_elements(By.CSS_SELECTOR, "#reports-table tbody tr")}
    assert set(reports) == {"monday.json", "broken.json"} and "broken.json: not JSON" in reports["broken.json"]
    _assert_local(driver, stack)
    _screenshot(driver, "console-whatif.png", "#reports")

    rows[1].find_element(By.CSS_SELECTOR, "a").click()  # to the decision page and its Shadow section
    section = _wait(driver, "#shadow-section")
    assert "changed" in section.text and f"drops {HOSTS[2]}: {MARKUP}" in section.text
    cells = driver.find_elements(By.CSS_SELECTOR, "#shadow-hosts tbody td")
    assert cells[0].text == HOSTS[2]
    assert cells[1].text.splitlines() == ["live: kept", f"candidate: dropped: {MARKUP}"]
    assert not driver.find_elements(By.ID, "injected")
    _assert_local(driver, stack)

    driver.get(stack.url + "/console/whatif/reports/monday.json")
    changes = _wait(driver, "#report-changes")
    assert "keeps 2 hosts (baseline 3)" in changes.text and "KeepEven" in driver.find_element(By.ID, "report-units").text
    assert not driver.find_elements(By.CSS_SELECTOR, "script:not([src])")
    _assert_local(driver, stack)
    driver.get(stack.url + "/console/whatif/reports/broken.json")
    assert "broken.json: not JSON" in _wait(driver, "#report-error").text
    driver.get_log("browser")  # the page's 404 is expected
