"""`loopwarden board`: the command line of the runs board (see loopwarden.api.board.server)."""

from __future__ import annotations

import argparse
import sys


def add_command(sub) -> None:
    from loopwarden.commands.cliutil import _common

    p = sub.add_parser("board", help="serve the runs board: the whole fleet's runs from agent.health, live in a browser")
    _common(p, topics=("health", "steps"), partitions=False)  # steps: where its users' operator actions go
    p.add_argument("--web-host", dest="web_host", help="bind address (LOOPWARDEN_WEB_HOST; default 127.0.0.1)")
    p.add_argument("--board-port", dest="board_port", type=int, help="HTTP port (LOOPWARDEN_BOARD_PORT; default 6067)")
    p.add_argument("--board-lookback-s", dest="board_lookback_s", type=float,
                   help="read agent.health from this long ago at start (LOOPWARDEN_BOARD_LOOKBACK_S; default 86400)")
    p.add_argument("--board-settled-s", dest="board_settled_s", type=float,
                   help="a settled run leaves the board this long after it settled (LOOPWARDEN_BOARD_SETTLED_S; default 3600)")
    p.add_argument("--board-max-runs", dest="board_max_runs", type=int,
                   help="runs held at most (LOOPWARDEN_BOARD_MAX_RUNS; default 100000)")
    p.add_argument("--states-doc-url", dest="states_doc_url",
                   help="where docs/states.md is published; each state links to <url>#<state> "
                        "(LOOPWARDEN_STATES_DOC_URL; default docs/states.md, served from a checkout)")
    p.add_argument("--board-signing-key", dest="board_signing_key", metavar="FILE",
                   help="sign the board users' operator actions with this key file (`loopwarden keys new`; its key in "
                        "the workers' LOOPWARDEN_TRUSTED_VERIFIERS) (LOOPWARDEN_BOARD_SIGNING_KEY; unset: no acting)")
    p.add_argument("--actions-topic", dest="actions_topic",
                   help="recovery actions, read to show who acted and why (LOOPWARDEN_ACTIONS_TOPIC; default agent.actions)")
    p.add_argument("--log-level", dest="log_level", help="info, warning, debug (LOOPWARDEN_LOG_LEVEL)")
    p.set_defaults(func=cmd_board)


def cmd_board(args: argparse.Namespace) -> int:
    from aiokafka.errors import KafkaConnectionError

    from loopwarden.api.board.server import run_board
    from loopwarden.commands.cliutil import _config, cannot_connect, port_in_use, port_taken

    config = _config(args)
    from loopwarden.api.board.users import parse_users
    from loopwarden.engine.exceptions import ConfigError

    try:
        parse_users(config.board_users, config.token)
    except ConfigError as exc:
        raise SystemExit(f"loopwarden board: {exc}") from None
    if config.board_signing_key:
        from loopwarden.trust import SigningKey, TrustConfigError

        try:
            SigningKey.load(config.board_signing_key)
        except TrustConfigError as exc:
            raise SystemExit(f"loopwarden board: board_signing_key: {exc}") from None
    print(f"loopwarden board: broker={config.broker} topic={config.health_topic} "
          f"http://{config.web_host}:{config.board_port}/ auth={'token' if config.token else 'open'}",
          file=sys.stderr, flush=True)
    try:
        return run_board(config)
    except KafkaConnectionError as exc:
        raise SystemExit(cannot_connect("board", config, exc)) from None
    except OSError as exc:
        if not port_in_use(exc):
            raise
        raise SystemExit(port_taken("board", config.web_host, config.board_port,
                                    "choose another with --board-port (LOOPWARDEN_BOARD_PORT)")) from None
    except KeyboardInterrupt:
        return 0
