"""The store's bulk writes on hot paths, straight on the DB-API cursor of the session's connection (so inside the
caller's transaction): SQL text built once per table, column list and dialect; values passed as tuples.

For the small batches of a group commit, SQLAlchemy's per-statement work (compiling, cache keys, parameter dicts,
result objects) cost more than the database itself; these four statements (update tasks, gangs, jobs; insert
events) are most of what the job manager writes. Everything else goes through SQLAlchemy.

- UPDATE by primary key: SQLite, one executemany (in-process: no round trips); PostgreSQL, one
  `UPDATE ... FROM unnest(<an array per column>)` per chunk, so a batch is one round trip whatever its size.
- INSERT: SQLite, one executemany; PostgreSQL, one multi-row INSERT (psycopg2's execute_values) or, for big
  batches, COPY (several times faster again: nothing to render).
- A whole group commit (write_batch, PostgreSQL): the inserts and updates of every table, the fence's epoch
  check and the new jobs' pools' check as one statement of data-modifying CTEs, so a batch is one round trip and
  the commit (issue 24: 11 statements per gang down to 2).

On psycopg 3 (`postgresql+psycopg://`, measured and not adopted: docs/performance.md) the same, without
execute_values (a multi-row INSERT of its own) and with COPY written row by row.
"""

from __future__ import annotations

import functools
import hashlib
import io
import re
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg2
from psycopg2.extras import execute_values
from sqlalchemy import String, Table
from sqlalchemy.orm import Session

from peloton.store.db import COMMIT_CHECK, COMMIT_CHECKED, RawTransaction, count_statement

# a statement PostgreSQL would not prepare (its types not inferred): the batch goes as text (commit_batch)
_NOT_PREPARED = (psycopg2.ProgrammingError, psycopg2.DataError)

# where the bulk writers write: a Session's transaction, or a kept connection's raw one (db.RawTransaction)
Tx = Session | RawTransaction

UPDATE_CHUNK = 250  # rows per PostgreSQL UPDATE statement
COPY_ABOVE = 500  # rows: COPY beats a rendered multi-row INSERT on PostgreSQL above this


def cursor(s: Tx) -> tuple[Any, str]:
    """The session's DB-API cursor (no SQLAlchemy statement machinery: the hot path) and its dialect's name."""
    conn = s.connection()
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None  # (None only once the connection is closed)
    return dbapi.cursor(), conn.dialect.name


def _psycopg3(s: Tx) -> bool:
    """The PostgreSQL driver is psycopg 3 (`postgresql+psycopg://`), not psycopg2."""
    return s.get_bind().dialect.driver == "psycopg"


def update_rows(s: Tx, table: Table, keys: tuple[str, ...], cols: tuple[str, ...],
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
                cur.execute(sql, [pg_array(r[i] for r in chunk) for i in range(width)])
                n += cur.rowcount
                count_statement("UPDATE", table.name)
            return n
        cur.executemany(_sqlite_update_sql(table.name, keys, cols), [(*r[len(keys):], *r[:len(keys)]) for r in rows])
        count_statement("UPDATE", table.name)
        return int(cur.rowcount)
    finally:
        cur.close()


def insert_rows(s: Tx, table: Table, cols: tuple[str, ...], rows: Sequence[Sequence[Any]]) -> None:
    if not rows:
        return
    cur, dialect = cursor(s)
    column_list = ", ".join(f'"{c}"' for c in cols)
    try:
        if dialect != "postgresql":
            marks = ", ".join("?" for _ in cols)
            cur.executemany(f'INSERT INTO "{table.name}" ({column_list}) VALUES ({marks})', rows)
            count_statement("INSERT", table.name)
        elif _psycopg3(s):  # no execute_values: one multi-row INSERT, or COPY (binary-safe rows, no text to escape)
            if len(rows) < COPY_ABOVE:
                marks = "(" + ", ".join("%s" for _ in cols) + ")"
                cur.execute(f'INSERT INTO "{table.name}" ({column_list}) VALUES ' + ", ".join(marks for _ in rows),
                            [v for r in rows for v in r])
                count_statement("INSERT", table.name)
            else:
                with cur.copy(f'COPY "{table.name}" ({column_list}) FROM STDIN') as copy:
                    for r in rows:
                        copy.write_row(r)
                count_statement("COPY", table.name)
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
    # (here, once per table and shape: a daemon on SQLite never loads the dialect, ~40 ms of its start now that a
    # restart imports no Alembic either; docs/performance.md, "Starting and stopping the daemon")
    from sqlalchemy.dialects import postgresql

    names = (*keys, *cols)
    # a string column's array without its length (VARCHAR[], not VARCHAR(256)[]): an explicit cast to VARCHAR(n)
    # cuts longer text short without a word, where the assignment to the column refuses it, as an INSERT does
    types = [(String() if type(t) is String and t.length else t).compile(dialect=postgresql.dialect())
             for t in (table.c[c].type for c in names)]
    sets = ", ".join(f'"{c}" = v."{c}"' for c in cols)
    arrays = ", ".join(f"%s::{t}[]" for t in types)
    cond = " AND ".join(f't."{k}" = v."{k}"' for k in keys)
    column_list = ", ".join(f'"{c}"' for c in names)
    return f'UPDATE "{table.name}" AS t SET {sets} FROM unnest({arrays}) AS v({column_list}) WHERE {cond}'


def pg_array(values: Iterable[Any]) -> str:
    """A PostgreSQL array literal of `values` (str, int, float, bool or None), the text a `%s::type[]` cast reads:
    one parameter for psycopg2 to quote where a list is one per element. An 8-member gang's task update took the
    writer 118 µs of CPU to render as lists and 44 µs as literals (docs/performance.md)."""
    return "{" + ",".join(map(_array_element, values)) + "}"


def _array_element(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, str):  # always quoted: "", "NULL", braces, commas and blanks are text
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, bool):
        return "t" if v else "f"
    if isinstance(v, float):
        return repr(v)  # exact; PostgreSQL reads inf, -inf and nan too
    if isinstance(v, int):
        return str(v)
    raise TypeError(f"no array literal for {type(v).__name__}")


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


