"""The console in a real browser: headless Chromium driven over WebDriver (selenium), against
the real ``nodus server`` and the fake model of ``tests/conftest.py``. Each page is checked
against the API's values, and photographed: into ``$NODUS_CONSOLE_SCREENSHOTS`` when it is set
(``NODUS_CONSOLE_SCREENSHOTS=docs/console`` refreshes the repository's pictures), else into a
temporary directory, so that a test run leaves the working tree as it was."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

import nodus
from conftest import TOKEN, NodusServer

SHOTS = Path(
    os.environ.get("NODUS_CONSOLE_SCREENSHOTS") or tempfile.mkdtemp(prefix="nodus-console-shots-")
).resolve()
API = "/apis/nodus.dev/v1/projects/default"
# What a model or a user might write to take over the page: shown as text, never run.
XSS = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def which(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        raise RuntimeError(f"{program} is not installed: scripts/test-env installs it")
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = Options()
    options.binary_location = which("chromium")
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(
        service=Service(executable_path=which("chromedriver")), options=options
    )
    yield driver
    driver.quit()


def api(server: NodusServer, path: str) -> Dict[str, Any]:
    answer = httpx.get(
        f"{server.url}{API}{path}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    )
    answer.raise_for_status()
    body: Dict[str, Any] = answer.json()
    return body


def wait_for(driver: WebDriver, what: Callable[[WebDriver], Any], timeout: float = 60) -> Any:
    def attempt(d: WebDriver) -> Any:
        try:
            return what(d)
        except StaleElementReferenceException:
            # The live part was replaced while being read: read again.
            return False
        except WebDriverException as error:
            # The same, as Chromium says it for an element of a replaced node.
            if "does not belong to the document" in str(error):
                return False
            raise

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(attempt)


def shot(driver: WebDriver, name: str) -> None:
    """The whole page, at the window's width."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    size = driver.get_window_size()
    height = driver.execute_script("return document.documentElement.scrollHeight;")
    driver.set_window_size(size["width"], max(size["height"], int(height) + 140))
    driver.save_screenshot(str(SHOTS / f"{name}.png"))
    driver.set_window_size(size["width"], size["height"])


def sign_in(driver: WebDriver, server: NodusServer, token: str = TOKEN) -> None:
    driver.get(f"{server.url}/console/signin")
    driver.delete_all_cookies()
    driver.get(f"{server.url}/console/signin")
    field = driver.find_element(By.ID, "token")
    field.send_keys(token)
    field.send_keys(Keys.ENTER)


def phase_of_row(driver: WebDriver, run: str) -> str:
    cells = driver.find_elements(By.CSS_SELECTOR, f'tr[data-run="{run}"] td.phase')
    return cells[0].text if cells else ""


def no_token_in(driver: WebDriver) -> None:
    assert TOKEN not in driver.page_source
    assert TOKEN not in driver.current_url


@pytest.fixture(scope="module")
def agent() -> nodus.ClaudeAgent:
    return nodus.ClaudeAgent(unique("console"), system="You are careful.", families=["haiku"])


def test_a_missing_or_wrong_session_is_sent_to_sign_in(
    browser: WebDriver, server: NodusServer
) -> None:
    browser.get(f"{server.url}/console/signin")
    browser.delete_all_cookies()
    for page in ("/console", "/console/p/default/agents", "/console/p/default/credits"):
        browser.get(f"{server.url}{page}")
        assert browser.current_url == f"{server.url}/console/signin", page
    browser.add_cookie({"name": "nodus_console_session", "value": "0" * 64, "path": "/console"})
    browser.get(f"{server.url}/console/p/default/agents")
    assert browser.current_url == f"{server.url}/console/signin"
    # A wrong token: refused, named, and not shown back.
    wrong = "not-a-token-of-this-server-0123456789"
    sign_in(browser, server, wrong)
    problem = browser.find_element(By.ID, "problem").text
    assert problem == "token: is not a valid token of this server"
    assert wrong not in browser.page_source
    shot(browser, "signin")
    # Signing in, then out: the session is gone.
    sign_in(browser, server)
    wait_for(browser, lambda d: d.current_url.endswith("/console/p/default/agents"))
    no_token_in(browser)
    cookie = browser.get_cookie("nodus_console_session")
    assert cookie is not None and cookie["httpOnly"] and cookie.get("sameSite") == "Strict"
    assert TOKEN not in cookie["value"]
    browser.find_element(By.ID, "signout").click()
    wait_for(browser, lambda d: d.current_url.endswith("/console/signin"))
    browser.add_cookie(dict(cookie))
    browser.get(f"{server.url}/console/p/default/agents")
    assert browser.current_url == f"{server.url}/console/signin"


