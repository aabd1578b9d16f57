"""The dashboard in a real browser: Debian's Chromium (headless) driven by chromedriver
through selenium, against a real `doq serve` on 127.0.0.1.

It opens `/ui`, sees queues and their counts and rates change as messages are enqueued
through the API, opens a queue, pages through its messages (without taking them), opens a
message, runs the admin actions (change a priority, delete a message, purge) and sees
their effect, and opens the cluster page. Every request the browser makes is read from
its network log: none leaves the node's 127.0.0.1 address. A screenshot of each page is
kept in build/test-artifacts/ui/ (looked at, not compared)."""

from __future__ import annotations

import json
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.proc import NodeProc, running_node

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
# CI installs both (.ci/run: apt-get install chromium chromium-driver); elsewhere this says why it did not run
pytestmark = [pytest.mark.integration, pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")]
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts" / "ui"
WAIT_S = 30  # generous: the page updates every second; a loaded machine may be slow
Q = "/API/v1/queues"



def call(node: NodeProc, method: str, path: str, body: object = None) -> Any:
    req = urllib.request.Request(node.http_url + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        raw = r.read()
        return json.loads(raw) if raw else None


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with running_node(Path(tmp_path_factory.mktemp("browser")) / "data") as n:
        yield n


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-default-apps", "--disable-extensions", "--window-size=1400,1000",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: webdriver.Chrome, what: str, condition: Any) -> Any:
    """`condition(driver)` once truthy. The page redraws its tables every second, so an
    element found may be replaced before it is read: such a try is simply tried again."""
    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1, ignored_exceptions=(
        StaleElementReferenceException,)).until(lambda d: condition(d), message=what)


def click(driver: webdriver.Chrome, css: str) -> None:
    def find_and_click(d: webdriver.Chrome) -> bool:
        d.find_element(By.CSS_SELECTOR, css).click()
        return True

    wait(driver, f"a click on {css}", find_and_click)


def text(driver: webdriver.Chrome, css: str) -> str:
    """The rendered text of the first element `css` selects ("" if none), read in one
    script: a redraw between finding an element and reading it cannot make it stale."""
    return str(driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText.trim() : '';", css))


def cells(driver: webdriver.Chrome, row_css: str) -> dict[str, str]:
    """The cells of the table row `row_css` selects, by their `data-col`, read in one script."""
    return dict(driver.execute_script(
        "const o = {}; for (const td of document.querySelectorAll(arguments[0] + ' td'))"
        " o[td.getAttribute('data-col')] = td.innerText.trim(); return o;", row_css))


def cell(driver: webdriver.Chrome, queue: str, col: str) -> str:
    return text(driver, f'#queues tr[data-queue="{queue}"] td[data-col="{col}"]')


def shot(driver: webdriver.Chrome, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def test_the_dashboard_shows_live_queues_browses_and_acts(node: NodeProc, browser: webdriver.Chrome) -> None:
    call(node, "POST", Q, {"name": "ui-jobs", "type": "fair"})
    call(node, "POST", Q, {"name": "ui-other", "type": "delayed"})
    browser.get(node.http_url + "/ui")
    wait(browser, "the queues table lists ui-jobs", lambda d: cell(d, "ui-jobs", "type") == "fair")
    assert cell(browser, "ui-jobs", "ready") == "0"

    # counts and rates follow what the API does
    call(node, "POST", f"{Q}/ui-jobs/messages:batch",
         {"messages": [{"content": f"job {i}", "group": "ab"[i % 2], "priority": i % 5} for i in range(30)]})
    wait(browser, "ready count 30", lambda d: cell(d, "ui-jobs", "ready") == "30")
    # the age of the oldest message: counting up while it waits, a dash for an empty queue
    wait(browser, "the oldest message's age", lambda d: re.fullmatch(r"\d+ (ms|s)", cell(d, "ui-jobs", "oldest_age_ms")))
    assert cell(browser, "ui-other", "oldest_age_ms") == "–"
    assert browser.execute_script(
        "const f = window.doqDashboard.fmtAge;"
        "return [f(850), f(42_000), f(192_000), f(3_600_000), f(18_240_000), f(198_000_000), f(null)];"
    ) == ["850 ms", "42 s", "3 min 12 s", "1 h", "5 h 4 min", "2 d 7 h", "–"]
    wait(browser, "a non-zero enqueue rate in the page's history", lambda d: d.execute_script(
        "const h = window.doqDashboard.history.get('ui-jobs') || [];"
        "return h.some((s, i) => i > 0 && s.enqueued > h[i - 1].enqueued);"))
    shot(browser, "queues")

    # sorting by a column
    click(browser, '#queues th[data-key="ready"]')
    wait(browser, "sorted by ready, descending: 30 before 0", lambda d: d.find_element(
        By.CSS_SELECTOR, "#queues tbody tr").get_attribute("data-queue") == "ui-jobs")
    assert browser.find_elements(By.CSS_SELECTOR, '#queues th.sorted[data-key="ready"]')

    # a queue's page: cards, groups, the message browser in delivery order
    click(browser, '#queues tr[data-queue="ui-jobs"]')
    wait(browser, "the queue page", lambda d: d.find_element(By.ID, "queue-name").text == "ui-jobs")
    wait(browser, "the oldest message's card", lambda d: re.fullmatch(
        r"\d+ (ms|s)", d.find_element(By.CSS_SELECTOR, '[data-card="oldest message"] .v').text))
    wait(browser, "the groups table", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#groups tr[data-group]")) == 2)
    expected = call(node, "GET", f"{Q}/ui-jobs/messages:peek?limit=40")["messages"]
    ids = [m["id"] for m in expected]
    wait(browser, "the first page of messages", lambda d: [r.get_attribute("data-id") for r in
         d.find_elements(By.CSS_SELECTOR, "#message-table tbody tr")] == ids[:20])
    click(browser, "#next")
    wait(browser, "the second page", lambda d: [r.get_attribute("data-id") for r in
         d.find_elements(By.CSS_SELECTOR, "#message-table tbody tr")] == ids[20:30])
    stats = call(node, "GET", f"{Q}/ui-jobs")["stats"]
    assert (stats["ready"], stats["in_flight"]) == (30, 0)  # browsing took nothing
    call(node, "PUT", f"{Q}/ui-jobs/groups/a", {"weight": 5, "max_per_second": 250})
    wait(browser, "group a's weight and rate", lambda d: d.find_element(
        By.CSS_SELECTOR, '#groups tr[data-group="a"] td[data-col="weight"]').text == "5" and d.find_element(
        By.CSS_SELECTOR, '#groups tr[data-group="a"] td[data-col="rate"]').text == "250/s")
    assert text(browser, '#groups tr[data-group="b"] td[data-col="rate"]') == "no limit"
    shot(browser, "queue")

    # a message's details, then the admin actions
    target = ids[25]
    click(browser, f'#message-table tr[data-id="{target}"]')
    wait(browser, "the message's details", lambda d: f'"id": "{target}"' in d.find_element(By.ID, "message-json").text)
    click(browser, "#set-priority")
    prompt = wait(browser, "the priority prompt", lambda d: d.switch_to.alert)
    prompt.send_keys("-7")
    prompt.accept()
    wait(browser, "the new priority", lambda d: '"priority": -7' in d.find_element(By.ID, "message-json").text)
    assert call(node, "GET", f"{Q}/ui-jobs/messages/{target}")["priority"] == -7
    shot(browser, "message")
    click(browser, "#delete-message")
    wait(browser, "the delete confirmation", lambda d: d.switch_to.alert).accept()
    wait(browser, "the deleted message gone from the count", lambda d: d.find_element(
        By.CSS_SELECTOR, '[data-card="total"] .v').text == "29")
    with pytest.raises(urllib.error.HTTPError):
        call(node, "GET", f"{Q}/ui-jobs/messages/{target}")
    click(browser, "#purge")
    wait(browser, "the purge confirmation", lambda d: d.switch_to.alert).accept()
    wait(browser, "an empty queue", lambda d: d.find_element(By.CSS_SELECTOR, '[data-card="total"] .v').text == "0")
    assert text(browser, '[data-card="oldest message"] .v') == "–"
    assert call(node, "GET", f"{Q}/ui-jobs")["stats"]["total"] == 0

    # the cluster page
    browser.get(node.http_url + "/ui#/cluster")
    wait(browser, "the members table", lambda d: d.find_elements(By.CSS_SELECTOR, '#members tr[data-member="node-1"]'))
    assert "leader" in text(browser, '#members tr[data-member="node-1"]')
    member = cells(browser, '#members tr[data-member="node-1"]')
    status = call(node, "GET", "/cluster")
    assert member["reachable"] == "yes" and member["contact"] == "–", member  # itself
    assert int(member["match"].replace(",", "")) >= 1 and member["lag"] == "0", member
    assert re.fullmatch(r"\d+\.\d (KiB|MiB) of \d+\.\d GiB", text(browser, '[data-card="data used"] .v')), \
        status["storage"]
    assert "free" not in text(browser, '[data-card="disk free"] .v')
    assert re.fullmatch(r"\d+\.\d [KMGT]iB \(limit \d+\.\d [KMG]iB\)", text(browser, '[data-card="disk free"] .v'))
    assert text(browser, "#alarms") == "None: writes are accepted."
    shot(browser, "cluster")

    # nothing the page loaded came from anywhere but the node
    urls = []
    for entry in browser.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    network = [u for u in urls if u.startswith(("http:", "https:", "ws:", "wss:"))]  # not chrome://, data:
    assert any(u.startswith(node.http_url + "/static/ui/") for u in network)
    assert all(u.startswith(node.http_url + "/") for u in network), [u for u in network if node.http_url not in u]


def test_a_queue_page_opened_late_charts_the_minutes_before_it(node: NodeProc, browser: webdriver.Chrome) -> None:
    """The chart starts from the node's own samples (every 5 s since it started), not empty."""
    call(node, "POST", Q, {"name": "ui-hist", "type": "delayed"})
    for _ in range(2):  # two batches at least one sample apart: a non-zero rate before the page opens
        before = len(call(node, "GET", f"{Q}/ui-hist/history")["samples"])
        call(node, "POST", f"{Q}/ui-hist/messages:batch", {"messages": [{"content": "x"}] * 10})
        wait(browser, "a new sample on the node", lambda _d, n=before: len(
            call(node, "GET", f"{Q}/ui-hist/history")["samples"]) > n)
    browser.get("about:blank")  # a fresh page: nothing kept from an earlier one
    browser.get(node.http_url + "/ui#/queue/ui-hist")
    wait(browser, "samples older than the page with a rising enqueued count", lambda d: d.execute_script(
        "const h = window.doqDashboard.history.get('ui-hist') || [];"
        "const old = h.filter((s) => s.t < performance.timeOrigin);"
        "return old.length >= 2 && old[old.length - 1].enqueued > old[0].enqueued;"))
    wait(browser, "a chart line", lambda d: d.find_elements(By.CSS_SELECTOR, '#chart polyline[data-series="enq"]'))
    shot(browser, "queue-history")


def test_a_redrive_started_from_the_page_moves_the_messages_and_shows_its_progress(
        node: NodeProc, browser: webdriver.Chrome) -> None:
    call(node, "POST", Q, {"name": "ui-dlq", "type": "delayed"})
    call(node, "POST", Q, {"name": "ui-back", "type": "delayed"})
    call(node, "POST", f"{Q}/ui-dlq/messages:batch", {"messages": [{"content": f"dead {i}"} for i in range(5)]})
    browser.get("about:blank")
    browser.get(node.http_url + "/ui#/queue/ui-dlq")
    wait(browser, "the queue page", lambda d: d.find_element(By.ID, "queue-name").text == "ui-dlq")
    click(browser, "#redrive")
    to = wait(browser, "the target prompt", lambda d: d.switch_to.alert)
    to.send_keys("ui-back")
    to.accept()
    wait(browser, "the rate prompt", lambda d: d.switch_to.alert).accept()  # empty: no limit
    wait(browser, "a completed redrive on the page", lambda d: d.find_element(
        By.CSS_SELECTOR, "#redrive-task").get_attribute("data-state") == "completed")
    assert "5 of 5 moved" in text(browser, "#redrive-task")
    assert call(node, "GET", f"{Q}/ui-back")["stats"]["ready"] == 5
    assert call(node, "GET", f"{Q}/ui-dlq")["stats"]["total"] == 0
    shot(browser, "queue-redrive")