# --- a whole batch in one statement (PostgreSQL) -----------------------------------------------------------------
# A group commit's writes (new jobs' rows, the updates of jobs, gangs and tasks, the task events) and the fence's
# epoch check (leadership/fence.py) as one statement of data-modifying CTEs: one round trip and one parse for the
# whole batch instead of one per table, then the commit. The sub-statements share one snapshot, so a row must not be
# both inserted and updated in one batch (the caller sends those one table at a time), and the foreign keys are
# checked at the end of the statement, when every CTE's rows are in.
# The new jobs' pools are locked (FOR KEY SHARE, as a foreign key's check would) and counted in the same statement,
# those that are leaves apart (their row's `children` is 0): a pool deleted, or given a child, before is gone from the
# count, and one not deleted yet cannot be until the batch committed, nor given a child, since DeletePool locks the
# pool's row before it counts the pool's jobs (repo.delete_pool), CreatePool the parent's (repo.lock_pool_tree). A
# statement that waited for that lock has a snapshot older than the child's row: READ COMMITTED reads again only the
# row it waited for, as the pool change left it (EvalPlanQual), so leafness is a column of that row, not a count of
# children in the statement. No foreign key: a pool may be deleted with finished jobs in it.
FENCE_INFO = COMMIT_CHECK  # Session.info: the object whose epochs every commit checks (Fence)
FENCE_CHECKED = COMMIT_CHECKED  # Session.info: this transaction's epochs were read with its writes


class Insert:
    """Rows to INSERT into one table: every row has `cols`, in that order."""
    __slots__ = ("table", "cols", "rows")

    def __init__(self, table: Table, cols: tuple[str, ...]) -> None:
        self.table, self.cols = table, cols
        self.rows: list[Sequence[Any]] = []


class Update:
    """Rows to UPDATE by primary key (`keys`' values first, then `cols`')."""
    __slots__ = ("table", "keys", "cols", "rows")

    def __init__(self, table: Table, keys: tuple[str, ...], cols: tuple[str, ...], rows: Sequence[Sequence[Any]]) -> None:
        self.table, self.keys, self.cols, self.rows = table, keys, cols, rows


def fits_one_statement(inserts: Sequence[Insert], updates: Sequence[Update]) -> bool:
    """Small enough for write_batch (bigger batches: a statement per table, chunked or COPY, as above)."""
    return (all(len(i.rows) < COPY_ABOVE for i in inserts) and all(len(u.rows) <= UPDATE_CHUNK for u in updates)
            and sum(len(i.rows) for i in inserts) + sum(len(u.rows) for u in updates) <= 4 * UPDATE_CHUNK)