def test_a_run_appears_and_finishes_live_with_the_api_values(
    browser: WebDriver, server: NodusServer, agent: nodus.ClaudeAgent
) -> None:
    sign_in(browser, server)
    wait_for(browser, lambda d: d.current_url.endswith("/console/p/default/agents"))
    # The run list, filtered by the agent (a real form: choose, submit by keyboard).
    browser.find_element(By.LINK_TEXT, "Runs").click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "filters"))
    browser.find_element(By.ID, "filter-agent").send_keys(agent.name)
    browser.find_element(By.ID, "filter-agent").send_keys(Keys.ENTER)
    wait_for(browser, lambda d: f"agent={agent.name}" in d.current_url)
    browser.execute_script("window.__notReloaded = true;")
    run = agent.submit("Run `echo hello from the console`")
    # It appears, and finishes, on the page as it was loaded.
    wait_for(browser, lambda d: phase_of_row(d, run.name) != "")
    wait_for(browser, lambda d: phase_of_row(d, run.name) == "Succeeded")
    assert browser.execute_script("return window.__notReloaded;") is True
    document = api(server, f"/agentruns/{run.name}")
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-run="{run.name}"]')
    assert (
        row.find_element(By.CSS_SELECTOR, "td.model").text
        == document["status"]["turns"][-1]["model"]
    )
    assert (
        row.find_element(By.CSS_SELECTOR, "td.cost").text == document["status"]["cost"]["totalUSD"]
    )
    shot(browser, "runs")
    # Open it (a real link): every turn's model, chosen-by and cost, and the answer, as the
    # API answers them.
    row.find_element(By.LINK_TEXT, run.name).click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "turns"))
    turns = document["status"]["turns"]
    assert len(turns) == 1
    rows = browser.find_elements(By.CSS_SELECTOR, "#turns tbody tr")
    assert [
        (
            r.find_element(By.CSS_SELECTOR, ".model").text,
            r.find_element(By.CSS_SELECTOR, ".chosen-by").text,
            r.find_element(By.CSS_SELECTOR, ".cost").text,
        )
        for r in rows
    ] == [(t["model"], t["chosenBy"], t["costUSD"]) for t in turns]
    answer = api(server, f"/agentruns/{run.name}/answer")["answer"]
    assert answer == "It is hello from the console."
    assert browser.find_element(By.ID, "answer").text == answer
    assert browser.find_element(By.ID, "phase").text == "Succeeded"
    steps = api(server, f"/agentruns/{run.name}/steps")["items"]
    shown = browser.find_elements(By.CSS_SELECTOR, "#steps tbody tr")
    assert [r.find_element(By.CSS_SELECTOR, ".state").text for r in shown] == [
        s["state"] for s in steps
    ]
    no_token_in(browser)
    shot(browser, "run")
    browser.set_window_size(390, 844)
    shot(browser, "run-phone")
    browser.set_window_size(1280, 900)
    # A step's payload, on demand: the command and its output.
    command = next(i for i, s in enumerate(steps) if s["kind"] == "Command")
    shown[command].find_element(By.LINK_TEXT, "payload").click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "intent"))
    assert "echo hello from the console" in browser.find_element(By.ID, "intent").text
    assert "hello from the console" in browser.find_element(By.ID, "outcome").text
    shot(browser, "step")


