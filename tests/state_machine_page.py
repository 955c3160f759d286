"""The documentation's state-machine reference, generated from the state table's compilers.

``python -m tests.state_machine_page`` prints the generated part of
``docs/how-it-works/state-machine.md``; ``--write`` puts it between the page's markers.
``tests/store/test_compile.py`` fails when the page is stale, so every change to a statement
or a script shows in a review as a change to this page.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentfn_asgi.calls.states import CLAIM_ORDER, TRANSITIONS, Transition
from agentfn_asgi.store.redis import scripts as lua
from agentfn_asgi.store.redis.compile import lua_apply
from agentfn_asgi.store.sql import statements as sql
from agentfn_asgi.store.sql.dialect import SQLITE

PAGE = Path(__file__).resolve().parents[1] / "docs" / "how-it-works" / "state-machine.md"
BEGIN = "<!-- state-machine:begin (generated: python -m tests.state_machine_page --write) -->"
END = "<!-- state-machine:end -->"


def _sql(template: str) -> str:
    return SQLITE.render(template).text.strip()


def _from(row: Transition) -> str:
    ways = []
    for way in row.ways:
        states = ", ".join(sorted(s.value for s in way.states)) or "(no record)"
        guards = " + ".join(sorted(g.value for g in way.guards))
        ways.append(f"{states}" + (f" [{guards}]" if guards else ""))
    return "; ".join(ways)


def _table() -> str:
    lines = [
        "| row | operation | from [guards] | to | sets | event |",
        "|---|---|---|---|---|---|",
    ]
    for row in TRANSITIONS.values():
        sets = ", ".join(f"`{name}` ← `{source}`" for name, source in row.sets) or "—"
        event = f"`{row.event}`" if row.event else "—"
        if row.event and row.says:
            event += " (" + ", ".join(sorted(row.says)) + ")"
        cells = (f"`{row.name}`", f"`{row.operation}`", _from(row), f"`{row.target.value}`")
        lines.append(f"| {' | '.join(cells)} | {sets} | {event} |")
    return "\n".join(lines)


def markdown() -> str:
    """The generated part of the page."""
    parts = ["## The rows\n", _table(), "\n## The claim\n"]
    order = ", then ".join(f"`{name}` ({status.value})" for name, status in CLAIM_ORDER)
    parts.append(
        f"A claim takes the first row that holds: {order}; none: `busy`, `saved` or `done` by"
        " the record's state. SQL, without a limit: one upsert (the `claim` row inserted, the"
        " `take_over` row on conflict, every column kept for `reclaim`), then the `retry` row,"
        " then a read (and the `adopt` row when the read saw a lapsed waiter):\n"
    )
    parts.append(f"```sql\n{_sql(sql.CLAIM)}\n```\n")
    parts.append("With a limit, in the limiter's transaction, the insert alone first:\n")
    parts.append(f"```sql\n{_sql(sql.CLAIM_NEW)}\n```\n")
    body = lua.CLAIM[lua.CLAIM.index("local function decide()") :]
    parts.append(f"Lua, after the rows' functions (below):\n\n```lua\n{body.strip()}\n```\n")
    parts.append("## Each row\n")
    for name, row in TRANSITIONS.items():
        parts.append(f"### `{name}`\n")
        if name in sql.TRANSITIONS_RETURNING:
            parts.append(f"```sql\n{_sql(sql.TRANSITIONS_RETURNING[name])}\n```\n")
        if (
            name in ("claim", "take_over", "retry", "adopt")
            or name in lua.TRANSITIONS
            or (row.operation == "admit_call")
        ):
            parts.append(f"```lua\n{lua_apply(name).strip()}\n```\n")
        if name == "reclaim":
            parts.append("Changes nothing: the claim answers the record as it is.\n")
        if name == "prune":
            parts.append("Removes the record (a batch of finished calls at a time).\n")
    return "\n".join(parts).rstrip() + "\n"


def page_section(text: str) -> str:
    """The generated part of ``text`` (the page as it is)."""
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def main() -> None:
    if "--write" in sys.argv:
        text = PAGE.read_text(encoding="utf-8")
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        PAGE.write_text(f"{head}{BEGIN}\n{markdown()}{END}{tail}", encoding="utf-8")
    else:
        sys.stdout.write(markdown())


if __name__ == "__main__":
    main()
