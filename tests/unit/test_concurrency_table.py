"""docs/architecture.md's concurrency tables are checked against the code: every thread, loop, thread pool, lock,
condition, event and semaphore created in peloton/ has a row, and every row names something that exists.

A row is keyed by its first cell, a backticked `module:name` (module relative to peloton/):
- a primitive assigned to an attribute: `hostmgr/manager.py:HostManager._lock` (class, attribute);
- one assigned to a name: `files.py:_UMASK` (module level), `jobmgr/writer.py:_joined.lock` (in a function);
- a thread, thread pool or loop with a literal name: that name (`hostmgr/mesos/client.py:mesos-subscription`,
  `server.py:loop-launcher-{i}`, `server.py:grpc_*`), as it shows in logs and in py-spy;
- a subclass of threading.Thread: `module:Class`;
- anything else: `module:Scope.Kind()` (the function that creates it, and what it is).
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "peloton"
DOC = ROOT / "docs" / "architecture.md"

LOCKS = frozenset({"Lock", "RLock", "Condition", "Event", "Semaphore", "BoundedSemaphore", "Barrier"})
THREADS = frozenset({"Thread", "Timer", "ThreadPoolExecutor", "Loop"})
KEY = re.compile(r"`([\w./-]+\.py:[^`]+)`")


def _kind(call: ast.Call, threading_names: set[str], imported: dict[str, str]) -> str | None:
    """What `call` creates, if it is one of LOCKS or THREADS: threading.X(...), X(...) imported from threading,
    (concurrent.)futures.ThreadPoolExecutor(...), Loop(...) (peloton.loop)."""
    f = call.func
    if isinstance(f, ast.Attribute):
        base = f.value
        if isinstance(base, ast.Name) and base.id in threading_names and f.attr in LOCKS | THREADS:
            return f.attr
        if f.attr == "ThreadPoolExecutor":
            return "ThreadPoolExecutor"
        if f.attr == "Loop" and isinstance(base, ast.Name) and base.id == "loop":
            return "Loop"
        return None
    if isinstance(f, ast.Name) and f.id in imported:
        return imported[f.id]
    return None


def _literal(node: ast.expr | None) -> str | None:
    """A string constant, or an f-string as written (`f"launcher-{i}"` -> `launcher-{i}`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        out = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                out.append(str(v.value))
            elif isinstance(v, ast.FormattedValue):
                out.append("{" + ast.unparse(v.value) + "}")
        return "".join(out)
    return None


def _thread_name(kind: str, call: ast.Call) -> str | None:
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    if kind == "Loop":
        name = _literal(call.args[0]) if call.args else _literal(kw.get("name"))
        return f"loop-{name}" if name is not None else None
    if kind == "ThreadPoolExecutor":
        prefix = _literal(kw.get("thread_name_prefix"))
        return f"{prefix}_*" if prefix is not None else None
    if kind in ("Thread", "Timer"):
        return _literal(kw.get("name"))
    return None


def primitives(source: str, module: str) -> dict[str, str]:
    """Every concurrency primitive `source` creates: key -> kind (see the module docstring for the keys)."""
    tree = ast.parse(source)
    threading_names: set[str] = set()
    imported: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "threading":
                    threading_names.add(a.asname or a.name)
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if node.module == "threading" and a.name in LOCKS | THREADS:
                    imported[a.asname or a.name] = a.name
                elif node.module in ("concurrent.futures", "concurrent") and a.name == "ThreadPoolExecutor":
                    imported[a.asname or a.name] = "ThreadPoolExecutor"
                elif node.module == "peloton.loop" and a.name == "Loop":
                    imported[a.asname or a.name] = "Loop"
    found: dict[str, str] = {}

    def visit(node: ast.AST, scope: list[str], cls: str | None) -> None:
        if isinstance(node, ast.ClassDef):
            for b in node.bases:
                if (isinstance(b, ast.Attribute) and isinstance(b.value, ast.Name)
                        and b.value.id in threading_names and b.attr == "Thread") or \
                        (isinstance(b, ast.Name) and imported.get(b.id) == "Thread"):
                    found[f"{module}:{'.'.join([*scope, node.name])}"] = "Thread subclass"
            for stmt in node.body:
                visit(stmt, [*scope, node.name], node.name)
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            inner = [*scope, node.name] if not isinstance(node, ast.Lambda) else scope
            for child in ast.iter_child_nodes(node):
                visit(child, inner, cls)
            return
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Call):
            kind = _kind(node.value, threading_names, imported)
            if kind is not None:
                targets: list[ast.expr] = list(node.targets) if isinstance(node, ast.Assign) else [node.target]
                found[_key(module, scope, cls, kind, node.value, targets)] = kind
                for arg in ast.iter_child_nodes(node.value):  # what the call's arguments create
                    visit(arg, scope, cls)
                return
        if isinstance(node, ast.Call):
            kind = _kind(node, threading_names, imported)
            if kind is not None:
                found[_key(module, scope, cls, kind, node, [])] = kind
        for sub in ast.iter_child_nodes(node):
            visit(sub, scope, cls)

    visit(tree, [], None)
    return found


