"""`loopwarden board`: reads agent.health (read_committed, every partition) into a :class:`Fleet` and serves it.

Routes (aiohttp, behind the same header/size/connection limits as the worker's API):

- ``GET /`` and ``/static/*``: the page (plain HTML, CSS and JS shipped in this package;
  nothing from a CDN). They hold no data, so they answer without the token: the page asks
  for it.
- ``GET /api/snapshot?state=&agent=&reason=&view=&offset=&limit=``: counts now and over the last
  hour, the runs that need a person (``view=closed``: those a person abandoned or acknowledged),
  oldest first, a page of them, and their groups by agent, state and reason (JSON).
- ``GET /api/runs/{run_id}``: one run's transitions with their evidence, what to do, the job's
  attempts and the actions decided on it.
- ``GET /api/find?q=``: run ids on the board, the exact one or those starting with ``q``.
- ``GET /api/stream?…&run=``: the snapshot as server-sent events: a ``snapshot``
  event whenever the fleet changed (at most every ``STREAM_MIN_INTERVAL_S``), and at least
  every ``STREAM_HEARTBEAT_S``; with ``run=`` each event also carries that run's page.
- ``POST /api/runs/{run_id}/act`` and ``POST /api/act`` (every open run a filter matches): a
  signed user's operator action, signed with ``board_signing_key``, ``actor`` the user, published
  on agent.steps; anything else publishes nothing and is counted (``/metrics``).
- ``GET /healthz``: open, for probes.

With a token or users configured, every ``/api/`` route needs ``Authorization: Bearer <token>``
(401 otherwise), as the worker's API: the shared token reads, a user's own token
(``board_users``) reads and acts. The page sends it from the browser's session storage
(``fetch`` with the header, so the stream is read with ``fetch``, not ``EventSource``, and
the token never appears in a URL).
"""

from __future__ import annotations

import asyncio
import hmac
import html
import logging
from importlib.resources import files
from pathlib import Path

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from loopwarden.api.board.fleet import ACTIONS, ATTENTION, PAGE_MAX
from loopwarden.api.board.reader import Board, now_ms
from loopwarden.operator_action import ACTIONS as OPERATOR_ACTIONS, ActionError, build_action
from loopwarden.codecs import STATES
from loopwarden.config import Config
from loopwarden.api.httplimits import GuardedSite, serve_guarded

log = logging.getLogger("loopwarden.board")
STREAM_MIN_INTERVAL_S = 0.05
STREAM_HEARTBEAT_S = 15.0
STATIC = {"board.js": "application/javascript", "board.css": "text/css"}
GROUP_ACT_MAX = 10_000  # runs one group action reaches at most
# What became of each request to act (the metric's label): published, or why nothing was.
ACT_OUTCOMES = ("published", "unauthenticated", "not_a_user", "acting_off", "invalid", "unknown_run",
                "not_needing_person", "publish_failed")


