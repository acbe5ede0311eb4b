"""The runs board in a real browser (Debian's chromium, headless, driven by Selenium with Debian's
chromedriver) against the real broker: live updates, filters, the run page, auth, accessibility."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgspec
import pytest
from aiokafka import AIOKafkaProducer

from dev.localkafka import free_port
from loopwarden.api.board.fleet import ATTENTION
from loopwarden.codecs import decode_input, encode
from loopwarden.replay import Replay
from loopwarden.simulate import fleet
from loopwarden.trust import SigningKey, TrustedVerifiers
from loopwarden.stages.topics import ensure_topics
from tests.integration.harness import env_for, stop_process, unique_config

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts"
TOKEN = "board-token-of-32-characters!!!!"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
LIVE_TRIES = 3

# Records the page time (epoch ms) at which a row for a run id first appears, whatever re-renders.
OBSERVE = """
window.__seen = window.__seen || {};
if (!window.__observer) {
  window.__observer = new MutationObserver(() => {
    for (const tr of document.querySelectorAll('#attention tr[data-run-id]')) {
      const id = tr.dataset.runId;
      if (!(id in window.__seen)) window.__seen[id] = Date.now();
    }
  });
  window.__observer.observe(document.body, {childList: true, subtree: true});
}
"""

# The WCAG contrast ratio of every element's own text against its effective background.
CONTRAST = """
function rgb(s) { const m = s.match(/[\\d.]+/g).map(Number); return {r: m[0], g: m[1], b: m[2], a: m.length > 3 ? m[3] : 1}; }
function lum(c) { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
                  return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b); }
function bg(el) { for (; el; el = el.parentElement) { const c = rgb(getComputedStyle(el).backgroundColor); if (c.a > 0) return c; }
                  return {r: 255, g: 255, b: 255, a: 1}; }
