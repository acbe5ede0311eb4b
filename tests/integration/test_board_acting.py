"""People acting from the runs board, in Chromium against the real broker: the list grouped, paged and filtered in
the URL, a run found by id, a button that publishes a signed operator_action on agent.steps, a group action (one
per run), abandoned runs off the list; and without a person's credentials nothing is published, and it is counted."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import msgspec
import pytest
from aiokafka import AIOKafkaProducer

from dev.localkafka import free_port
from loopwarden.codecs import encode
from loopwarden.codecs.events import OperatorAction, RecoveryAction
from loopwarden.stages.topics import ensure_topics
from loopwarden.trust import SigningKey, TrustedVerifiers
from tests.integration.harness import create_topic, env_for, read_all, run, stop_process, unique_config
from tests.integration.test_board_browser import ARTIFACTS, CHROMEDRIVER, CHROMIUM, CONTRAST, browser, get, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
READ_TOKEN = "board-read-token-0123456789abcdef"
DANA_TOKEN = "token-of-dana-0123456789abcdef"
STUCK_RUNS, FAILED_RUNS = 230, 20
START = int(time.time() * 1000) - 3_600_000


def health(run_id: str, state: str, agent: str, reason: str, i: int) -> list[bytes]:
    """A run's two transitions: started (its run_started ts) and the state it needs a person in."""
    ev = {"reported_cause": None, "derived_cause": None, "fired": [], "step_count": 1, "segments": 1,
          "tool_errors": 0, "finish_reason": None, "disagreements": [], "receipt_ids": [], "approval": None}
    base = {"type": "health_transition", "run_id": run_id, "agent": agent, "policy_version": "p1", "evidence": ev}
    return [msgspec.json.encode({**base, "seq": 1, "ts": START + i, "emitted_ts": START + i, "from_state": None,
                                 "to_state": "RUNNING", "reason": "started"}),
            msgspec.json.encode({**base, "seq": 2, "ts": START + 600_000 + i, "emitted_ts": START + 600_000 + i,
                                 "from_state": "RUNNING", "to_state": state, "reason": reason})]


