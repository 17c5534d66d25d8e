"""The console's views of time and conversation, in headless Chromium against the real server:
a run's transcript (read from its journal) and its timeline (an SVG drawn by the server),
each checked against what the API answers for the same run."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime, timezone
from typing import Any, Dict, List

import httpx
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from test_console import API, TOKEN, XSS, api, browser, shot, sign_in, unique, wait_for

import nodus
from conftest import NodusServer

__all__ = ["browser"]


def nanos(timestamp: str) -> int:
    """An RFC 3339 UTC timestamp (``…T10:00:01.123456789Z``) in nanoseconds since the epoch:
    whole, as the server wrote it (Python's datetime keeps microseconds only)."""
    whole, _, fraction = timestamp.rstrip("Z").partition(".")
    seconds = datetime.fromisoformat(whole).replace(tzinfo=timezone.utc).timestamp()
    return int(seconds) * 1_000_000_000 + int((fraction + "000000000")[:9])


def millis(step: Dict[str, Any]) -> int:
    """A finished step's duration in whole milliseconds, as the server rounds it (down)."""
    return (nanos(step["finishedAt"]) - nanos(step["startedAt"])) // 1_000_000


def test_the_transcript_and_timeline_of_a_run_with_two_commands_and_a_message(
    browser: Any, server: NodusServer
) -> None:
    agent = nodus.ClaudeAgent(
        unique("talker"), system="You are <b>careful</b>.", families=["haiku"]
    )
    run = agent.submit("Run `echo first step`", keep_alive=True)
    run.wait(timeout=60)
    message = f"Run `echo '{XSS}'`"
    run.send("message", message)
    run.wait(timeout=60)
    closed = httpx.post(
        f"{server.url}{API}/agentruns/{run.name}/close",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert closed.status_code < 300, closed.text
    run.wait(timeout=60)
    document = api(server, f"/agentruns/{run.name}")
    assert document["status"]["phase"] == "Succeeded"
    steps: List[Dict[str, Any]] = api(server, f"/agentruns/{run.name}/steps")["items"]
    turns = document["status"]["turns"]
    assert len(turns) == 2

    sign_in(browser, server)
    wait_for(browser, lambda d: d.current_url.endswith("/agents"))
    browser.get(f"{server.url}/console/p/default/runs/{run.name}")
    wait_for(browser, lambda d: d.find_elements(By.ID, "transcript"))

    # The transcript, in order: the system prompt (folded), the input, the first command and
    # its output, the first answer, the message, the second command, the second answer.
    entries = browser.find_elements(By.CSS_SELECTOR, "#transcript > li.entry")
    classes = [e.get_attribute("class").split()[1] for e in entries]
    assert classes == [
        "system",
        "prompt",
        "tool-call",
        "reply",
        "answer",
        "prompt",
        "tool-call",
        "reply",
        "answer",
    ], classes
    system = entries[0].find_element(By.TAG_NAME, "details")
    assert system.get_attribute("open") is None, "the system prompt starts folded"
    assert "You are <b>careful</b>." in system.get_attribute("textContent")
    text = [e.find_element(By.CSS_SELECTOR, "pre").text for e in entries[1:]]
    assert text[0] == "Run `echo first step`"
    assert text[1] == "$ echo first step"
    assert entries[2].find_element(By.CSS_SELECTOR, ".exit").text == "exit 0"
    assert entries[2].find_element(By.CSS_SELECTOR, ".output").text == "first step"
    assert text[2] == text[3] == "It is first step."
    assert text[4] == message
    assert text[5] == f"$ echo '{XSS}'"
    assert entries[6].find_element(By.CSS_SELECTOR, ".output").text == XSS
    assert text[6] == text[7] == f"It is {XSS}."
    assert text[7] == api(server, f"/agentruns/{run.name}/answer")["answer"]
    # Each turn's model, cost and tokens are the API's status.turns.
    prompts = [entries[1], entries[5]]
    for prompt, turn in zip(prompts, turns):
        assert prompt.find_element(By.CSS_SELECTOR, ".model").text == turn["model"]
        assert prompt.find_element(By.CSS_SELECTOR, ".cost").text == turn["costUSD"]
        assert prompt.find_element(By.CSS_SELECTOR, ".tokens").text == (
            f"{turn['inputTokens']} in / {turn['outputTokens']} out"
        )
    # Each command's step link is the API's command step.
    commands = [s["seq"] for s in steps if s["kind"] == "Command"]
    shown = [
        int(e.get_attribute("data-seq")) for e in entries if "tool-call" in e.get_attribute("class")
    ]
    assert shown == commands
    # Markup in the output and the message is text: nothing ran, nothing became an element.
    assert browser.execute_script("return window.__pwned;") is None
    assert (
        browser.find_elements(By.CSS_SELECTOR, "#transcript img, #transcript script, #transcript b")
        == []
    )

    # The timeline: one mark per step, each as wide as its duration at the SVG's one scale.
    svg = browser.find_element(By.ID, "timeline")
    scale = float(svg.get_attribute("data-scale"))
    marks = svg.find_elements(By.CSS_SELECTOR, "rect.mark")
    assert [int(m.get_attribute("data-seq")) for m in marks] == [s["seq"] for s in steps]
    first = min(nanos(s["startedAt"]) for s in steps)
    last = max(nanos(s["finishedAt"]) for s in steps)
    assert int(svg.get_attribute("data-span-ms")) == max((last - first) // 1_000_000, 1)
    for mark, step in zip(marks, steps):
        assert int(mark.get_attribute("data-ms")) == millis(step), step
        width = float(mark.get_attribute("width"))
        assert abs(width - millis(step) * scale) < 1e-3, (step, width, scale)
    # Its tooltip names the step; the command's markup is text there too.
    command = marks[commands[1]].find_element(By.XPATH, "..")
    tooltip = command.find_element(By.TAG_NAME, "title").get_attribute("textContent")
    assert tooltip.startswith(f"step {commands[1]}: Command, ")
    assert f"echo '{XSS}'" in tooltip
    assert browser.find_elements(By.CSS_SELECTOR, "#timeline script, #timeline img") == []
    assert browser.execute_script("return window.__pwned;") is None
    shot(browser, "run-transcript")
    # Dark mode follows the system's.
    browser.execute_cdp_cmd(
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": "dark"}]},
    )
    background = browser.execute_script("return getComputedStyle(document.body).backgroundColor;")
    assert background == "rgb(13, 17, 23)", background
    shot(browser, "run-dark")
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    # A mark is a link to its step, reached by keyboard: focus it and press Enter.
    link = marks[commands[0]].find_element(By.XPATH, "..")
    browser.execute_script("arguments[0].focus();", link)
    assert browser.switch_to.active_element == link
    link.send_keys(Keys.ENTER)
    wait_for(browser, lambda d: d.current_url.endswith(f"/steps/{commands[0]}"))
    assert "echo first step" in browser.find_element(By.ID, "intent").text
    assert browser.find_element(By.ID, "stdout").text == "first step"


def test_the_group_charts_show_the_counts_and_spend_the_api_shows(
    browser: Any, server: NodusServer
) -> None:
    worker = nodus.ClaudeAgent(
        unique("charted"), system="Answer briefly.", families=["haiku"], per_run_max_cost="0.05"
    )
    group = nodus.AgentGroup.create(unique("charts"), agent=worker, max_active=2, max_cost="0.40")
    group.submit(
        [("a", "Say a"), ("b", "Run `echo b`"), ("c", "Say c [refuse]"), ("d", "Say d", ["a"])]
    )
    group.wait(timeout=60)
    document = api(server, f"/agentgroups/{group.name}")
    counts = document["status"]["counts"]
    sign_in(browser, server)
    wait_for(browser, lambda d: d.current_url.endswith("/agents"))
    browser.get(f"{server.url}/console/p/default/groups/{group.name}")
    wait_for(browser, lambda d: d.find_elements(By.ID, "progress"))
    legend = {
        li.get_attribute("data-series"): int(li.find_element(By.CSS_SELECTOR, ".count").text)
        for li in browser.find_elements(By.CSS_SELECTOR, "#progress-legend li")
    }
    done = counts["succeeded"] + counts["failed"] + counts["cancelled"]
    assert legend == {
        "queued": counts["queued"],
        "active": counts["active"],
        "waiting": counts["waiting"],
        "parked": counts["parked"],
        "done": done,
    }
    assert done == 4 and counts["failed"] == 1
    # The chart's last moment, derived from the members' timestamps, is the same.
    now = browser.find_element(By.ID, "progress-now")
    assert int(now.get_attribute("data-queued")) == counts["queued"]
    assert int(now.get_attribute("data-started")) == (
        counts["active"] + counts["waiting"] + counts["parked"]
    )
    assert int(now.get_attribute("data-done")) == done
    # Spend: the members' costs add up to the group's, against its cap.
    total = document["status"]["cost"]["totalUSD"]
    spend = browser.find_element(By.ID, "spend-now")
    assert spend.get_attribute("data-total") == total
    assert browser.find_element(By.ID, "spend-legend").text == (
        f"Spent {total} USD of the cap, 0.40 USD"
    )
    assert len(browser.find_elements(By.CSS_SELECTOR, "#spend line.cap")) == 1
    shot(browser, "group-charts")
    browser.set_window_size(390, 844)
    # Nothing wider than the phone: wide tables scroll inside their own frame.
    assert browser.execute_script("return document.documentElement.scrollWidth;") <= 390
    shot(browser, "group-phone")
    browser.set_window_size(1280, 900)


def test_paging_through_a_1000_run_group_visits_every_run_once(
    browser: Any, server: NodusServer
) -> None:
    """A page of 100 at a time through the group page's Next links: every run once, in the
    API's creation order. (One slot, and cancelled at the end: the runs need not run.)"""
    worker = nodus.ClaudeAgent(unique("paged"), system="x", families=["haiku"])
    group = nodus.AgentGroup.create(unique("thousand"), agent=worker, max_active=1)
    try:
        group.submit([(f"t{i:04d}", f"Say {i}") for i in range(1000)], seal=False)
        listed = api(server, f"/agentruns?fieldSelector=spec.group={group.name}")["items"]
        names = [r["metadata"]["name"] for r in listed]
        assert len(names) == 1000
        sign_in(browser, server)
        wait_for(browser, lambda d: d.current_url.endswith("/agents"))
        browser.get(f"{server.url}/console/p/default/groups/{group.name}?limit=100")
        seen: List[str] = []
        pages = 0
        while True:
            wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "nav.pager"))
            rows = browser.execute_script(
                "return Array.from(document.querySelectorAll('tr[data-run]'))"
                ".map(function (r) { return r.getAttribute('data-run'); });"
            )
            assert len(rows) == 100
            seen.extend(rows)
            pages += 1
            # Read at once, in the page: its live part is replaced as the group's runs go on.
            following = browser.execute_script(
                "var a = document.getElementById('next-page');"
                "return a ? a.href : (document.getElementById('last-page') ? 'last' : null);"
            )
            assert following is not None
            if following == "last":
                break
            browser.get(following)
        assert pages == 10
        assert seen == names
        assert len(set(seen)) == 1000
        # The run list page, filtered by the group and a phase: the same paging.
        browser.get(f"{server.url}/console/p/default/runs?group={group.name}&limit=1000")
        wait_for(browser, lambda d: d.find_elements(By.ID, "filters"))
        assert len(browser.find_elements(By.CSS_SELECTOR, "tr[data-run]")) == 1000
        assert browser.find_elements(By.ID, "last-page")
        # A bad limit is refused, naming the field.
        browser.get(f"{server.url}/console/p/default/runs?limit=0")
        assert browser.find_element(By.TAG_NAME, "h1").text == "400 Invalid"
        assert browser.find_element(By.ID, "problem").text.startswith(
            "limit: must be a whole number from 1 to 1000"
        )
    finally:
        httpx.post(
            f"{server.url}{API}/agentgroups/{group.name}/cancel",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=60,
        )


def test_a_compare_page_shows_what_nodus_eval_compare_says(
    browser: Any, server: NodusServer
) -> None:
    """A group graded by one version of an Environment, and its rescore by a second whose
    expected answers differ: one case lost, two gained, one passed by both."""
    environment = unique("paired")

    def version(number: str, expected: Dict[str, str]) -> None:
        post = httpx.post(
            f"{server.url}{API}/environments",
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "Environment",
                "metadata": {"name": environment},
                "spec": {
                    "version": number,
                    "splits": {
                        "test": {
                            "tasks": [
                                {
                                    "id": task,
                                    "prompt": f"Run `echo {task}`",
                                    "hidden": {"expected": answer},
                                }
                                for task, answer in expected.items()
                            ]
                        }
                    },
                    "grader": {"kind": "exact"},
                },
            },
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        )
        assert post.status_code in (200, 201), post.text

    version("1.0.0", {"a": "It is a.", "b": "no", "c": "no", "d": "It is d."})
    version("1.0.1", {"a": "no", "b": "It is b.", "c": "It is c.", "d": "It is d."})
    worker = nodus.ClaudeAgent(
        unique("compared"), system="x", families=["haiku"], per_run_max_cost="0.05"
    )
    base = nodus.AgentGroup.create(
        unique("base"),
        agent=worker,
        max_active=4,
        max_cost="0.40",
        evaluation={
            "environment": f"{environment}@1.0.0",
            "split": "test",
            "tasks": 4,
            "repetitions": 1,
            "seed": 3,
            "timeout": "5m",
        },
    )
    base.wait(timeout=120)
    rescore = base.rescore(f"{environment}@1.0.1")
    rescore.wait(timeout=120)
    cli = subprocess.run(
        [os.environ["NODUS_BIN"], "eval", "compare", base.name, rescore.name],
        env={**os.environ, "NODUS_SERVER": server.url, "NODUS_TOKEN": TOKEN},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    line = next(x for x in cli.stdout.splitlines() if x.startswith("Difference B − A: "))
    difference, _, rest = line.removeprefix("Difference B − A: ").partition(" (95 % interval ")
    interval = rest.partition(", Newcombe")[0]
    assert difference == "+25.0 %", cli.stdout

    sign_in(browser, server)
    wait_for(browser, lambda d: d.current_url.endswith("/agents"))
    browser.get(f"{server.url}/console/p/default/groups/{base.name}")
    wait_for(browser, lambda d: d.find_elements(By.ID, "per-task"))
    # The per-task table: each task's pass rate with its interval.
    rates = {
        tr.get_attribute("data-task"): tr.find_element(By.CSS_SELECTOR, ".pass-rate").text
        for tr in browser.find_elements(By.CSS_SELECTOR, "#per-task tr[data-task]")
    }
    assert rates == {"a": "100.0 %", "b": "0.0 %", "c": "0.0 %", "d": "100.0 %"}
    shot(browser, "evaluation-per-task")
    # Compare with the rescore, by keyboard.
    choice = browser.find_element(By.ID, "compare-b")
    choice.send_keys(rescore.name)
    browser.find_element(By.ID, "compare").send_keys(Keys.ENTER)
    wait_for(browser, lambda d: d.find_elements(By.ID, "comparison"))
    assert browser.find_element(By.ID, "difference").text == difference
    assert browser.find_element(By.ID, "interval").text == interval
    assert browser.find_element(By.ID, "changes").text == "1, 2, 1, 0"
    discordant = {
        tr.get_attribute("data-task"): tr.find_element(By.CSS_SELECTOR, ".change").text
        for tr in browser.find_elements(By.CSS_SELECTOR, "#discordant tr[data-task]")
    }
    assert discordant == {"a": "lost", "b": "gained", "c": "gained"}
    shot(browser, "compare")
    browser.get(f"{server.url}/console/p/default/agents")
    wait_for(browser, lambda d: d.find_elements(By.ID, "agents"))
    assert browser.find_elements(By.CSS_SELECTOR, f'tr[data-agent="{worker.name}"]')
    shot(browser, "agents")