const out = [];
for (const el of document.querySelectorAll('body *')) {
  if (!el.offsetParent && el.tagName !== 'BODY') continue;
  const own = Array.from(el.childNodes).some((n) => n.nodeType === 3 && n.textContent.trim());
  if (!own) continue;
  const a = lum(rgb(getComputedStyle(el).color)), b = lum(bg(el));
  out.push([(Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05), el.tagName + '.' + el.className + ': ' + el.textContent.trim().slice(0, 30)]);
}
return out;
"""


def worker_transitions_of_a_fleet(config, tmp_path: Path, now: int) -> tuple[list[dict], dict[str, str]]:
    """What a real worker commits to agent.health for a simulated fleet whose receipts a trusted verifier
    signed (``verifier-1``, in LOOPWARDEN_TRUSTED_VERIFIERS) or a key the worker does not trust signed (every
    third receipt): the fleet on the event clock, ticked to ``now``. Returns the transitions (read_committed)
    and run id -> how its receipts were signed ("trusted" | "untrusted")."""
    from tests.integration.harness import make_worker, publish, read_topic, run, tick, transitions

    trusted, rogue = SigningKey.generate("verifier-1"), SigningKey.generate("rogue-1")
    messages, signed_by = [], {}
    for i, m in enumerate(fleet(60, seed=8, start_ms=now - 50 * 60_000, bad_every=0)):
        value = m.value
        if m.topic == "outcomes":
            event = decode_input(value)
            key = rogue if len(signed_by) % 3 == 2 and event.run_id not in signed_by else trusted
            key = rogue if signed_by.get(event.run_id) == "untrusted" else key
            signed_by[event.run_id] = "untrusted" if key is rogue else "trusted"
            value = encode(key.sign(event))
        messages.append((m.topic, m.key, value))
    replay = Replay(keep_final=True, verifiers=TrustedVerifiers.parse(trusted.setting))
    for _topic, _key, value in messages:
        replay.feed(decode_input(value))
    replay.advance_to(now)
    # Final states, not seqs: the worker meets a receipt that came before its run's end in arrival order (a run
    # that receipted first may pass through VERIFYING), replay in file order (docs/contract.md section 5).
    expected = {r: t.to_state for r, t in replay.final.items()}
    worker = make_worker(config, tmp_path, "fleet-worker", clock="event")
    worker.extra_env = {"LOOPWARDEN_TRUSTED_VERIFIERS": trusted.setting}
    worker.start()
    try:
        run(publish(worker.config, messages))
        run(tick(worker.config, now))

        def final(records) -> bool:
            return {t["run_id"]: t["to_state"] for t in transitions(records)} == expected

        got = transitions(run(read_topic(worker.config, config.health_topic, final, timeout_s=60)))
    finally:
        worker.stop()
    assert final([]) is False and {t["run_id"]: t["to_state"] for t in got} == expected  # replay's final states
    return got, signed_by


def transition(run_id: str, seq: int, ts: int, frm: str | None, to: str, agent: str = "live-agent",
               approval: dict | None = None) -> bytes:
    evidence = {"reported_cause": "natural_finish", "derived_cause": "unknown", "fired": ["step_count"],
                "step_count": 3, "segments": 1, "tool_errors": 1, "finish_reason": "stop",
                "disagreements": ["cause_mismatch"], "receipt_ids": ["rcpt-1"], "approval": approval}
    return msgspec.json.encode({"type": "health_transition", "run_id": run_id, "seq": seq, "ts": ts,
                                "emitted_ts": ts, "agent": agent, "policy_version": "p7", "from_state": frm,
                                "to_state": to, "reason": "inactivity_timeout", "evidence": evidence})


class Publisher:
    """A producer on agent.health kept open in its own event loop (as workers publish: keyed by run id)."""

    def __init__(self, config) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()

        async def start() -> AIOKafkaProducer:
            await ensure_topics(config)
            producer = AIOKafkaProducer(bootstrap_servers=config.bootstrap, linger_ms=0)
            await producer.start()
            return producer

        self.producer = self.loop.run_until_complete(start())

    def send(self, values: list[bytes]) -> None:
        async def go():
            for v in values:
                await self.producer.send(self.config.health_topic, v, key=json.loads(v)["run_id"].encode())
            await self.producer.flush()

        self.loop.run_until_complete(go())

    def close(self) -> None:
        self.loop.run_until_complete(self.producer.stop())
        self.loop.close()


def browser(tmp_path: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager never downloads: Debian's binaries are given
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                "--disable-dev-shm-usage", "--window-size=1280,1100", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def get(url: str, token: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:  # not listening yet
        return 0, b""


def wait(predicate, timeout_s: float = 10, what: str = "condition"):
    """``predicate``'s first truthy value within ``timeout_s``. A row the page re-rendered while the predicate read
    it (StaleElementReferenceException: the live list redraws on every update) counts as not yet."""
    from selenium.common.exceptions import StaleElementReferenceException

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except StaleElementReferenceException:
            value = None
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def caught_up(url: str, runs: int) -> bool:
    status, body = get(url + "healthz")
    return status == 200 and json.loads(body)["runs"] == runs


def test_the_board_in_a_browser(kafka, tmp_path: Path) -> None:
    """A transition committed to agent.health shows on the page within a second (measured in the page);
    state and agent filters, keyboard navigation to a run's page with every transition, its evidence and
    its state's doc link, live updates there, the token asked for, labels and contrast; screenshots saved."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    assert os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK), "run `make chromium`"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    config = unique_config(kafka.bootstrap)
    now = int(time.time() * 1000)
    fleet_transitions, signed_by = worker_transitions_of_a_fleet(config, tmp_path, now)
    publisher = Publisher(config)  # the live transitions below: the board's own latency from agent.health
    final: dict[str, dict] = {t["run_id"]: t for t in fleet_transitions}
    assert {"trusted", "untrusted"} <= set(signed_by.values())
    needing = {r: t for r, t in final.items() if t["to_state"] in ATTENTION}
    assert needing and {t["to_state"] for t in needing.values()} >= {"FAILED", "STUCK"}

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    env = {**env_for(config), "LOOPWARDEN_BOARD_PORT": str(port), "LOOPWARDEN_TOKEN": TOKEN,
           "LOOPWARDEN_STATES_DOC_URL": "https://docs.example/loopwarden/docs/states.md"}
    log = open(tmp_path / "board.log", "wb")
    board = subprocess.Popen([sys.executable, "-m", "loopwarden.cli", "board"], env=env, stdout=log, stderr=subprocess.STDOUT)
    driver = None
    try:
        wait(lambda: caught_up(url, len(final)) or board.poll() is not None, 30, "the board to read the fleet")
        assert board.poll() is None, (tmp_path / "board.log").read_text()[-3000:]
        assert get(url + "api/snapshot")[0] == 401  # the data needs the token
        assert get(url + "api/snapshot", "wrong-token-but-long-enough")[0] == 401
        assert get(url)[0] == 200  # the page itself holds no data

        driver = browser(tmp_path)
        driver.get(url)
        token_input = wait(lambda: driver.find_element(By.ID, "token").is_displayed() and driver.find_element(By.ID, "token"),
                           what="the token form")
        token_input.send_keys(TOKEN, Keys.ENTER)
        wait(lambda: len(driver.find_elements(By.CSS_SELECTOR, "#attention tbody tr")) == len(needing), what="the runs")
        rows = driver.find_elements(By.CSS_SELECTOR, "#attention tbody tr")
        shown = [r.get_attribute("data-run-id") for r in rows]
        assert shown == [r for _ts, r in sorted((t["ts"], r) for r, t in needing.items())]  # oldest in state first
        counts = {tr.get_attribute("data-state"): int(tr.find_elements(By.TAG_NAME, "td")[0].text)
                  for tr in driver.find_elements(By.CSS_SELECTOR, "#counts tbody tr")}
        assert sum(counts.values()) == len(final) and counts["FAILED"] == sum(t["to_state"] == "FAILED" for t in final.values())
        link = driver.find_element(By.CSS_SELECTOR, '#counts tr[data-state="WAITING_UNROUTED"] a')
        assert link.get_attribute("href") == "https://docs.example/loopwarden/docs/states.md#waiting_unrouted"

        # Live: a transition published now shows within a second (measured by the page's own clock).
        driver.execute_script(OBSERVE)
        latencies = []
        for i in range(LIVE_TRIES):
            run_id = f"live-run-{i}"
            published = time.time() * 1000
            publisher.send([transition(run_id, 1, now - 5 * 3_600_000 - i, None, "STUCK")])
            seen = wait(lambda: driver.execute_script("return window.__seen[arguments[0]]", run_id), 10,
                        f"{run_id} on the page")
            latencies.append(seen - published)
        print(f"\nboard: publish -> on screen {', '.join(f'{ms:.0f}' for ms in latencies)} ms "
              f"(median {statistics.median(latencies):.0f} ms)")
        assert statistics.median(latencies) < 1000, latencies
        driver.save_screenshot(str(ARTIFACTS / "board.png"))

        # Filters: by state, then by agent.
        Select(driver.find_element(By.ID, "filter-state")).select_by_value("FAILED")
        want = sorted(r for r, t in needing.items() if t["to_state"] == "FAILED")
        wait(lambda: sorted(r.get_attribute("data-run-id") for r in driver.find_elements(By.CSS_SELECTOR, "#attention tbody tr")) == want,
             what="the FAILED filter")
        Select(driver.find_element(By.ID, "filter-state")).select_by_value("")
        Select(driver.find_element(By.ID, "filter-agent")).select_by_value("live-agent")
        wait(lambda: sorted(r.get_attribute("data-run-id") for r in driver.find_elements(By.CSS_SELECTOR, "#attention tbody tr"))
             == [f"live-run-{i}" for i in range(LIVE_TRIES)], what="the agent filter")

        # Accessibility: every control labelled, text contrast >= 4.5:1 (WCAG AA), all by keyboard.
        unlabelled = driver.execute_script(
            "return Array.from(document.querySelectorAll('input, select, button, textarea'))"
            ".filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim())"
            ".map(e => e.id || e.outerHTML.slice(0, 60))")
        assert unlabelled == []
        ratios = driver.execute_script(CONTRAST)
        worst = min(ratios)
        print(f"board: lowest text contrast {worst[0]:.2f}:1 ({worst[1]})")
        assert worst[0] >= 4.5, worst
        body = driver.find_element(By.TAG_NAME, "body")
        body.click()
        reached = []
        for _ in range(120):
            driver.switch_to.active_element.send_keys(Keys.TAB)
            active = driver.switch_to.active_element
            reached.append(active.get_attribute("id") or active.get_attribute("class"))
            if "run-link" in (active.get_attribute("class") or ""):
                break
        assert "filter-state" in reached and "filter-agent" in reached and "run-link" in reached[-1], reached
        target = driver.switch_to.active_element.find_element(By.XPATH, "./ancestor::tr").get_attribute("data-run-id")
        driver.switch_to.active_element.send_keys(Keys.ENTER)

        # The run page: every transition, its evidence, what to do, the state's doc; live.
        wait(lambda: driver.find_element(By.ID, "run-id").text == target and
             len(driver.find_elements(By.CSS_SELECTOR, "#run-transitions > li")) == 1, what="the run page")
        assert driver.find_element(By.ID, "run-doc").get_attribute("href").endswith("docs/states.md#stuck")
        assert "last durable progress" in driver.find_element(By.ID, "run-action").text
        text = driver.find_element(By.ID, "run-transitions").text
        for needle in ("natural_finish", "unknown", "step_count", "cause_mismatch", "rcpt-1", "inactivity_timeout"):
            assert needle in text, needle
        deadline = now + 600_000
        publisher.send([transition(target, 2, now, "STUCK", "WAITING",
                                   approval={"approval_id": "ap-1", "tool_call_id": "tc-1", "tool_name": "deploy",
                                             "owner": "oncall@example.com", "deadline_ts": deadline})])
        wait(lambda: len(driver.find_elements(By.CSS_SELECTOR, "#run-transitions > li")) == 2, what="the live transition")
        newest = driver.find_element(By.CSS_SELECTOR, "#run-transitions > li").text
        assert "oncall@example.com" in newest and "deploy" in newest and "WAITING" in newest
        assert driver.find_element(By.ID, "run-doc").get_attribute("href").endswith("#waiting")
        driver.save_screenshot(str(ARTIFACTS / "board-run.png"))

        # Trust as the operator sees it, on runs the worker judged: a receipt the trusted verifier signed makes
        # the run complete and is listed; one signed by a key the worker does not trust is shown as untrusted.
        def shown(run_id: str) -> str:
            driver.get(f"{url}#/run/{run_id}")
            wait(lambda: driver.find_element(By.ID, "run-id").text == run_id and
                 driver.find_elements(By.CSS_SELECTOR, "#run-transitions > li"), what=f"the page of {run_id}")
            t = final[run_id]
            assert driver.find_element(By.ID, "run-state").text == t["to_state"]
            assert driver.find_element(By.ID, "run-reason").text == t["reason"]
            return driver.find_element(By.CSS_SELECTOR, "#run-transitions > li").text

        complete = next(r for r, t in final.items() if signed_by.get(r) == "trusted" and t["to_state"] == "VERIFIED_COMPLETE")
        text = shown(complete)
        assert final[complete]["reason"] in ("receipt", "late_receipt") and final[complete]["evidence"]["receipt_ids"]
        assert f"Receipts\n{', '.join(final[complete]['evidence']['receipt_ids'])}" in text and "Untrusted" not in text
        distrusted = [r for r, how in signed_by.items() if how == "untrusted"]
        assert distrusted and all(final[r]["to_state"] != "VERIFIED_COMPLETE" for r in distrusted)
        shown_untrusted = 0
        for r in distrusted:
            ids = final[r]["evidence"].get("untrusted_receipt_ids") or []
            if ids:
                text = shown(r)
                assert f"Untrusted receipts (not counted)\n{', '.join(ids)}" in text, text
                shown_untrusted += 1
        assert shown_untrusted, {r: final[r]["to_state"] for r in distrusted}
        driver.save_screenshot(str(ARTIFACTS / "board-untrusted.png"))
        assert (ARTIFACTS / "board.png").stat().st_size > 10_000 and (ARTIFACTS / "board-run.png").stat().st_size > 10_000
        print(f"board: screenshots {ARTIFACTS / 'board.png'} {ARTIFACTS / 'board-run.png'}")
    finally:
        if driver is not None:
            driver.quit()
        stop_process(board, timeout_s=15)
        publisher.close()
        log.close()
    assert board.returncode == 0, (tmp_path / "board.log").read_text()[-3000:]


def test_a_worker_serves_the_board_when_asked(kafka, tmp_path: Path) -> None:
    """With board_in_worker the worker serves the board at /board/: the page without the token, its
    data only with it, and every run of the fleet it processed (read back from agent.health)."""
    from tests.integration.harness import make_worker, publish, run

    config = unique_config(kafka.bootstrap)
    worker = make_worker(config, tmp_path, token=TOKEN)
    worker.extra_env = {"LOOPWARDEN_BOARD_IN_WORKER": "true"}
    worker.start()
    try:
        messages = fleet(30, seed=12, bad_every=0)
        run(publish(worker.config, [(m.topic, m.key, m.value) for m in messages]))
        status, page = worker.get("/board/")
        assert status == 200 and b"runs board" in page
        assert worker.get("/board/static/board.js")[0] == 200
        assert worker.get("/board/api/snapshot")[0] == 401 and worker.get("/runs")[0] == 401
        wait(lambda: json.loads(worker.get("/board/api/snapshot", TOKEN)[1])["runs"] == 30, 30, "the worker's board")
    finally:
        worker.stop()
    assert worker.proc.returncode == 0, worker.log_tail()