def write_batch(s: Tx, inserts: Sequence[Insert], updates: Sequence[Update], pools: Sequence[str] = ()) -> list[int]:
    """PostgreSQL only: every insert and update (and, when the session has a fence, its epoch check) in one
    statement. Returns how many rows each update with rows changed (fewer than given: some did not exist). A fence
    that finds another leader raises (its `checked`) after the statement: the caller rolls back. `pools`: the new
    jobs' pools, locked until the commit; NoPool when one does not exist or has children (the caller rolls back)."""
    fence = s.info.get(FENCE_INFO)
    wanted = sorted(set(pools))
    sql, params = batch_sql(inserts, updates, None if fence is None else list(fence.keys), pools=wanted)
    if not sql:
        return []
    cur, _ = cursor(s)
    try:
        cur.execute(sql, params)
        row = cur.fetchone()
    finally:
        cur.close()
    count_statement("BATCH", "*")
    n = sum(1 for u in updates if u.rows)
    if fence is not None:
        fence.checked(s, list(zip(row[n] or [], row[n + 1] or [], strict=True)))
    if wanted and int(row[-1]) != len(wanted):
        raise NoPool(len(wanted) - int(row[-2]))
    return [int(c) for c in row[:n]]


def commit_batch(tx: RawTransaction, inserts: Sequence[Insert], updates: Sequence[Update],
                 pools: Sequence[str] = ()) -> None:
    """PostgreSQL only, on a raw transaction that has sent nothing yet (`tx.fresh`): write_batch's statement as the
    whole transaction, sent in autocommit, so that the server commits it as it ends, durably before it answers
    (synchronous_commit): one round trip where BEGIN, the statement and COMMIT were three. What the caller checked
    before committing, the statement checks itself, failing (and rolling back with it) when an update finds fewer
    rows than it has (Missing), the fence finds another leader (its Fenced, from reading the epochs again) or a
    new job's pool does not exist or has children (NoPool)."""
    assert tx.fresh, "commit_batch: the statement must be the whole transaction"
    fence = tx.info.get(FENCE_INFO)
    sql, params = batch_sql(inserts, updates, None if fence is None else list(fence.keys),
                            checked=[] if fence is None else [fence.epochs[k] for k in fence.keys],
                            pools=sorted(set(pools)))
    if not sql:
        return  # nothing to send: the caller's commit ends the transaction
    cur, _ = cursor(tx)
    dbapi = cur.connection
    try:
        dbapi.autocommit = True  # (no round trip: psycopg sends nothing for it)
        try:
            name = None if _psycopg3(tx) else _prepared(cur, sql)
            if name is None:
                cur.execute(sql, params)
            else:
                try:
                    cur.execute(_execute_text(name, len(params)), params)
                except psycopg2.errors.InvalidSqlStatementName:
                    # the server session that prepared it is not this one: a pooler between (PgBouncer in
                    # transaction mode hands each transaction any server connection). The EXECUTE ran nothing;
                    # this connection prepares nothing more, and the batch goes as text
                    _NOT_PREPARING.add(dbapi)
                    cur.execute(sql, params)
        finally:
            dbapi.autocommit = False
    except Exception as e:
        refused = _REFUSED.search(str(e))
        if refused is None:
            raise
        if refused.group(1) == "fenced" and fence is not None:
            fence.check_raw(tx)  # raises its Fenced (and tells the daemon), having read the epochs again
            raise
        if refused.group(1) == "nopool":  # (the text has how many were found, then how many of them are leaves)
            raise NoPool(len(set(pools)) - int(refused.group(2))) from e
        raise Missing(int(refused.group(2)), int(refused.group(3))) from e
    finally:
        cur.close()
    count_statement("BATCH", "*")
    tx.committed = True


# A batch statement's text is prepared on the server once per connection and shape (commit_batch, psycopg2): parsed
# once, and on a writer's connection planned once (db.WRITER_PG_SETTINGS keeps its generic plan), where its ~5 KB of
# CTEs took PostgreSQL 0.2-0.3 ms to plan at every commit (EXPLAIN ANALYZE).
# Prepared in autocommit, outside any transaction (a PREPARE that failed would abort the batch's); one that fails is
# not tried again on that connection, and the batch goes as text. Its name is a hash of its text: a name stands for
# one statement whichever client prepared it, so an EXECUTE that reaches a server session prepared by another client
# (a pooler between) runs what it means or finds no such name (then the batch goes as text), never another shape's
# statement with this one's parameters; and a PREPARE that finds its name there already has it.
PREPARED_PER_CONNECTION = 128  # shapes: a group commit's repeat (a gang's create, intent, RUNNING, end, by size)
_PREPARED: weakref.WeakKeyDictionary[Any, dict[str, str | None]] = weakref.WeakKeyDictionary()
_NOT_PREPARING: weakref.WeakSet[Any] = weakref.WeakSet()  # connections whose prepared names went missing