async def send(config, records: list[tuple[str, str, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=config.bootstrap, linger_ms=5)
    await producer.start()
    try:
        for topic, key, value in records:
            await producer.send(topic, value, key=key.encode())
        await producer.flush()
    finally:
        await producer.stop()


def operator_actions(config) -> list[tuple[bytes, OperatorAction]]:
    return [(r.key, msgspec.json.decode(r.value, type=OperatorAction))
            for r in run(read_all(config, config.steps_topic, timeout_s=60))]


def post(url: str, body: dict, token: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def act_requests(url: str) -> dict[str, float]:
    status, body = get(url + "metrics", READ_TOKEN)
    assert status == 200
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("loopwarden_board_act_requests_total{"):
            out[line.split('outcome="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return out


@pytest.fixture
def board(kafka, tmp_path: Path):
    """A `loopwarden board` with a signing key and one user, over a fleet of 230 STUCK runs of one agent and 20
    FAILED runs of another (agent.health), its actions topic created; yields (config, url, key)."""
    tag = uuid.uuid4().hex[:8]
    config = unique_config(kafka.bootstrap, actions_topic=f"actions-{tag}")
    run(ensure_topics(config))
    run(create_topic(config.bootstrap, config.actions_topic, config.partitions))
    records = []
    for i in range(STUCK_RUNS):
        records += [(config.health_topic, f"inv-{i:03d}", v) for v in health(f"inv-{i:03d}", "STUCK", "invoice-agent",
                                                                               "inactivity_timeout", i)]
    for i in range(FAILED_RUNS):
        records += [(config.health_topic, f"dep-{i:03d}", v) for v in health(f"dep-{i:03d}", "FAILED", "deploy-agent",
                                                                               "tool_error", 1000 + i)]
    run(send(config, records))
    key = SigningKey.generate("board-1")
    key.save(tmp_path / "board.pem")
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    env = {**env_for(config), "LOOPWARDEN_BOARD_PORT": str(port), "LOOPWARDEN_TOKEN": READ_TOKEN,
           "LOOPWARDEN_BOARD_USERS": f"dana={DANA_TOKEN}", "LOOPWARDEN_BOARD_SIGNING_KEY": str(tmp_path / "board.pem"),
           "LOOPWARDEN_ACTIONS_TOPIC": config.actions_topic}
    log = open(tmp_path / "board.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "loopwarden.cli", "board"], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        def caught_up():
            status, body = get(url + "healthz")
            return (status == 200 and json.loads(body)["runs"] == STUCK_RUNS + FAILED_RUNS) or proc.poll() is not None

        wait(caught_up, 60, "the board to read the fleet")
        assert proc.poll() is None, (tmp_path / "board.log").read_text()[-3000:]
        yield config, url, key
    finally:
        stop_process(proc, timeout_s=15)
        log.close()
    assert proc.returncode == 0, (tmp_path / "board.log").read_text()[-3000:]


def accessible(driver) -> None:
    """Every control shown is labelled and every text has a contrast of at least 4.5:1 (WCAG AA)."""
    unlabelled = driver.execute_script(
        "return Array.from(document.querySelectorAll('input, select, button, textarea')).filter(e => e.offsetParent)"
        ".filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim())"
        ".map(e => e.id || e.outerHTML.slice(0, 60))")
    assert unlabelled == []
    worst = min(driver.execute_script(CONTRAST))
    assert worst[0] >= 4.5, worst


def test_a_person_acts_from_the_board_in_a_browser(board, tmp_path: Path) -> None:
    """Signed in with their own token, a person sees the runs grouped with counts, pages past 200, keeps the filters
    in the URL, finds a run by id, retries it with a reason (a signed operator_action naming them lands on
    agent.steps, keyed by the run), escalates a whole group (one action per run, each its own request id), and a
    run abandoned (a recovery_action on agent.actions) leaves the list and shows who decided and why."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    assert Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists(), "run `make chromium`"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    config, url, key = board
    trusted = TrustedVerifiers.parse(key.setting)
    driver = browser(tmp_path)
    try:
        driver.get(url)
        wait(lambda: driver.find_element(By.ID, "token").is_displayed(), what="the token form")
        driver.find_element(By.ID, "token").send_keys(DANA_TOKEN, Keys.ENTER)
        rows = lambda: [r.get_attribute("data-run-id") for r in driver.find_elements(By.CSS_SELECTOR, "#attention tbody tr")]  # noqa: E731
        wait(lambda: len(rows()) == 200, 20, "the first page of 200")
        assert rows() == [f"inv-{i:03d}" for i in range(200)]  # oldest in state first
        groups = {(tr.get_attribute("data-agent"), tr.get_attribute("data-state"), tr.get_attribute("data-reason")):
                  int(tr.find_elements(By.TAG_NAME, "td")[3].text)
                  for tr in driver.find_elements(By.CSS_SELECTOR, "#groups tbody tr")}
        assert groups == {("invoice-agent", "STUCK", "inactivity_timeout"): STUCK_RUNS,
                          ("deploy-agent", "FAILED", "tool_error"): FAILED_RUNS}
        assert driver.find_element(By.ID, "page-info").text == "rows 1–200 of 250"

        driver.find_element(By.ID, "page-next").click()
        wait(lambda: rows()[:1] == ["inv-200"], what="the second page")
        assert rows() == [f"inv-{i:03d}" for i in range(200, STUCK_RUNS)] + [f"dep-{i:03d}" for i in range(FAILED_RUNS)]
        assert driver.execute_script("return location.hash") == "#/?page=2"

        Select(driver.find_element(By.ID, "filter-agent")).select_by_value("deploy-agent")
        wait(lambda: rows() == [f"dep-{i:03d}" for i in range(FAILED_RUNS)], what="the agent filter")
        assert driver.execute_script("return location.hash") == "#/?agent=deploy-agent"
        driver.get(url + "#/?state=STUCK&page=2")  # a link someone sent: the filters come from the URL
        wait(lambda: rows() == [f"inv-{i:03d}" for i in range(200, STUCK_RUNS)], what="the list from the URL")
        assert Select(driver.find_element(By.ID, "filter-state")).first_selected_option.get_attribute("value") == "STUCK"

        driver.find_element(By.ID, "find-id").send_keys("inv-007", Keys.ENTER)
        wait(lambda: driver.find_element(By.ID, "run-id").text == "inv-007"
             and driver.find_element(By.ID, "run-act").is_displayed(), what="the run found by id, with its buttons")
        driver.find_element(By.ID, "act-retry").click()  # no reason yet: nothing is sent
        assert "Give a reason" in driver.find_element(By.ID, "act-result").text
        driver.find_element(By.ID, "act-reason").send_keys("the ERP is back up")
        driver.find_element(By.ID, "act-retry").click()
        wait(lambda: "Published retry as dana" in driver.find_element(By.ID, "act-result").text, 20, "the retry sent")
        accessible(driver)
        driver.save_screenshot(str(ARTIFACTS / "board-act.png"))
        sent = operator_actions(config)
        assert len(sent) == 1
        run_key, retry = sent[0]
        assert run_key == b"inv-007" and (retry.run_id, retry.action, retry.reason, retry.actor) == \
            ("inv-007", "retry", "the ERP is back up", "dana")
        assert retry.run_started_ts == START + 7 and retry.signature.key_id == "board-1"
        assert trusted.why_untrusted(retry) is None

        driver.get(url + "#/?agent=deploy-agent")
        wait(lambda: driver.find_element(By.ID, "group-act").is_displayed(), what="the group action form")
        assert "(20 runs)" in driver.find_element(By.ID, "group-act-count").text
        accessible(driver)
        Select(driver.find_element(By.ID, "group-action")).select_by_value("escalate")
        driver.find_element(By.ID, "group-reason").send_keys("deploy tool down: platform team")
        driver.find_element(By.ID, "group-act-submit").click()
        wait(lambda: "Published 20 escalate actions" in driver.find_element(By.ID, "group-act-result").text, 20,
             "the group action sent")
        escalations = [a for _k, a in operator_actions(config) if a.action == "escalate"]
        assert sorted(a.run_id for a in escalations) == [f"dep-{i:03d}" for i in range(FAILED_RUNS)]
        assert len({a.request_id for a in escalations}) == FAILED_RUNS
        assert all(trusted.why_untrusted(a) is None and a.actor == "dana" for a in escalations)

        # The worker's record of a person's abandon: the run leaves the list, and its page says who and why.
        abandon = RecoveryAction(action_id="dep-003:op:r-1", run_id="dep-003", agent="deploy", job_id="dep-003", attempt=1,
                                 next_attempt=None, action="abandon", reason="customer cancelled", ts=START + 900_000,
                                 not_before_ts=START + 900_000, next_policy=None, escalate_to=None,
                                 decided_by="person:board-1/dana")
        run(send(config, [(config.actions_topic, "dep-003", encode(abandon))]))
        wait(lambda: "dep-003" not in rows() and len(rows()) == FAILED_RUNS - 1, 20, "the abandoned run off the list")
        driver.get(url + "#/?view=closed")
        wait(lambda: rows() == ["dep-003"], what="the abandoned run under the closed filter")
        driver.get(url + "#/run/dep-003")
        wait(lambda: driver.find_elements(By.CSS_SELECTOR, '#run-actions tr[data-action-id="dep-003:op:r-1"]'),
             what="the action on the run page")
        text = driver.find_element(By.ID, "run-actions").text
        assert "abandon" in text and "person:board-1/dana" in text and "customer cancelled" in text
        assert not driver.find_element(By.ID, "run-act").is_displayed()  # closed: nothing for a person to do
        assert driver.find_element(By.CSS_SELECTOR, '#run-attempts tr[data-attempt="1"]').text.startswith("1 dep-003")
    finally:
        driver.quit()


def test_without_a_persons_credentials_nothing_is_published_and_it_is_counted(board) -> None:
    """No token, a wrong one, or the shared read token: every request to act is refused, counted by why, and
    agent.steps stays empty; a signed-in user's request then publishes exactly one action."""
    config, url, key = board
    body = {"action": "retry", "reason": "try again"}
    assert post(url + "api/runs/inv-001/act", body, None)[0] == 401
    assert post(url + "api/runs/inv-001/act", body, "not-a-token-of-anyone-here")[0] == 401
    assert post(url + "api/act", {**body, "match": {"agent": "invoice-agent"}}, None)[0] == 401
    status, answer = post(url + "api/runs/inv-001/act", body, READ_TOKEN)
    assert status == 403 and "own token" in answer["error"]
    assert post(url + "api/runs/inv-001/act", {"action": "restart", "reason": "x"}, DANA_TOKEN)[0] == 400
    assert post(url + "api/runs/nobody/act", body, DANA_TOKEN)[0] == 404
    counted = act_requests(url)
    assert (counted["unauthenticated"], counted["not_a_user"], counted["invalid"], counted["unknown_run"],
            counted["published"]) == (3, 1, 1, 1, 0)
    assert operator_actions(config) == []
    status, answer = post(url + "api/runs/inv-001/act", body, DANA_TOKEN)
    assert status == 202 and answer["published"] == 1
    sent = operator_actions(config)
    assert [(k, a.run_id, a.actor) for k, a in sent] == [(b"inv-001", "inv-001", "dana")]
    assert act_requests(url)["published"] == 1


def test_the_boards_api_pages_finds_and_refuses_a_bad_filter_naming_it(board) -> None:
    """Over HTTP: a page past 200 with its total, groups with counts, a run found by id or its start, and a bad
    view, offset or limit answered 400 naming the value."""
    config, url, key = board
    status, body = get(url + "api/snapshot?state=STUCK&offset=200", READ_TOKEN)
    snap = json.loads(body)
    assert status == 200 and snap["matched"] == STUCK_RUNS and len(snap["attention"]) == STUCK_RUNS - 200
    assert snap["groups"] == [{"agent": "invoice-agent", "state": "STUCK", "reason": "inactivity_timeout",
                               "runs": STUCK_RUNS}]
    assert json.loads(get(url + "api/find?q=dep-007", READ_TOKEN)[1])["runs"] == ["dep-007"]
    assert json.loads(get(url + "api/find?q=dep-01", READ_TOKEN)[1])["runs"] == [f"dep-{i:03d}" for i in range(10, 20)]
    for query, named in (("view=everything", "view='everything'"), ("offset=-5", "offset='-5'"),
                         ("limit=5000", "limit='5000'"), ("state=BORED", "state='BORED'")):
        status, body = get(url + "api/snapshot?" + query, READ_TOKEN)
        assert status == 400 and named in json.loads(body)["error"], (query, body)
    status, answer = post(url + "api/act", {"action": "retry", "reason": "x", "match": {"agent": "nobody"}}, DANA_TOKEN)
    assert status == 409 and operator_actions(config) == []