def test_payloads_in_an_answer_and_command_output_are_text(
    browser: WebDriver, server: NodusServer, agent: nodus.ClaudeAgent
) -> None:
    sign_in(browser, server)
    wait_for(browser, lambda d: d.current_url.endswith("/agents"))
    run = agent.submit(f"Run `echo '{XSS}'`")
    run.wait(timeout=60)
    browser.get(f"{server.url}/console/p/default/runs/{run.name}")
    answer = browser.find_element(By.ID, "answer").text
    assert answer == f"It is {XSS}." == api(server, f"/agentruns/{run.name}/answer")["answer"]
    assert XSS in browser.find_element(By.ID, "input").text
    # Nothing ran, and nothing of it became an element.
    assert browser.execute_script("return window.__pwned;") is None
    assert browser.find_elements(By.TAG_NAME, "img") == []
    scripts = browser.find_elements(By.TAG_NAME, "script")
    assert [s.get_attribute("src") for s in scripts] == [f"{server.url}/console/assets/console.js"]
    assert XSS not in browser.page_source
    shot(browser, "escaped")
    # The command's output, on its step's payload page.
    links = browser.find_elements(By.LINK_TEXT, "payload")
    steps = api(server, f"/agentruns/{run.name}/steps")["items"]
    command = next(i for i, s in enumerate(steps) if s["kind"] == "Command")
    links[command].click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "outcome"))
    # The recorded output is shown as the JSON it is stored as.
    assert json.dumps(f"{XSS}\n") in browser.find_element(By.ID, "outcome").text
    assert browser.execute_script("return window.__pwned;") is None
    assert browser.find_elements(By.TAG_NAME, "img") == []


def test_cancel_a_run(browser: WebDriver, server: NodusServer, agent: nodus.ClaudeAgent) -> None:
    sign_in(browser, server)
    wait_for(browser, lambda d: d.current_url.endswith("/agents"))
    run = agent.submit("Run `sleep 120`")
    browser.get(f"{server.url}/console/p/default/runs/{run.name}")
    wait_for(browser, lambda d: d.find_element(By.ID, "phase").text == "Running")
    browser.find_element(By.ID, "cancel").click()
    wait_for(browser, lambda d: d.find_element(By.ID, "phase").text == "Cancelled", 30)
    assert api(server, f"/agentruns/{run.name}")["status"]["phase"] == "Cancelled"
    assert browser.find_elements(By.ID, "cancel") == []
    shot(browser, "cancelled")


def test_send_a_message_to_a_keep_alive_run_and_close_it(
    browser: WebDriver, server: NodusServer, agent: nodus.ClaudeAgent
) -> None:
    sign_in(browser, server)
    wait_for(browser, lambda d: d.current_url.endswith("/agents"))
    run = agent.submit("Hello there", keep_alive=True)
    browser.get(f"{server.url}/console/p/default/runs/{run.name}")
    wait_for(browser, lambda d: d.find_element(By.ID, "answer").text == "Noted: Hello there")
    browser.execute_script("window.__notReloaded = true;")
    message = "Now the staging logs <b>please</b>"
    # Keyboard only: into the message, and send.
    field = browser.find_element(By.ID, "payload")
    field.send_keys(message)
    browser.find_element(By.ID, "send").send_keys(Keys.ENTER)
    wait_for(browser, lambda d: d.find_element(By.ID, "answer").text == f"Noted: {message}")
    messages = browser.find_elements(By.CSS_SELECTOR, "#messages pre.message")
    assert [m.text for m in messages] == [message]
    assert browser.find_elements(By.TAG_NAME, "b") == []
    shot(browser, "keep-alive")
    browser.find_element(By.ID, "close").click()
    wait_for(browser, lambda d: d.find_element(By.ID, "phase").text == "Succeeded", 30)
    assert api(server, f"/agentruns/{run.name}")["status"]["phase"] == "Succeeded"


