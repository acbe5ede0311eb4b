"""``loopwarden act``: a person's decision on a run (docs/contract.md section 12), signed like ``loopwarden receipt``.

The action goes on ``agent.steps`` keyed by the run id, so the worker that owns the run reads it in order
with the run's own events; it changes something only when a key in ``LOOPWARDEN_TRUSTED_VERIFIERS``
signed it (the worker's check, as for a human receipt).
"""

from __future__ import annotations

import argparse
import time

from loopwarden.operator_action import ACTIONS, ActionError, build_action

def add_command(sub) -> None:
    p = sub.add_parser("act", help="publish a person's signed action on a run: retry, reverify, escalate, abandon, "
                                   "acknowledge")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("action", metavar="ACTION", help=f"one of {', '.join(ACTIONS)}")
    p.add_argument("--reason", required=True, help="why, in the person's words (1-200 chars; in the recovery action)")
    p.add_argument("--key", required=True, metavar="FILE", help="the person's key file (`loopwarden keys new`); its key "
                   "must be in the workers' LOOPWARDEN_TRUSTED_VERIFIERS")
    p.add_argument("--override-bound", dest="override_bound", action="store_true",
                   help="retry beyond the job's max_attempts (recorded in the action)")
    p.add_argument("--actor", help="who acts, as the key's holder vouches (default: absent; the key id names the signer)")
    p.add_argument("--request-id", dest="request_id", help="default: a fresh UUID; a repeated request id is ignored")
    p.add_argument("--run-started-ts", dest="run_started_ts", type=int, metavar="MS",
                   help="the ts (ms) of the run_started of the run acted on: signed, so the action cannot be re-sent "
                        "to a later run with the same id (default: none; the action's own ts, now, stands in)")
    p.add_argument("--broker", default=None, help="Kafka bootstrap host:port (LOOPWARDEN_BROKER; default 127.0.0.1:9092)")
    p.add_argument("--steps-topic", dest="steps_topic", default=None,
                   help="LOOPWARDEN_STEPS_TOPIC; default agent.steps")
    p.add_argument("--out", metavar="FILE", help="write the signed action as a JSON line here ('-': stdout) instead "
                                                 "of publishing")
    p.set_defaults(func=cmd_act)


def cmd_act(args: argparse.Namespace) -> int:
    import os

    from loopwarden.commands.cliutil import publish_signed
    from loopwarden.commands.verify import _key

    try:
        action = build_action(args.run_id, args.action, args.reason, ts=int(time.time() * 1000),
                              request_id=args.request_id, override_bound=args.override_bound, actor=args.actor,
                              run_started_ts=args.run_started_ts)
    except ActionError as exc:
        raise SystemExit(f"loopwarden act: {exc}") from None
    key = _key(args.key, "act")
    action = key.sign_action(action)
    topic = args.steps_topic or os.environ.get("LOOPWARDEN_STEPS_TOPIC", "agent.steps")
    who = f"{key.key_id}/{args.actor}" if args.actor else key.key_id
    publish_signed("act", action, args.out, args.broker, topic, "steps",
                   f"published {args.action} on run {args.run_id!r} to {topic} (request {action.request_id}, "
                   f"signed by {who!r})")
    return 0