def _prepared(cur: Any, sql: str) -> str | None:
    """The name of `sql` prepared on the cursor's connection (in autocommit), None if it is not (to be)."""
    if cur.connection in _NOT_PREPARING:
        return None
    names = _PREPARED.get(cur.connection)
    if names is None:
        names = _PREPARED[cur.connection] = {}
    if sql in names:
        return names[sql]
    if len(names) >= PREPARED_PER_CONNECTION:
        return None
    name: str | None = statement_name(sql)
    try:
        cur.execute(f"PREPARE {name} AS {_numbered(sql)}")
        count_statement("PREPARE", "*")
    except psycopg2.errors.DuplicatePreparedStatement:
        pass  # prepared on this server session by another client: the same text (its name says so)
    except _NOT_PREPARED:
        name = None
    names[sql] = name
    return name


@functools.lru_cache(maxsize=1024)
def statement_name(sql: str) -> str:
    """The name a batch text is prepared under: the same for the same text on every connection."""
    return "peloton_batch_" + hashlib.blake2b(sql.encode(), digest_size=10).hexdigest()


@functools.lru_cache(maxsize=1024)
def _numbered(sql: str) -> str:
    """A batch text's %s placeholders as PREPARE's $1, $2, ... (the text has no other %)."""
    parts = sql.split("%s")
    return parts[0] + "".join(f"${i}{part}" for i, part in enumerate(parts[1:], 1))


@functools.lru_cache(maxsize=1024)
def _execute_text(name: str, n: int) -> str:
    return f"EXECUTE {name} (" + ", ".join("%s" for _ in range(n)) + ")"


class Missing(Exception):
    """commit_batch: the `index`-th of the updates with rows found only `found` of them."""

    def __init__(self, index: int, found: int) -> None:
        super().__init__(f"update {index}: {found} rows found")
        self.index, self.found = index, found


def count_pools(s: Tx, pools: Sequence[str]) -> tuple[int, int]:
    """How many of `pools` (distinct paths) exist, and how many of those are leaves (no children), each locked until
    the transaction ends on PostgreSQL (FOR KEY SHARE, as in write_batch's statement); the check of a batch that
    does not go as one statement."""
    cur, dialect = cursor(s)
    try:
        if dialect == "postgresql":
            cur.execute("SELECT count(*), count(*) FILTER (WHERE children = 0) FROM (SELECT path, children FROM "
                        "resource_pools WHERE path = ANY(%s) ORDER BY path FOR KEY SHARE) p", (list(pools),))
        else:
            cur.execute("SELECT count(*), count(CASE WHEN children = 0 THEN 1 END) FROM resource_pools WHERE path IN ("
                        + ", ".join("?" for _ in pools) + ")", list(pools))
        count_statement("SELECT", "resource_pools")
        found, leaves = cur.fetchone()
        return int(found), int(leaves)
    finally:
        cur.close()


class NoPool(Exception):
    """write_batch, commit_batch: not every one of the new jobs' pools is a leaf that exists: `missing` of them do
    not exist (deleted meanwhile), the others that fail have children (given one meanwhile)."""

    def __init__(self, missing: int) -> None:
        super().__init__(f"not every one of the new jobs' pools is a leaf ({missing} do not exist)")
        self.missing = missing


# what commit_batch's statement fails with when a check fails: the text that failed the cast to bigint (no colons:
# pgbench, replaying the statement, would take `:name` for a variable, benchmarks/durability_bench.py)
_REFUSED = re.compile(r"peloton-(fenced|missing|nopool)-(\d*)-?(\d*)")