class Acting:
    """The board's act requests, counted by outcome (``loopwarden_board_act_requests_total``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("loopwarden_board_act_requests_total", "Requests to act on runs from the board, by "
                                "outcome: published, or why nothing was", ["outcome"], registry=self.registry)
        self.actions = Counter("loopwarden_board_operator_actions_total", "Signed operator actions the board "
                               "published on agent.steps, by action", ["action"], registry=self.registry)
        for outcome in ACT_OUTCOMES:
            self.requests.labels(outcome)
        for action in OPERATOR_ACTIONS:
            self.actions.labels(action)


_act_body = msgspec.json.Decoder(dict).decode


def _json(data, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(data), status=status, content_type="application/json",
                        headers={"Cache-Control": "no-store"})


def _is_act(path: str, method: str) -> bool:
    return method == "POST" and (path == "/api/act" or (path.startswith("/api/runs/") and path.endswith("/act")))


def make_app(board: Board, prefix: str = "") -> web.Application:
    """The board's routes; ``prefix``: where it is mounted (``/board`` in a worker)."""
    config = board.config
    expected = f"Bearer {config.token}".encode() if config.token else None
    users = {f"Bearer {token}".encode(): name for token, name in board.users.items()}
    guarded = expected is not None or bool(users)
    acting = Acting()
    page = (files("loopwarden.api.board") / "static" / "index.html").read_text()
    page = page.replace("{{DOCS}}", html.escape(config.states_doc_url)).replace(
        "{{AUTH}}", "token" if guarded else "open")
    static = {name: (files("loopwarden.api.board") / "static" / name).read_bytes() for name in STATIC}

    def user_of(sent: bytes) -> str | None:
        found = None
        for bearer, name in users.items():  # every entry compared, in constant time each
            if hmac.compare_digest(sent, bearer):
                found = name
        return found

    @web.middleware
    async def auth(request: web.Request, handler):
        path = request.path[len(prefix):] if request.path.startswith(prefix) else request.path
        sent = request.headers.get("Authorization", "").encode()
        request["user"] = user_of(sent) if users else None
        if guarded and not (path in ("/", "/healthz", "/docs/states.md") or path.startswith("/static/")):
            if request["user"] is None and not (expected is not None and hmac.compare_digest(sent, expected)):
                if _is_act(path, request.method):
                    acting.requests.labels("unauthenticated").inc()
                return _json({"error": "unauthorized: send Authorization: Bearer <token>"}, status=401)
        elif _is_act(path, request.method) and request["user"] is None:
            acting.requests.labels("unauthenticated").inc()  # an open board: nobody is signed in to act
            return _json({"error": "acting needs a board user's own token (LOOPWARDEN_BOARD_USERS)"}, status=401)
        return await handler(request)

    def filters(request: web.Request) -> dict | web.Response:
        q = request.query
        state = q.get("state") or None
        agent = q.get("agent") or None
        reason = q.get("reason") or None
        view = q.get("view") or "open"
        if state is not None and state not in STATES:
            return _json({"error": f"state={state[:100]!r}: give one of {', '.join(STATES)}"}, status=400)
        for name, value in (("agent", agent), ("reason", reason)):
            if value is not None and len(value) > 200:
                return _json({"error": f"{name}: at most 200 characters"}, status=400)
        if view not in ("open", "closed"):
            return _json({"error": f"view={view[:100]!r}: give open (runs that need a person) or closed (abandoned "
                                   "or acknowledged)"}, status=400)
        numbers = {}
        for name, default, high in (("offset", 0, 10_000_000), ("limit", 200, PAGE_MAX)):
            text = q.get(name) or str(default)
            try:
                numbers[name] = int(text)
            except ValueError:
                numbers[name] = -1
            if not 0 <= numbers[name] <= high:
                return _json({"error": f"{name}={text[:40]!r}: give a whole number from 0 to {high}"}, status=400)
        return {"state": state, "agent": agent, "reason": reason, "closed": view == "closed", **numbers}

    async def index(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html", headers={"Cache-Control": "no-store"})

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in static:
            raise web.HTTPNotFound()
        return web.Response(body=static[name], content_type=STATIC[name], headers={"Cache-Control": "no-cache"})

    async def healthz(request: web.Request) -> web.Response:
        return _json({"status": "ok", "caught_up": board.ready, "runs": len(board.fleet.runs)})

    async def snapshot(request: web.Request) -> web.Response:
        got = filters(request)
        if isinstance(got, web.Response):
            return got
        return _json(board.fleet.snapshot(now_ms(), **got))

    async def run(request: web.Request) -> web.Response:
        doc = board.fleet.run_document(request.match_info["run_id"], now_ms())
        if doc is None:
            return _json({"error": "run not on the board (never seen, or aged out)"}, status=404)
        return _json(doc)

    async def stream(request: web.Request) -> web.StreamResponse:
        got = filters(request)
        if isinstance(got, web.Response):
            return got
        run_id = request.query.get("run") or None
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                               "X-Accel-Buffering": "no"})
        await response.prepare(request)
        sent = -1
        try:
            while not board.stopping.is_set():
                if board.fleet.version == sent:
                    await board.changed(STREAM_HEARTBEAT_S)
                    if board.stopping.is_set():
                        break
                    await asyncio.sleep(STREAM_MIN_INTERVAL_S)  # a burst of changes: one event
                sent = board.fleet.version
                now = now_ms()
                data = board.fleet.snapshot(now, **got)
                if run_id is not None:
                    data["run"] = board.fleet.run_document(run_id, now)
                await response.write(b"event: snapshot\ndata: " + msgspec.json.encode(data) + b"\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return response

    async def states_doc(request: web.Request) -> web.Response:
        # From a source checkout the default link (docs/states.md) resolves here; elsewhere set
        # states_doc_url to where the docs are published.
        path = Path(__file__).resolve().parents[2] / "docs" / "states.md"
        if not path.is_file():
            raise web.HTTPNotFound(text="docs/states.md is not installed here: set LOOPWARDEN_STATES_DOC_URL "
                                        "to where your docs are published")
        return web.Response(text=path.read_text(), content_type="text/plain", charset="utf-8")

    async def meta(request: web.Request) -> web.Response:
        return _json({"states": list(STATES), "attention": list(ATTENTION), "actions": ACTIONS,
                      "states_doc_url": config.states_doc_url, "user": request["user"],
                      "acting": board.acting, "operator_actions": list(OPERATOR_ACTIONS)})

    async def find(request: web.Request) -> web.Response:
        q = request.query.get("q", "").strip()
        if not 1 <= len(q) <= 200:
            return _json({"error": "q: give 1-200 characters of a run id"}, status=400)
        return _json({"q": q, "runs": board.fleet.find(q)})

    async def metrics_route(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(acting.registry), content_type=CONTENT_TYPE_LATEST.split(";")[0],
                            charset="utf-8")

    def refuse(outcome: str, status: int, error: str) -> web.Response:
        acting.requests.labels(outcome).inc()
        return _json({"error": error}, status=status)

    async def act_request(request: web.Request) -> tuple[dict, str] | web.Response:
        """The signed-in user and the request's body, checked; or the refusal (counted)."""
        if not board.acting:
            return refuse("acting_off", 403, "this board does not act: it needs LOOPWARDEN_BOARD_SIGNING_KEY and "
                                             "LOOPWARDEN_BOARD_USERS")
        if request["user"] is None:  # the shared token reads; acting names a person
            return refuse("not_a_user", 403, "the shared token only reads: sign in with your own token "
                                             "(LOOPWARDEN_BOARD_USERS) to act")
        try:
            body = _act_body(await request.read())
        except (msgspec.ValidationError, msgspec.DecodeError):
            return refuse("invalid", 400, "send a JSON object: {\"action\": ..., \"reason\": ...}")
        action, reason = body.get("action"), body.get("reason")
        if action not in OPERATOR_ACTIONS:
            return refuse("invalid", 400, f"action {str(action)[:60]!r}: give one of {', '.join(OPERATOR_ACTIONS)}")
        if not isinstance(reason, str) or not reason.strip() or len(reason) > 200:
            return refuse("invalid", 400, "reason: give 1-200 characters (why, in your words)")
        if not isinstance(body.get("override_bound", False), bool) or (body.get("override_bound") and action != "retry"):
            return refuse("invalid", 400, "override_bound: true only with retry")
        request_id = body.get("request_id")
        if request_id is not None and not (isinstance(request_id, str) and 1 <= len(request_id) <= 200):
            return refuse("invalid", 400, "request_id: 1-200 characters, or absent (one is made)")
        return body, request["user"]

    def operator_action(run, body: dict, user: str, now: int, request_id: str | None = None):
        return board.signing_key.sign_action(build_action(
            run.run_id, body["action"], body["reason"], ts=now, request_id=request_id,
            override_bound=bool(body.get("override_bound")), actor=user, run_started_ts=run.started_ts))

    async def send(actions: list, what: str) -> web.Response:
        try:
            await board.publish(actions)
        except Exception as exc:  # the broker: said to the person, counted, nothing claimed as done
            log.warning("could not publish %s: %s", what, exc)
            return refuse("publish_failed", 503, f"Kafka did not take the action(s): {exc}"[:300])
        for a in actions:
            acting.actions.labels(a.action).inc()
        acting.requests.labels("published").inc()
        board.notify()
        return _json({"published": len(actions), "request_ids": [a.request_id for a in actions[:200]]}, status=202)

    async def act_run(request: web.Request) -> web.Response:
        got = await act_request(request)
        if isinstance(got, web.Response):
            return got
        body, user = got
        run = board.fleet.runs.get(request.match_info["run_id"])
        if run is None:
            return refuse("unknown_run", 404, "run not on the board (never seen, or aged out)")
        if run.state not in ATTENTION:
            return refuse("not_needing_person", 409, f"run {run.run_id!r} is {run.state}: nothing for a person to do")
        try:
            action = operator_action(run, body, user, now_ms(), body.get("request_id"))
        except ActionError as exc:
            return refuse("invalid", 400, str(exc))
        log.info("%s: %s on run %s (%s)", user, action.action, run.run_id, action.request_id)
        return await send([action], f"{action.action} on {run.run_id}")

    async def act_group(request: web.Request) -> web.Response:
        got = await act_request(request)
        if isinstance(got, web.Response):
            return got
        body, user = got
        match = body.get("match")
        if not isinstance(match, dict) or not set(match) <= {"state", "agent", "reason"} or not match:
            return refuse("invalid", 400, "match: give the group, {\"state\": ..., \"agent\": ..., \"reason\": ...} "
                                          "(at least one)")
        if any(v is not None and not isinstance(v, str) for v in match.values()):
            return refuse("invalid", 400, "match: each of state, agent and reason is a string")
        if match.get("state") is not None and match["state"] not in ATTENTION:
            return refuse("invalid", 400, f"match.state {str(match['state'])[:60]!r}: give one of {', '.join(ATTENTION)}")
        ids = board.fleet.matching(state=match.get("state"), agent=match.get("agent"), reason=match.get("reason"),
                                   limit=GROUP_ACT_MAX + 1)
        if len(ids) > GROUP_ACT_MAX:  # all or nothing: a person must know which runs were acted on
            return refuse("invalid", 413, f"more than {GROUP_ACT_MAX} runs match: narrow the filter")
        if not ids:
            return refuse("not_needing_person", 409, "no run that needs a person matches")
        now = now_ms()
        try:
            actions = [operator_action(board.fleet.runs[r], body, user, now) for r in ids]  # a request id each
        except ActionError as exc:
            return refuse("invalid", 400, str(exc))
        log.info("%s: %s on %d runs matching %s", user, body["action"], len(actions), match)
        return await send(actions, f"{body['action']} on {len(actions)} runs")

    app = web.Application(middlewares=[auth])
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", asset)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/docs/states.md", states_doc)
    app.router.add_get("/api/meta", meta)
    app.router.add_get("/api/snapshot", snapshot)
    app.router.add_get("/api/runs/{run_id}", run)
    app.router.add_get("/api/stream", stream)
    app.router.add_get("/api/find", find)
    app.router.add_post("/api/runs/{run_id}/act", act_run)
    app.router.add_post("/api/act", act_group)
    app.router.add_get("/metrics", metrics_route)
    return app


async def serve(board: Board) -> GuardedSite:
    c = board.config
    return await serve_guarded(make_app(board), c.web_host, c.board_port, c)


def run_board(config: Config) -> int:
    """Run the board until SIGTERM/SIGINT."""
    import signal

    # logging: loopwarden.cli.set_up_process

    async def main() -> None:
        board = Board(config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, board.stopping.set)
        site = await serve(board)
        log.info("runs board on http://%s:%d/ (agent.health: %s)", config.web_host, site.port, config.health_topic)
        consumer = asyncio.create_task(board.consume())
        stop = asyncio.create_task(board.stopping.wait())
        try:
            done, _ = await asyncio.wait({consumer, stop}, return_when=asyncio.FIRST_COMPLETED)
            if consumer in done:
                consumer.result()  # its error, if it failed
        finally:
            board.stopping.set()
            board.notify()
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
            await site.cleanup()

    asyncio.run(main())
    return 0