def test_groups_and_credits_show_the_api_values(
    browser: WebDriver, server: NodusServer, agent: nodus.ClaudeAgent
) -> None:
    worker = nodus.ClaudeAgent(
        unique("worker"), system="Answer briefly.", families=["haiku"], per_run_max_cost="0.10"
    )
    group = nodus.AgentGroup.create(unique("grp"), agent=worker, max_active=2, max_cost="0.60")
    group.submit([("a", "Say a"), ("b", "Say b", ["a"]), ("c", "Say c", ["a", "b"])])
    group.wait(timeout=60)
    sign_in(browser, server)
    wait_for(browser, lambda d: d.current_url.endswith("/agents"))
    browser.find_element(By.LINK_TEXT, "Groups").click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "groups"))
    document = api(server, f"/agentgroups/{group.name}")
    row = browser.find_element(By.XPATH, f'//tr[td/a[text()="{group.name}"]]')
    cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
    assert cells[1] == document["status"]["phase"] == "Succeeded"
    assert cells[2] == "3/3"
    assert cells[4] == f"{document['status']['cost']['totalUSD']} of 0.60"
    shot(browser, "groups")
    row.find_element(By.LINK_TEXT, group.name).click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "counts"))
    heads = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#counts th")]
    values = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#counts td")]
    counts = document["status"]["counts"]
    assert dict(zip(heads, values)) == {field: str(n) for field, n in counts.items()}
    runs: List[Dict[str, Any]] = api(server, f"/agentruns?fieldSelector=spec.group={group.name}")[
        "items"
    ]
    depends = {r["spec"]["taskKey"]: ", ".join(r["spec"].get("dependsOn", [])) or "—" for r in runs}
    shown = {}
    for tr in browser.find_elements(By.CSS_SELECTOR, "tr[data-run]"):
        cells = [c.text for c in tr.find_elements(By.TAG_NAME, "td")]
        shown[cells[2]] = cells[3]
    assert shown == depends == {"a": "—", "b": "a", "c": "a, b"}
    shot(browser, "group")
    browser.find_element(By.LINK_TEXT, "Credits").click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "credits"))
    credits = api(server, "/credits")
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-project="default"]')
    assert row.find_element(By.CSS_SELECTOR, ".balance").text == credits["balanceUSD"]
    assert row.find_element(By.CSS_SELECTOR, ".spent").text == credits["spentUSD"]
    shot(browser, "credits")


