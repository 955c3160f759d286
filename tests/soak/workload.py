"""The sessions of a soak: a steady rate of turns of mixed calls, drawn from the seed.

Each session runs one turn of one to three steps; each step is a batch of one to four
parallel calls, each of a kind in :data:`TURN_KINDS` (the example's tools: a plain lookup,
the side-effect refund with its reconcile hook, slow echoes, some slower than the lease, a
flaky lookup its retry policy must carry through, and an account closing a person must
approve first: the soak's approver decides it). A new kind of call is one more entry there.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from agentfn_asgi.testing import FakeCall

__all__ = [
    "APPROVAL_TOOL",
    "FLAKY_TOOL",
    "LONG_TOOLS",
    "SIDE_EFFECT_TOOLS",
    "TURN_KINDS",
    "CallKind",
    "SessionPlan",
    "plans",
]


@dataclass(frozen=True, slots=True)
class CallKind:
    """One kind of call: how often it is drawn and how its arguments are drawn."""

    weight: int
    make: Callable[[random.Random, str], FakeCall]


def _lookup(rng: random.Random, call_id: str) -> FakeCall:
    customer = rng.choice(["123", "123", "404", str(rng.randrange(1000))])
    return FakeCall("get_customer", {"customer_id": customer}, call_id=call_id)


def _refund(rng: random.Random, call_id: str) -> FakeCall:
    # Sometimes slow, so that a kill or a pause lands while the refund waits.
    delay = rng.choice([0, 0, 0, 200, 1500])
    arguments = {"order_id": f"ord_{call_id}", "amount_cents": rng.randrange(1, 10_000)}
    return FakeCall("create_refund", {**arguments, "delay_ms": delay}, call_id=call_id)


def _slow(rng: random.Random, call_id: str) -> FakeCall:
    # 5 s outlives the 3 s lease: the holder must renew it.
    delay = rng.choice([100, 300, 1000, 2500, 5000])
    return FakeCall("slow_echo", {"text": call_id, "delay_ms": delay}, call_id=call_id)


def _flaky(rng: random.Random, call_id: str) -> FakeCall:
    # Mostly within the 4 attempts of its retry policy; sometimes beyond them (it must fail).
    fail_times = rng.choice([0, 1, 1, 2, 2, 9])
    return FakeCall("flaky_lookup", {"key": call_id, "fail_times": fail_times}, call_id=call_id)


def _approval(rng: random.Random, call_id: str) -> FakeCall:
    return FakeCall("close_account", {"account_id": f"acct_{call_id}"}, call_id=call_id)


def _long(rng: random.Random, call_id: str) -> FakeCall:
    # Long enough that a cancelled turn usually meets it running (the nemesis cancels turns).
    tool = rng.choice(["long_task", "long_task_sync"])
    return FakeCall(tool, {"seconds": round(rng.uniform(2.0, 8.0), 2)}, call_id=call_id)


#: Every kind of call the soak makes, by name. The flaky and approval kinds are light: each
#: approval costs the approver a CLI process or two, and the machine is shared.
TURN_KINDS: dict[str, CallKind] = {
    "lookup": CallKind(8, _lookup),
    "refund": CallKind(6, _refund),
    "slow": CallKind(6, _slow),
    "flaky": CallKind(1, _flaky),
    "approval": CallKind(1, _approval),
    "long": CallKind(2, _long),
}

#: Tools whose every real execution writes one ledger line (checked: at most one per call).
SIDE_EFFECT_TOOLS = frozenset({"create_refund", "close_account"})

#: The tool the approver decides, and the one whose attempts the ledger counts.
APPROVAL_TOOL = "close_account"
FLAKY_TOOL = "flaky_lookup"

#: The "long" kind's tools, async and sync: they work for seconds, and a cancelled turn (the
#: nemesis cancels some) must stop them. Their ledger lines are ``{"call_id", "tool",
#: "phase": "start" | "end" | "cancelled"}``.
LONG_TOOLS = frozenset({"long_task", "long_task_sync"})


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """One session: when it starts (seconds after the start) and its turn's steps."""

    index: int
    at: float
    steps: list[list[FakeCall]]


def plans(seed: int, seconds: float, rate: float) -> list[SessionPlan]:
    """The sessions of a run, at ``rate`` per second for ``seconds``; the same for a seed."""
    rng = random.Random(f"workload-{seed}")
    names = list(TURN_KINDS)
    weights = [TURN_KINDS[name].weight for name in names]
    found: list[SessionPlan] = []
    for index in range(int(seconds * rate)):
        steps = []
        for step in range(rng.choice([1, 1, 2, 3])):
            calls = []
            for n in range(rng.randint(1, 4)):
                kind = rng.choices(names, weights)[0]
                calls.append(TURN_KINDS[kind].make(rng, f"s{index}_{step}_{n}_{kind}"))
            steps.append(calls)
        found.append(SessionPlan(index, index / rate, steps))
    return found
