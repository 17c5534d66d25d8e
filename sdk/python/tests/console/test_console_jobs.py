"""The console's view of runs as jobs, in headless Chromium against the real server: a run's
results listed with their sizes and downloaded through the console's session, the
environment it took (a Secret by name only: its value is nowhere in the page), its post-run
action and how it went, the AgentEnvironments page, and a running run's page that follows the
run without being reloaded."""

from __future__ import annotations

import base64
import gzip
import io
import json
import tarfile
import time
from typing import Any, Dict, Tuple

import httpx
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from test_console import api, browser, shot, sign_in, unique, wait_for

import nodus
from conftest import NodusServer, WebhookReceiver

__all__ = ["browser"]


def inline_agent() -> Dict[str, Any]:
    return {"system": "You are careful.", "model": {"access": "Nodus", "families": ["haiku"]}}


def open_run(driver: WebDriver, server: NodusServer, run: str) -> None:
    sign_in(driver, server)
    wait_for(driver, lambda d: d.current_url.endswith("/console/p/default/agents"))
    driver.get(f"{server.url}/console/p/default/runs/{run}")
    wait_for(driver, lambda d: d.find_elements(By.ID, "phase"))


def fetch_in_page(driver: WebDriver, href: str) -> Tuple[int, str, bytes]:
    """``href`` fetched by the page itself (its session cookie, no token): status, content
    type and body."""
    answer = driver.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        fetch(arguments[0], {credentials: "same-origin"}).then(async (r) => {
          const bytes = new Uint8Array(await r.arrayBuffer());
          let text = "";
          for (const b of bytes) { text += String.fromCharCode(b); }
          done([r.status, r.headers.get("content-type"), btoa(text)]);
        }).catch((e) => done([0, String(e), ""]));
        """,
        href,
    )
    return int(answer[0]), str(answer[1]), base64.b64decode(answer[2])


def test_a_runs_results_are_listed_and_one_downloaded(
    browser: WebDriver, server: NodusServer
) -> None:
    run = nodus.AgentRun.create(
        inline_agent(), "Run `printf 'kept by the console\\n' > kept.txt && echo saved`"
    )
    assert run.wait(timeout=60).phase == "Succeeded"
    open_run(browser, server, run.name)
    # An agent written inline is named as such, not shown as its JSON.
    facts = browser.find_element(By.CSS_SELECTOR, "dl.facts").text
    assert "Agent\n(inline agent)" in facts and "maxTokens" not in facts
    listed = api(server, f"/agentruns/{run.name}/results")["items"]
    rows = browser.find_elements(By.CSS_SELECTOR, "#results tbody tr")
    assert [
        (
            r.get_attribute("data-result"),
            r.find_element(By.CSS_SELECTOR, "a.download").text,
            int(r.find_element(By.CSS_SELECTOR, "td.size").get_attribute("data-bytes") or -1),
        )
        for r in rows
    ] == [(i["name"], i["fileName"], i["bytes"]) for i in listed]
    shot(browser, "run-results")
    # The link downloads the file with the page's session.
    link = browser.find_element(By.CSS_SELECTOR, 'tr[data-result="outputWorkdir"] a.download')
    href = link.get_attribute("href") or ""
    assert href.endswith(f"/console/p/default/runs/{run.name}/results/outputWorkdir")
    assert link.get_attribute("download") is not None
    status, content_type, body = fetch_in_page(browser, href)
    assert (status, content_type) == (200, "application/gzip")
    size = next(i["bytes"] for i in listed if i["name"] == "outputWorkdir")
    assert len(body) == size
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(body))) as archive:
        member = archive.extractfile("kept.txt")
        assert member is not None and member.read() == b"kept by the console\n"
    status, content_type, body = fetch_in_page(browser, href.replace("outputWorkdir", "runRecord"))
    assert status == 200 and json.loads(body)["answer"] == "It is saved."
    # Without the session the link leads to sign-in, not to the file.
    outside = httpx.get(href, follow_redirects=False)
    assert outside.status_code == 303
    assert outside.headers["location"] == "/console/signin"
    # The trajectory's own link: the ATIF document, the same as the API's.
    trajectory = browser.find_element(By.CSS_SELECTOR, "#trajectory-link a")
    href = trajectory.get_attribute("href") or ""
    assert href.endswith(f"/console/p/default/runs/{run.name}/results/trajectory")
    status, content_type, body = fetch_in_page(browser, href)
    assert (status, content_type) == (200, "application/json")
    assert json.loads(body) == run.trajectory()
    assert not browser.find_elements(By.ID, "trajectory-none")


def test_a_run_without_telemetry_says_it_has_no_trajectory(
    browser: WebDriver, server: NodusServer
) -> None:
    run = nodus.AgentRun.create(inline_agent(), "Run `echo quiet`", auto_telemetry=False)
    assert run.wait(timeout=60).phase == "Succeeded"
    open_run(browser, server, run.name)
    assert "autoTelemetry false" in browser.find_element(By.ID, "trajectory-none").text
    assert not browser.find_elements(By.ID, "trajectory-link")
    rows = browser.find_elements(By.CSS_SELECTOR, "#results tbody tr")
    assert "trajectory" not in [r.get_attribute("data-result") for r in rows]


def test_the_environment_and_post_run_action_are_shown_without_secret_values(
    browser: WebDriver, server: NodusServer, receiver: WebhookReceiver
) -> None:
    url = receiver.url
    planted = unique("planted-secret-value")
    secret = unique("db")
    client = nodus.default_client()
    client.create_secret(secret, {"password": planted})
    level = unique("level")
    environment = nodus.AgentEnvironment.create(
        unique("console-env"),
        env={"LOG_LEVEL": level},
        secrets={"DB_PASSWORD": nodus.SecretRef(secret, "password")},
        compute={"cpu": "1", "memory": "256Mi"},
    )
    run = nodus.AgentRun.create(
        inline_agent(),
        'Run `printf "%s %s\\n" "$LOG_LEVEL" "${#DB_PASSWORD}"`',
        environment=environment,
        post_run_action={
            "kind": "agents.webhook",
            "config": {"url": url, "headers": {"X-Team": "console-header-value"}},
        },
    )
    assert run.wait(timeout=60).phase == "Succeeded"
    assert [hook["path"] for hook in receiver.received] == ["/hook"]
    open_run(browser, server, run.name)
    source = browser.page_source
    assert planted not in source
    assert "console-header-value" not in source
    # The plain variable with its value; the Secret by name, key and version.
    plain = browser.find_element(By.CSS_SELECTOR, 'tr[data-variable="LOG_LEVEL"] td.source')
    assert plain.text == level
    from_secret = browser.find_element(By.CSS_SELECTOR, 'tr[data-variable="DB_PASSWORD"] td.source')
    snapshot = api(server, f"/agentruns/{run.name}")["status"]["snapshot"]["environment"]
    version = snapshot["secrets"][0]["resourceVersion"]
    assert from_secret.text == f"Secret {secret}, key password (version {version})"
    assert browser.find_element(By.ID, "environment").text.endswith(
        f"{snapshot['environmentRef']} (version {snapshot['environmentRevision']})"
    )
    assert "cpu 1" in browser.find_element(By.CSS_SELECTOR, "p.compute").text
    # The post-run action, its config (header values hidden) and its outcome.
    assert browser.find_element(By.ID, "action-kind").text == "agents.webhook"
    assert url in browser.find_element(By.ID, "action-config").text
    outcome = browser.find_element(By.ID, "action-outcome").text
    assert outcome.startswith("Completed: post-run action agents.webhook"), outcome
    assert "webhookDelivery" in [
        r.get_attribute("data-result")
        for r in browser.find_elements(By.CSS_SELECTOR, "#results tbody tr")
    ]
    shot(browser, "run-environment")
    # The AgentEnvironments page, from the run's link to its environment: the same, and still
    # no value.
    browser.find_element(By.ID, "environment-link").click()
    wait_for(browser, lambda d: d.current_url.endswith(f"#environment-{environment.name}"))
    section = wait_for(
        browser,
        lambda d: d.find_elements(
            By.CSS_SELECTOR, f'section[data-environment="{environment.name}"]'
        ),
    )[0]
    assert (
        section.find_element(By.CSS_SELECTOR, 'tr[data-variable="LOG_LEVEL"] td.source').text
        == level
    )
    assert (
        section.find_element(By.CSS_SELECTOR, 'tr[data-variable="DB_PASSWORD"] td.source').text
        == f"Secret {secret}, key password"
    )
    assert planted not in browser.page_source
    shot(browser, "environments")


def test_a_running_runs_page_follows_it_without_reload(
    browser: WebDriver, server: NodusServer
) -> None:
    marker = unique("followed")
    sign_in(browser, server)
    wait_for(browser, lambda d: d.current_url.endswith("/console/p/default/agents"))
    run = nodus.AgentRun.create(inline_agent(), f"Run `sleep 3; echo {marker}`")
    browser.get(f"{server.url}/console/p/default/runs/{run.name}")
    # Read within the wait: the live part may be replaced between finding and reading.
    phase = wait_for(browser, lambda d: d.find_element(By.ID, "phase").text)
    assert phase not in ("Succeeded", "Failed", "Cancelled")
    assert browser.find_elements(By.ID, "results-none")
    browser.execute_script("window.__notReloaded = true;")
    # The command's step, then the end of the run and its results, on the page as loaded.
    wait_for(
        browser,
        lambda d: any(
            marker in cell.text for cell in d.find_elements(By.CSS_SELECTOR, "#steps td.summary")
        ),
    )
    wait_for(browser, lambda d: d.find_element(By.ID, "phase").text == "Succeeded")
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#results tbody tr"))
    assert browser.find_element(By.ID, "answer").text == f"It is {marker}."
    assert browser.execute_script("return window.__notReloaded;") is True
    # Finished, the page stops listening: another change of the project fetches nothing.
    fetches = "return performance.getEntriesByType('resource').filter((e) => e.name.includes('fragment=1')).length;"
    before = browser.execute_script(fetches)
    other = nodus.AgentRun.create(inline_agent(), "Say hello")
    assert other.wait(timeout=60).phase == "Succeeded"
    time.sleep(1)
    assert browser.execute_script(fetches) == before
    # A finished run's page does not listen at all.
    browser.refresh()
    wait_for(browser, lambda d: d.find_element(By.ID, "phase").text == "Succeeded")
    assert not browser.find_elements(By.ID, "live")
