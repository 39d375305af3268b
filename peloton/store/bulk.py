"""The store's bulk writes on hot paths, straight on the DB-API cursor of the session's connection (so inside the
caller's transaction): SQL text built once per table, column list and dialect; values passed as tuples.

For the small batches of a group commit, SQLAlchemy's per-statement work (compiling, cache keys, parameter dicts,
result objects) cost more than the database itself; these four statements (update tasks, gangs, jobs; insert
events) are most of what the job manager writes. Everything else goes through SQLAlchemy.

- UPDATE by primary key: SQLite, one executemany (in-process: no round trips); PostgreSQL, one
  `UPDATE ... FROM unnest(<an array per column>)` per chunk, so a batch is one round trip whatever its size.
- INSERT: SQLite, one executemany; PostgreSQL, one multi-row INSERT (psycopg2's execute_values) or, for big
  batches, COPY (several times faster again: nothing to render).
"""

from __future__ import annotations

import functools
import io
from collections.abc import Sequence
from typing import Any

from psycopg2.extras import execute_values
from sqlalchemy import Table
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from peloton.store.db import count_statement

UPDATE_CHUNK = 250  # rows per PostgreSQL UPDATE statement
COPY_ABOVE = 500  # rows: COPY beats a rendered multi-row INSERT on PostgreSQL above this


def cursor(s: Session) -> tuple[Any, str]:
    """The session's DB-API cursor (no SQLAlchemy statement machinery: the hot path) and its dialect's name."""
    conn = s.connection()
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None  # (None only once the connection is closed)
    return dbapi.cursor(), conn.dialect.name


def update_rows(s: Session, table: Table, keys: tuple[str, ...], cols: tuple[str, ...],
                rows: Sequence[Sequence[Any]]) -> int:
    """UPDATE the rows whose primary key (`keys`) is each row's first values, setting `cols` to the rest.
    Returns how many rows were changed (fewer than given: some did not exist)."""
    if not rows:
        return 0
    cur, dialect = cursor(s)
    try:
        if dialect == "postgresql":
            sql = _pg_update_sql(table, keys, cols)
            n = 0
            width = len(keys) + len(cols)
            for start in range(0, len(rows), UPDATE_CHUNK):
                chunk = rows[start:start + UPDATE_CHUNK]
                cur.execute(sql, [[r[i] for r in chunk] for i in range(width)])
                n += cur.rowcount
                count_statement("UPDATE", table.name)
            return n
        cur.executemany(_sqlite_update_sql(table.name, keys, cols), [(*r[len(keys):], *r[:len(keys)]) for r in rows])
        count_statement("UPDATE", table.name)
        return int(cur.rowcount)
    finally:
        cur.close()


def insert_rows(s: Session, table: Table, cols: tuple[str, ...], rows: Sequence[Sequence[Any]]) -> None:
    if not rows:
        return
    cur, dialect = cursor(s)
    column_list = ", ".join(f'"{c}"' for c in cols)
    try:
        if dialect != "postgresql":
            marks = ", ".join("?" for _ in cols)
            cur.executemany(f'INSERT INTO "{table.name}" ({column_list}) VALUES ({marks})', rows)
            count_statement("INSERT", table.name)
        elif len(rows) < COPY_ABOVE:
            execute_values(cur, f'INSERT INTO "{table.name}" ({column_list}) VALUES %s', rows, page_size=1000)
            count_statement("INSERT", table.name)
        else:
            data = "".join("\t".join(_copy_field(v) for v in r) + "\n" for r in rows)
            cur.copy_expert(f'COPY "{table.name}" ({column_list}) FROM STDIN', io.StringIO(data))
            count_statement("COPY", table.name)
    finally:
        cur.close()


@functools.cache
def _sqlite_update_sql(table: str, keys: tuple[str, ...], cols: tuple[str, ...]) -> str:
    sets = ", ".join(f'"{c}" = ?' for c in cols)
    cond = " AND ".join(f'"{k}" = ?' for k in keys)
    return f'UPDATE "{table}" SET {sets} WHERE {cond}'


@functools.cache
def _pg_update_sql(table: Table, keys: tuple[str, ...], cols: tuple[str, ...]) -> str:
    names = (*keys, *cols)
    types = [table.c[c].type.compile(dialect=postgresql.dialect()) for c in names]
    sets = ", ".join(f'"{c}" = v."{c}"' for c in cols)
    arrays = ", ".join(f"%s::{t}[]" for t in types)
    cond = " AND ".join(f't."{k}" = v."{k}"' for k in keys)
    column_list = ", ".join(f'"{c}"' for c in names)
    return f'UPDATE "{table.name}" AS t SET {sets} FROM unnest({arrays}) AS v({column_list}) WHERE {cond}'


def _copy_field(v: Any) -> str:
    """A value in COPY's text format: NULL is \\N; backslash, tab and line breaks escaped."""
    if v is None:
        return "\\N"
    if isinstance(v, bool):
        return "t" if v else "f"
    text = v if isinstance(v, str) else repr(v) if isinstance(v, float) else str(v)
    if "\\" in text or "\t" in text or "\n" in text or "\r" in text:
        text = text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return text