def post(server: NodusServer, path: str, body: Dict[str, Any], token: str = TOKEN) -> Any:
    answer = httpx.post(
        f"{server.url}/apis/nodus.dev/v1/projects{path}",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert answer.status_code in (200, 201), answer.text
    return answer.json()


def test_another_projects_run_is_not_reachable(browser: WebDriver, server: NodusServer) -> None:
    # A second project with its own token, its own agent and a run.
    other = unique("other")
    post(server, "", {"metadata": {"name": other}})
    other_token = post(
        server, f"/{other}/tokens", {"metadata": {"name": "team"}, "spec": {"role": "write"}}
    )["token"]
    post(
        server,
        f"/{other}/agents",
        {
            "apiVersion": "nodus.dev/v1",
            "kind": "Agent",
            "metadata": {"name": "private-agent"},
            "spec": {"system": "x", "model": {"access": "Nodus"}, "perRunMaxCostUSD": "0.50"},
        },
        other_token,
    )
    post(
        server,
        f"/{other}/agentruns",
        {
            "apiVersion": "nodus.dev/v1",
            "kind": "AgentRun",
            "metadata": {"name": "private-run"},
            "spec": {"agent": "private-agent", "input": "the other project's secret"},
        },
        other_token,
    )
    # Signed in with a token of default only: the other project's run, by URL, answers
    # Forbidden (the same as a project that does not exist) and shows nothing of it.
    mine = post(
        server, "/default/tokens", {"metadata": {"name": unique("mine")}, "spec": {"role": "write"}}
    )["token"]
    sign_in(browser, server, mine)
    wait_for(browser, lambda d: d.current_url.endswith("/console/p/default/agents"))
    projects = browser.find_elements(By.CSS_SELECTOR, "#projects a")
    assert [a.text for a in projects] == ["default"]
    for project, page in (
        (other, f"/console/p/{other}/runs/private-run"),
        (other, f"/console/p/{other}/agents"),
        (other, f"/console/p/{other}/credits"),
        (other, f"/console/p/{other}/runs/private-run/steps/0"),
        (other, f"/console/p/{other}/runs?agent=private-agent"),
        (other, f"/console/p/{other}/compare?a=x&b=y"),
        ("nowhere", "/console/p/nowhere/runs/private-run"),
    ):
        browser.get(f"{server.url}{page}")
        assert browser.find_element(By.TAG_NAME, "h1").text == "403 Forbidden", page
        assert browser.find_element(By.ID, "problem").text == (
            f'this token does not hold project "{project}"'
        )
        assert "secret" not in browser.page_source
        assert mine not in browser.page_source
    shot(browser, "forbidden")
    # Its owner sees it.
    sign_in(browser, server, other_token)
    wait_for(browser, lambda d: d.current_url.endswith(f"/console/p/{other}/agents"))
    browser.get(f"{server.url}/console/p/{other}/runs/private-run")
    assert browser.find_element(By.ID, "input").text == "the other project's secret"


def test_every_answer_has_the_policy_and_actions_need_the_csrf_token(
    server: NodusServer, agent: nodus.ClaudeAgent
) -> None:
    run = agent.submit("Keep going", keep_alive=True)
    run.wait(timeout=60)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        client.post("/console/signin", data={"token": TOKEN})
        page = client.get(f"/console/p/default/runs/{run.name}")
        assert page.status_code == 200
        assert TOKEN not in page.text
        for answer in (
            page,
            client.get("/console/signin"),
            client.get("/console/assets/console.js"),
            client.get("/console/p/default/agents?fragment=1"),
            client.get("/console/p/other/agents"),
        ):
            policy = answer.headers["content-security-policy"]
            assert "default-src 'self'" in policy and "script-src 'self'" in policy
            assert "unsafe-inline" not in policy
        # No inline script or handler in any page.
        # (An attribute named on…: the page's words may say "on" or "one".)
        assert "<script>" not in page.text
        assert re.search(r"\son[a-z]+\s*=", page.text) is None
        # A cancel without the form's token, or with another, is refused; the run goes on.
        for data in ({}, {"csrf": "0" * 64}):
            refused = client.post(f"/console/p/default/runs/{run.name}/cancel", data=data)
            assert refused.status_code == 403
            assert "csrf: must be the form&#39;s token of this session" in refused.text
        assert api(server, f"/agentruns/{run.name}")["status"]["phase"] == "Waiting"
        # Without a session, a fragment or the event stream answers 401 (the page reloads
        # into sign-in), and an action goes to sign-in without doing anything.
        with httpx.Client(base_url=server.url, timeout=30) as stranger:
            assert stranger.get("/console/p/default/agents?fragment=1").status_code == 401
            assert stranger.get("/console/p/default/events").status_code == 401
            action = stranger.post(f"/console/p/default/runs/{run.name}/cancel")
            assert action.status_code == 303
            assert action.headers["location"] == "/console/signin"
        assert api(server, f"/agentruns/{run.name}")["status"]["phase"] == "Waiting"
        # An empty message is refused, naming the field (the engine's rule, as over the API:
        # a message of only spaces is a message).
        csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        empty = client.post(
            f"/console/p/default/runs/{run.name}/message", data={"csrf": csrf, "payload": ""}
        )
        assert empty.status_code == 422
        assert "payload" in empty.text
        done = client.post(f"/console/p/default/runs/{run.name}/cancel", data={"csrf": csrf})
        assert done.status_code == 303
    run.wait(timeout=30)
    assert run.status.phase == "Cancelled"


def percent(value: float) -> str:
    """A fraction as the console writes it: a percentage with one decimal."""
    return f"{value * 100:.1f} %"


def test_an_evaluation_group_its_results_and_a_case_followed_to_its_run(
    browser: WebDriver, server: NodusServer
) -> None:
    """An evaluation group of four cases graded `exact`: one passes, one fails, one fails with
    an answer that holds markup (shown as text in the evidence), and one is unscored because
    its run failed. The group page shows scored, pending, pass rate with its interval and
    bracket, mean reward and the unscored cases by reason; the Results view lists each case
    with the grader's evidence and links it to its AgentRun."""
    environment = unique("console-env")
    post(
        server,
        "/default/environments",
        {
            "apiVersion": "nodus.dev/v1",
            "kind": "Environment",
            "metadata": {"name": environment},
            "spec": {
                "version": "1.0.0",
                "splits": {
                    "test": {
                        "tasks": [
                            {
                                "id": "hello",
                                "prompt": "Run `echo hello`",
                                "hidden": {"expected": "It is hello."},
                            },
                            {
                                "id": "goodbye",
                                "prompt": "Run `echo goodbye`",
                                "hidden": {"expected": "It is hello."},
                            },
                            {
                                "id": "markup",
                                "prompt": f"Run `echo '{XSS}'`",
                                "hidden": {"expected": "It is hello."},
                            },
                            {
                                "id": "refused",
                                "prompt": "Say hello [refuse]",
                                "hidden": {"expected": "It is hello."},
                            },
                        ]
                    }
                },
                "grader": {"kind": "exact"},
            },
        },
    )
    worker = nodus.ClaudeAgent(
        unique("evaluee"), system="Answer briefly.", families=["haiku"], per_run_max_cost="0.05"
    )
    group = nodus.AgentGroup.create(
        unique("eval"),
        agent=worker,
        max_active=4,
        max_cost="0.40",
        evaluation={
            "environment": f"{environment}@1.0.0",
            "split": "test",
            "tasks": 4,
            "repetitions": 1,
            "seed": 1,
            "timeout": "5m",
        },
    )
    # One of its runs failed, so the group did.
    assert group.wait(timeout=120).phase == "Failed"
    summary = api(server, f"/agentgroups/{group.name}")["status"]["evaluation"]
    # By hand: 3 scored (1 pass, 2 fail), 1 unscored (RunFailed), none pending.
    assert (summary["scored"], summary["pending"], summary["unscored"]) == (3, 0, {"RunFailed": 1})
    results = api(server, f"/agentgroups/{group.name}/results")["items"]

    sign_in(browser, server)
    wait_for(browser, lambda d: d.current_url.endswith("/agents"))
    browser.get(f"{server.url}/console/p/default/groups/{group.name}")
    wait_for(browser, lambda d: d.find_elements(By.ID, "evaluation"))

    def text(element_id: str) -> str:
        return str(browser.find_element(By.ID, element_id).text)

    assert text("eval-cases") == "4"
    assert text("eval-scored") == "3"
    assert text("eval-pending") == "0"
    assert text("eval-pass-rate") == "33.3 %"
    assert text("eval-mean-reward") == "0.333"
    # 1 of 4 passed if the unscored case had failed, 2 of 4 if it had passed.
    assert text("eval-bracket") == "25.0 % – 50.0 %"
    interval = summary["interval"]
    assert text("eval-interval") == f"{percent(interval['low'])} – {percent(interval['high'])}"
    reasons = {
        tr.get_attribute("data-reason"): tr.find_elements(By.TAG_NAME, "td")[1].text
        for tr in browser.find_elements(By.CSS_SELECTOR, "#unscored tr[data-reason]")
    }
    assert reasons == {"RunFailed": "1"}
    shot(browser, "evaluation")

    browser.find_element(By.ID, "results-link").click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "results"))
    assert browser.current_url.endswith(f"/groups/{group.name}/results")
    rows = {}
    for tr in browser.find_elements(By.CSS_SELECTOR, "#results tr[data-task]"):
        cells = [c.text for c in tr.find_elements(By.TAG_NAME, "td")]
        rows[tr.get_attribute("data-task")] = cells
    assert set(rows) == {"hello", "goodbye", "markup", "refused"}
    for case in results:
        cells = rows[case["taskId"]]
        assert cells[2] == case["state"]
        assert cells[3] == case.get("verdict", case.get("reason"))
        assert cells[5] == (case.get("evidence") or "—")
        assert cells[6] == case["run"]
    assert rows["hello"][2:5] == ["Scored", "pass", "1.000"]
    assert rows["goodbye"][2:5] == ["Scored", "fail", "0.000"]
    assert rows["refused"][2:5] == ["Unscored", "RunFailed", "—"]
    assert rows["refused"][7] == "Failed"
    # The answer's markup is in the evidence as text; nothing of it ran.
    assert 'got "It is <script>window.__pwned=1</script><img src=x onerror=' in rows["markup"][5]
    assert browser.execute_script("return window.__pwned === undefined;") is True
    assert not browser.find_elements(By.CSS_SELECTOR, "#results script, #results img")
    shot(browser, "evaluation-results")

    wrong = next(c for c in results if c["taskId"] == "goodbye")
    browser.find_element(
        By.CSS_SELECTOR, f'#results tr[data-task="goodbye"] a[href$="/runs/{wrong["run"]}"]'
    ).click()
    wait_for(browser, lambda d: d.current_url.endswith(f"/runs/{wrong['run']}"))
    wait_for(browser, lambda d: d.find_element(By.ID, "phase").text == "Succeeded")
    assert wrong["run"] in browser.find_element(By.TAG_NAME, "h1").text
    assert "It is goodbye." in browser.page_source


