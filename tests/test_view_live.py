"""The drill view in a real browser: headless Chromium (Debian's, driven by Selenium) loads the
page while nps-chain is up with two overlay nodes holding reports for each other, sees the
radio link up and the nodes' queues, takes the radio link down from the page, and the page
and the testbed's own state agree; a screenshot of the page with the link down is written.
Skipped, with the reason, where Chromium or its driver is not installed."""

from __future__ import annotations

import asyncio
import shutil
import socket
import threading
import time

import pytest

from c2dtn.topologies import testbed
from c2dtn.topologies.nodes import Nodes, agent_missing
from c2dtn.topologies.view import DrillView

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(agent_missing() is not None, reason=str(agent_missing())),
    pytest.mark.skipif(
        CHROMIUM is None or DRIVER is None, reason="chromium and chromium-driver are not installed (make apt-test)"
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_link_taken_down_from_the_page_is_down_in_the_testbed_and_on_the_page(tmp_path):
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    testbed.down()
    st = testbed.up("nps-chain", profile="cnr-tactical-2", seed=5)
    nodes = Nodes(st, ["gw1", "r2", "r3", "gw4"], ["gw1", "gw4"], tmp_path / "nodes")
    port = _free_port()
    loop = asyncio.new_event_loop()
    view = DrillView("127.0.0.1", port, {n: nodes.paths[n] for n in ("gw1", "gw4")})
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    driver = None
    try:
        nodes.start_all(["gw1", "r2", "r3", "gw4"])
        asyncio.run_coroutine_threadsafe(view.start(), loop).result(10)
        testbed.change_link("r2", "r3", "down")  # so that what gw1 sends stays queued, for the page to show
        for i in range(3):
            nodes.send("gw1", "gw4", f"report {i}".encode())
        testbed.change_link("r2", "r3", "up")
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1100,900"):
            opts.add_argument(a)
        driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
        driver.get(f"http://127.0.0.1:{port}/")
        # the page redraws its graph and queues on every snapshot, so an element found may be
        # replaced before it is read: each read is retried until it holds or the wait runs out
        wait = WebDriverWait(driver, 20, ignored_exceptions=(StaleElementReferenceException,))

        def edge_is(cls: str):
            return lambda d: d.find_element(By.CSS_SELECTOR, "#edge-r2-r3").get_attribute("class") == cls

        def click(css: str):
            wait.until(lambda d: d.find_element(By.CSS_SELECTOR, css).click() or True)

        state = (By.CSS_SELECTOR, "#link-r2-r3 td.state")
        wait.until(ec.text_to_be_present_in_element(state, "up"))
        assert "nps-chain" in driver.find_element(By.ID, "topology").text
        wait.until(edge_is("up"))
        # both nodes answered
        wait.until(lambda d: all(n in d.find_element(By.ID, "queues").text for n in ("gw1", "gw4")))
        click("#link-r2-r3 button.down")
        wait.until(ec.text_to_be_present_in_element(state, "down"))
        assert testbed.status()["links"]["r2-r3"]["state"] == "down"  # the testbed agrees with the page
        wait.until(edge_is("down"))
        shot = tmp_path / "drill-view-r2-r3-down.png"
        driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        # and back up, with another profile, from the page
        click("#link-r2-r3 button.up")
        wait.until(ec.text_to_be_present_in_element(state, "up"))
        click("#link-r2-r3 select.profile option[value='cnr-tactical-1']")
        click("#link-r2-r3 button.set")
        wait.until(
            ec.text_to_be_present_in_element((By.CSS_SELECTOR, "#link-r2-r3"), "cnr-tactical-1 / cnr-tactical-1")
        )
        assert testbed.status()["links"]["r2-r3"]["profile_ab"]["name"] == "cnr-tactical-1"
        print(f"screenshot: {shot}")
    finally:
        if driver is not None:
            driver.quit()
        asyncio.run_coroutine_threadsafe(view.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        nodes.stop_all()
        testbed.down()


def test_a_link_change_without_the_pages_header_or_from_another_origin_is_refused(tmp_path):
    import json
    import urllib.error
    import urllib.request

    testbed.down()
    testbed.up("nps-chain", profile="cnr-tactical-2", seed=5)
    port = _free_port()
    loop = asyncio.new_event_loop()
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    view = DrillView("127.0.0.1", port)
    try:
        asyncio.run_coroutine_threadsafe(view.start(), loop).result(10)
        body = json.dumps({"link": "r2-r3", "action": "down"}).encode()
        page = f"http://127.0.0.1:{port}"
        for headers in (
            {"Content-Type": "application/json", "Origin": page},  # a form another page could post
            {"Content-Type": "application/json", "X-C2-Drill": "1", "Origin": "http://evil.example"},
            {"Content-Type": "application/json", "X-C2-Drill": "1"},  # no origin: not from a page
            # DNS rebinding: a page of evil.example, its name now pointing here, is of its own origin
            {
                "Content-Type": "application/json",
                "X-C2-Drill": "1",
                "Host": f"evil.example:{port}",
                "Origin": f"http://evil.example:{port}",
            },
        ):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/link", data=body, headers=headers, method="POST")
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=10)
            assert e.value.code == 403
        time.sleep(0.2)
        assert testbed.status()["links"]["r2-r3"]["state"] == "up"
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/link",
            data=json.dumps({"link": "r2-r3", "action": "set", "profile": "no-such"}).encode(),
            headers={"Content-Type": "application/json", "X-C2-Drill": "1", "Origin": page},
            method="POST",
        )
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 400 and "no-such" in e.value.read().decode()
        req = urllib.request.Request(f"{page}/state", headers={"Host": f"evil.example:{port}"})
        with pytest.raises(urllib.error.HTTPError) as e:  # nor can such a page read the state
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 403
    finally:
        asyncio.run_coroutine_threadsafe(view.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        testbed.down()
