"""The shape of the code, measured from the code: the package import graph, import circles, `type: ignore`s and the
places that touch protobuf or grpc outside the edge modules. docs/architecture.md quotes its output.

    python scripts/arch_report.py [--root DIR] [--json]           # prints markdown (a mermaid graph) or JSON

Only the standard library: it runs on any checkout, also an old one (`--root` a worktree of an earlier commit), so
the same figures can be taken before and after a change. Every import is counted, also those under
`if TYPE_CHECKING:` and inside functions: a circle of type-only imports still ties two modules together for a reader.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

# Modules that should take and return domain types and never touch protobuf or grpc: the components (but their
# servicers, `*.service`), the pure cores, the store and the loop. The rest is the edge: the API layer, the
# servicers, the wiring, the CLI's transport, the gRPC sides of leadership (standby, failover) and security
# (interceptors).
INSIDE = re.compile(r"^peloton\.(jobmgr|resmgr|placement|hostmgr|domain|modelaware|store|loop)(\..*)?$")
SERVICER = re.compile(r"\.service$")
PROTO_TOUCH = re.compile(r"\b(\w+_pb2(_grpc)?|grpc)\.")


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for p in sorted((root / "peloton").rglob("*.py")):
        rel = p.relative_to(root).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            while t and t not in known:  # `from pkg import name` names a module or a value in one
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith("peloton"):
                found.add(t)
    return found


def package(mod: str) -> str:
    """The floor a module lives on: peloton.X (a package) or peloton.<loose module>."""
    parts = mod.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else mod


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
                continue
            if nxt not in graph:
                continue
            if nxt not in index:
                index[nxt] = low[nxt] = counter
                counter += 1
                stack.append(nxt)
                on.add(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt in on:
                low[node] = min(low[node], index[nxt])
    return sorted(out)


def report(root: Path) -> dict[str, object]:
    mods = modules(root)
    hand = {m: p for m, p in mods.items() if not m.endswith(("_pb2", "_pb2_grpc"))}
    known = set(mods)
    graph = {m: imports(m, p, known) for m, p in hand.items()}
    pkg_edges: dict[str, set[str]] = defaultdict(set)
    for m, deps in graph.items():
        for d in deps:
            a, b = package(m), package(d)
            if a != b and not d.startswith("peloton.api.v1"):
                pkg_edges[a].add(b)
    ignores = 0
    touches: dict[str, int] = {}
    lines = 0
    for m, p in hand.items():
        text = p.read_text()
        lines += text.count("\n")
        ignores += text.count("type: ignore")
        if INSIDE.match(m) and not SERVICER.search(m):
            n = sum(1 for line in text.splitlines()
                    if PROTO_TOUCH.search(line) and not line.lstrip().startswith("#"))
            if n:
                touches[m] = n
    loose = sorted(m for m in hand if m.count(".") == 1 and not (root / m.replace(".", "/")).is_dir())
    return {
        "modules": len(hand),
        "lines": lines,
        "loose_top_level_modules": loose,
        "module_cycles": cycles(graph),
        "package_cycles": cycles({k: set(v) for k, v in pkg_edges.items()}),
        "type_ignores": ignores,
        "proto_touches_outside_edge": sum(touches.values()),
        "proto_touches_by_module": dict(sorted(touches.items())),
        "package_edges": {k: sorted(v) for k, v in sorted(pkg_edges.items())},
    }


def markdown(r: dict[str, object]) -> str:
    edges = r["package_edges"]
    assert isinstance(edges, dict)
    out = ["```mermaid", "graph TD"]
    for a, bs in edges.items():
        for b in bs:
            out.append(f"  {a.replace('peloton.', '')} --> {b.replace('peloton.', '')}")
    out.append("```")
    out.append("")
    for key in ("modules", "lines", "type_ignores", "proto_touches_outside_edge"):
        out.append(f"- {key}: {r[key]}")
    out.append(f"- loose top-level modules: {', '.join(r['loose_top_level_modules'])}")  # type: ignore[arg-type]
    out.append(f"- module import circles: {r['module_cycles']}")
    out.append(f"- package import circles: {r['package_cycles']}")
    out.append(f"- protobuf/grpc inside the components and cores, by module: {r['proto_touches_by_module']}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = report(Path(a.root))
    sys.stdout.write(json.dumps(r, indent=2) + "\n" if a.json else markdown(r) + "\n")


if __name__ == "__main__":
    main()