def batch_sql(inserts: Sequence[Insert], updates: Sequence[Update], fence_keys: list[str] | None,
              checked: list[int] | None = None, *, pools: Sequence[str] = ()) -> tuple[str, list[Any]]:
    """write_batch's statement and parameters ("" when there is nothing to send). It selects the count of each
    update's rows, then the fence's keys and values (two arrays, in key order), then (with `pools`: distinct paths)
    how many of `pools` exist, each of those locked (FOR KEY SHARE), and how many of those are leaves. With
    `checked` (the fence's epochs, in key order; [] with no fence), commit_batch's: it checks those itself and fails
    when one is wrong (for the pools: unless every one is a leaf)."""
    ins = [i for i in inserts if i.rows]
    ups = [u for u in updates if u.rows]
    if not ins and not ups and fence_keys is None:
        return "", []
    params: list[Any] = []
    for i in ins:
        for r in i.rows:
            params.extend(r)
    for u in ups:
        params.extend(pg_array(col) for col in zip(*u.rows, strict=True))  # an array per column
    if fence_keys is not None:
        params.append(fence_keys)
    if pools:
        params.append(list(pools))
    if checked is not None:
        params.extend(len(u.rows) for u in ups)
        if fence_keys is not None:
            params.append(checked)
        if pools:
            params.append(len(pools))
    sql = _batch_text(tuple((i.table, i.cols, len(i.rows)) for i in ins), tuple((u.table, u.keys, u.cols) for u in ups),
                      fence_keys is not None, checked is not None, bool(pools))
    return sql, params


@functools.lru_cache(maxsize=1024)
def _batch_text(inserts: tuple[tuple[Table, tuple[str, ...], int], ...],
                updates: tuple[tuple[Table, tuple[str, ...], tuple[str, ...]], ...], fence: bool,
                checked: bool = False, pools: bool = False) -> str:
    """batch_sql's text for a batch of this shape (the tables, their columns, the inserts' row counts): a group
    commit's shapes repeat (a gang's create, intent, RUNNING, end), so the text is built once per shape."""
    parts: list[str] = []
    for n, (table, cols, rows) in enumerate(inserts):
        marks = "(" + ", ".join("%s" for _ in cols) + ")"
        column_list = ", ".join(f'"{c}"' for c in cols)
        parts.append(f'i{n} AS (INSERT INTO "{table.name}" ({column_list}) VALUES '
                     + ", ".join(marks for _ in range(rows)) + " RETURNING 1)")
    selects: list[str] = []
    for n, (table, keys, cols) in enumerate(updates):
        parts.append(f"u{n} AS ({_pg_update_sql(table, keys, cols)} RETURNING 1)")
        selects.append(f"(SELECT count(*) FROM u{n})")
    if fence:
        parts.append("f AS (SELECT key, value FROM meta WHERE key = ANY(%s) ORDER BY key FOR KEY SHARE)")
        selects += ["(SELECT array_agg(key ORDER BY key) FROM f)", "(SELECT array_agg(value ORDER BY key) FROM f)"]
    if pools:
        # `children` as the lock found it: a pool change that held the row is committed by then, and the row is
        # read again as it left it (the statement's snapshot alone would not see a child created meanwhile)
        parts.append("p AS (SELECT path, children FROM resource_pools WHERE path = ANY(%s) ORDER BY path "
                     "FOR KEY SHARE)")
        selects += ["(SELECT count(*) FROM p)", "(SELECT count(*) FROM p WHERE children = 0)"]
    if checked:
        # a failed check casts text naming it to bigint: the error (with the text) fails the statement. The text
        # reads a CTE, so the planner cannot fold the cast (and fail) ahead of the CASE
        whens = [f"WHEN (SELECT count(*) FROM u{n}) <> %s THEN CAST('peloton-missing-{n}-' || "
                 f"(SELECT count(*) FROM u{n}) AS bigint)" for n in range(len(updates))]
        if fence:
            whens.append("WHEN (SELECT array_agg(coalesce(value, '0')::bigint ORDER BY key) FROM f) IS DISTINCT FROM "
                         "%s::bigint[] THEN CAST('peloton-fenced-' || (SELECT count(*) FROM f) AS bigint)")
        if pools:
            whens.append("WHEN (SELECT count(*) FROM p WHERE children = 0) <> %s THEN CAST('peloton-nopool-' || "
                         "(SELECT count(*) FROM p) || '-' || (SELECT count(*) FROM p WHERE children = 0) AS bigint)")
        selects = ["CASE " + " ".join(whens) + " ELSE 0 END"] if whens else []
    # the inserts' CTEs are read by nothing: PostgreSQL runs a data-modifying CTE all the same
    return "WITH " + ", ".join(parts) + " SELECT " + (", ".join(selects) or "1")