def steps_of(server: NodusServer, run: str) -> List[Dict[str, Any]]:
    items: List[Dict[str, Any]] = api(server, f"/agentruns/{run}/steps")["items"]
    return items


def test_resolve_a_parked_run_in_the_console(browser: WebDriver, fake_model: Any) -> None:
    """A run whose server is killed (SIGKILL) while its command runs parks in NeedsResolution
    on the next server (the command's outcome is unknown); in the console its page offers the
    three resolutions, and `retry` runs the command again: the run succeeds with its answer."""
    directory = tempfile.mkdtemp(prefix="nodus-console-park-")
    store = f"sqlite://{directory}/nodus.db"
    first = NodusServer(fake_model.url, store=store, directory=directory)
    try:
        client = nodus.Client(server=first.url, token=TOKEN, project="default")
        agent = nodus.ClaudeAgent(unique("parks"), system="x", families=["haiku"], client=client)
        run = agent.submit("Run `sleep 4; echo resumed`")
        wait_for(
            browser,
            lambda _: any(
                s["kind"] == "Command" and s["state"] == "Started"
                for s in steps_of(first, run.name)
            ),
        )
    finally:
        first.kill()
    second = NodusServer(fake_model.url, store=store, directory=directory)
    try:
        wait_for(
            browser,
            lambda _: api(second, f"/agentruns/{run.name}")["status"]["phase"] == "NeedsResolution",
        )
        sign_in(browser, second)
        wait_for(browser, lambda d: d.current_url.endswith("/agents"))
        browser.get(f"{second.url}/console/p/default/runs/{run.name}")
        wait_for(browser, lambda d: d.find_element(By.ID, "phase").text == "NeedsResolution")
        for action in ("retry", "recordFailed", "cancel"):
            assert browser.find_element(By.ID, f"resolve-{action}").is_displayed()
        # The transcript marks the step the run is parked on, and what to decide.
        parked = browser.find_element(By.CSS_SELECTOR, "#transcript li.parked")
        command = next(s for s in steps_of(second, run.name) if s["kind"] == "Command")
        assert parked.get_attribute("data-seq") == str(command["seq"])
        assert "Parked on command" in parked.text
        assert "retry runs it again" in parked.find_element(By.CSS_SELECTOR, ".resolve").text
        shot(browser, "parked")
        browser.find_element(By.ID, "resolve-retry").click()
        wait_for(browser, lambda d: d.find_element(By.ID, "phase").text == "Succeeded")
        assert not browser.find_elements(By.ID, "resolve-retry")
        assert "It is resumed." in browser.page_source
        document = api(second, f"/agentruns/{run.name}")
        assert document["status"]["phase"] == "Succeeded"
        answer = httpx.get(
            f"{second.url}{API}/agentruns/{run.name}/answer",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ).json()
        assert answer["answer"] == "It is resumed."
        commands = [s for s in steps_of(second, run.name) if s["kind"] == "Command"]
        assert len(commands) >= 1 and commands[-1]["state"] == "Completed", commands
    finally:
        second.stop()
