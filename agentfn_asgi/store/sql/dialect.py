"""The dialect layer of the SQL stores: what SQLite and PostgreSQL spell differently.

The statements of :mod:`agentfn_asgi.store.sql.store` are written once, with named parameters
(``:now``) and a few words in braces that a :class:`Dialect` fills in (:data:`WORDS`):

- ``{p}`` prefixes every table and index name: nothing for SQLite, ``"schema".`` for
  PostgreSQL (each store lives in its own schema there);
- ``{text}``, ``{real}``, ``{integer}``, ``{boolean}``: the column types (SQLite keeps a
  boolean as an integer; ``true``/``false`` are literals in both);
- ``{rowid}``, ``{skip_locked}``: how prune addresses small batches of rows;
- ``{for_update}``: after a read inside a transaction, lock the rows read until it ends
  (PostgreSQL); nothing in SQLite, whose transactions that change anything begin with the
  write lock (``BEGIN IMMEDIATE``);
- ``{json_object}``: the function that builds a JSON object from key/value pairs (a call's
  history events are built inside the statement that makes the change);
- ``{strpos}``, ``{newline}``: where a text occurs in another (same argument order in both)
  and a newline character, with which the statements keep a call's bounded history.

Parameters: SQLite's driver takes ``:name`` with a mapping, so the text is left as it is;
asyncpg takes ``$1, $2…`` with an ordered list, so :meth:`Dialect.render` numbers the names
in order of first use and :meth:`Query.arguments` orders the values. String literals in the
statements must not contain ``:`` followed by a letter.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

__all__ = ["SQLITE", "WORDS", "Dialect", "Query", "postgres_dialect", "quote_identifier"]

#: The words in braces a dialect fills in (every other one is filled in by ``_sql``); each
#: but ``p`` (the prefix) is the name of a :class:`Dialect` field.
WORDS: Final = (
    "p",
    "text",
    "real",
    "integer",
    "boolean",
    "rowid",
    "skip_locked",
    "for_update",
    "json_object",
    "strpos",
    "newline",
)


@dataclass(frozen=True, slots=True)
class Query:
    """A statement rendered for one dialect."""

    text: str
    #: Parameter names in ``$n`` order (PostgreSQL); empty when the driver takes ``:name``.
    order: tuple[str, ...] = ()

    def arguments(self, params: Mapping[str, object]) -> list[object]:
        """The positional arguments for ``$1, $2…`` (asyncpg)."""
        return [params[name] for name in self.order]


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one database spells what the shared SQL leaves open."""

    prefix: str  # before every table and index name
    numbered: bool  # $1, $2… with an ordered argument list, instead of :name
    text: str
    real: str
    integer: str
    boolean: str
    rowid: str  # the physical address of a row: prune deletes small batches by it
    skip_locked: str  # after prune's inner SELECT: leave rows another writer holds
    for_update: str  # after a SELECT in a transaction: hold its rows until the end
    json_object: str  # json_object(k1, v1, ...) in SQLite, json_build_object in PostgreSQL
    strpos: str  # strpos(text, sought): 1-based position, 0 when absent
    newline: str  # a newline character, as an SQL expression
    # Rendered statements by template: a dict lookup on the hot path, nothing more.
    _rendered: dict[str, Query] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def render(self, template: str) -> Query:
        """The statement ``template`` in this dialect (cached: templates are constants)."""
        query = self._rendered.get(template)
        if query is None:
            query = self._rendered[template] = _render(self, template)
        return query


SQLITE: Final = Dialect(
    prefix="",
    numbered=False,
    text="TEXT",
    real="REAL",
    integer="INTEGER",
    boolean="INTEGER",
    rowid="rowid",
    skip_locked="",  # SQLite has one writer at a time: nothing to skip
    for_update="",  # the transaction holds the write lock from BEGIN IMMEDIATE on
    json_object="json_object",
    strpos="instr",
    newline="char(10)",
)


def quote_identifier(name: str) -> str:
    """``name`` as a PostgreSQL quoted identifier: any text is safe, case is kept."""
    return '"' + name.replace('"', '""') + '"'


def postgres_dialect(schema: str) -> Dialect:
    """PostgreSQL, with every table and index in ``schema``."""
    return Dialect(
        prefix=quote_identifier(schema) + ".",
        numbered=True,
        text="text",
        real="double precision",  # exactly a Python float, like SQLite's REAL
        integer="integer",
        boolean="boolean",
        rowid="ctid",
        skip_locked="FOR UPDATE SKIP LOCKED",
        for_update="FOR UPDATE",
        json_object="json_build_object",
        strpos="strpos",
        newline="chr(10)",
    )


_PARAMETER: Final = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def _render(dialect: Dialect, template: str) -> Query:
    # The prefix goes in last: a quoted schema name may itself contain ":" or "$".
    words = {word: getattr(dialect, word) for word in WORDS if word != "p"}
    text = template.format(p="{p}", **words)
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in order:
            order.append(name)
        return f"${order.index(name) + 1}"

    if dialect.numbered:
        text = _PARAMETER.sub(number, text)
    return Query(text.replace("{p}", dialect.prefix), tuple(order))