def _key(module: str, scope: list[str], cls: str | None, kind: str, call: ast.Call, targets: list[ast.expr]) -> str:
    name = _thread_name(kind, call) if kind in THREADS else None
    if name is not None:
        return f"{module}:{name}"
    attrs = [t for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
             and t.value.id in ("self", "cls")]
    if attrs and cls is not None:
        return f"{module}:{cls}.{attrs[0].attr}"
    names = [t for t in targets if isinstance(t, ast.Name)]
    if names:
        return f"{module}:{'.'.join([*scope, names[0].id])}"
    return f"{module}:{'.'.join([*scope, kind])}()"


@functools.cache
def code_keys() -> dict[str, str]:
    """(Cached: read-only for the callers.)"""
    out: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        out.update(primitives(path.read_text(), path.relative_to(PACKAGE).as_posix()))
    return out


def _concurrency_section(text: str) -> str:
    start = text.index("\n## Concurrency")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def documented(text: str) -> dict[str, str]:
    """key -> the table row, for every row of the Concurrency section's tables keyed by its first cell."""
    out: dict[str, str] = {}
    for line in _concurrency_section(text).splitlines():
        if not line.startswith("|"):
            continue
        cells = line.split("|")
        if len(cells) < 3:
            continue
        for key in KEY.findall(cells[1]):
            out[key] = line
    return out


def _rows_of(text: str) -> Iterator[list[str]]:
    for line in _concurrency_section(text).splitlines():
        if line.startswith("|") and KEY.search(line.split("|")[1]):
            yield [c.strip() for c in line.strip().strip("|").split("|")]


def mismatches(code: dict[str, str], doc: str) -> tuple[list[str], list[str]]:
    """(created in the code but without a row, rows for what the code does not create)."""
    rows = documented(doc)
    return sorted(set(code) - set(rows)), sorted(set(rows) - set(code))


# --- the checks -----------------------------------------------------------------------------------------------
def test_every_thread_and_lock_in_the_code_has_a_row() -> None:
    missing, _ = mismatches(code_keys(), DOC.read_text())
    assert not missing, ("created in peloton/ but not in docs/architecture.md's concurrency tables (add a row "
                         f"keyed `module:name`: what it guards or does, and its rule): {missing}")


def test_every_row_names_something_that_exists() -> None:
    _, stale = mismatches(code_keys(), DOC.read_text())
    assert not stale, f"docs/architecture.md's concurrency tables list what the code no longer creates: {stale}"


def test_every_row_says_what_and_its_rule() -> None:
    for cells in _rows_of(DOC.read_text()):
        assert len(cells) >= 3 and all(cells[1:]), f"a row with an empty cell: {cells}"


def test_a_lock_added_without_a_row_is_found() -> None:
    """The walker finds what a new module would add (each form), so the first check fails for it."""
    source = '''
import threading
from threading import Condition as Cond
from concurrent import futures
from peloton.loop import Loop

_GLOBAL = threading.RLock()


class Cache:
    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._ready = Cond(self._mu)
        self.done: threading.Event = threading.Event()
        self.loops = [Loop(f"cache-{1}", lambda: False, 1.0)]

    def run(self) -> None:
        threading.Thread(target=self.run, daemon=True).start()
        t = threading.Thread(target=self.run, name="cache-refresh")
        pool = futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="cache")


class Worker(threading.Thread):
    pass
'''
    got = primitives(source, "cache.py")
    assert got == {
        "cache.py:_GLOBAL": "RLock",
        "cache.py:Cache._mu": "Lock",
        "cache.py:Cache._ready": "Condition",
        "cache.py:Cache.done": "Event",
        "cache.py:loop-cache-{1}": "Loop",
        "cache.py:Cache.run.Thread()": "Thread",
        "cache.py:cache-refresh": "Thread",
        "cache.py:cache_*": "ThreadPoolExecutor",
        "cache.py:Worker": "Thread subclass",
    }
    doc = DOC.read_text()
    code = {**code_keys(), **got}  # the tree with that module added
    assert mismatches(code, doc) == (sorted(got), [])  # each one is reported missing
    # a row for each makes the check pass (rows go in the Concurrency section's tables)
    rows = "".join(f"| `{k}` | what | rule |\n" for k in got)
    with_rows = doc.replace("\n### Locks\n", "\n| key | does | rule |\n|---|---|---|\n" + rows + "\n### Locks\n")
    assert mismatches(code, with_rows) == ([], [])
    # and the module removed again, its rows are reported stale
    assert mismatches(code_keys(), with_rows) == ([], sorted(got))


def test_the_walker_finds_the_primitives_known_to_exist() -> None:
    """(So that a walker broken by a refactor of this file does not pass by finding nothing.)"""
    keys = code_keys()
    assert keys.get("hostmgr/manager.py:HostManager._lock") == "Lock"
    assert keys.get("jobmgr/writer.py:Writer._cond") == "Condition"
    assert any(k.startswith("server.py:loop-") for k in keys)
    assert len(keys) >= 50
