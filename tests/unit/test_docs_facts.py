"""Facts the docs state about the repository, checked against it: the migration head they name, how many
benchmarks there are and which `make bench` runs (they once disagreed: 0007 against 0011; four, five and seven), and
that every relative link between them (and deploy's and examples' READMEs) reaches a file and heading that exist
(four anchors had gone stale when their headings grew `[-o FORMAT]`)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
WORDS = {"four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
         "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17}


def _head() -> str:
    revisions = {m.group(1): m.group(2) for f in (ROOT / "migrations" / "versions").glob("*.py")
                 if (m := re.search(r'^revision: str = "(\w+)".*?^down_revision: str \| None = "?(\w+)"?',
                                    f.read_text(), re.M | re.S))}
    heads = set(revisions) - set(revisions.values())
    assert len(heads) == 1, heads
    return heads.pop()


def test_the_migration_head_the_docs_name_is_the_chains() -> None:
    head = _head()
    said = {(d.name, m.group(1)) for d in DOCS for m in re.finditer(
        r"(?:database at revision|the head is) `?(\d{4})`?", d.read_text())}
    assert said and all(rev == head for _, rev in said), (head, said)


def test_the_benchmark_counts_the_docs_give_are_the_repositorys() -> None:
    scripts = sorted(p.name for p in (ROOT / "benchmarks").glob("*_bench.py"))
    make = re.search(r"^bench:.*?\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert make is not None
    in_make = re.findall(r"benchmarks/(\w+_bench\.py)", make.group(1))
    sections = re.findall(r"^## \d+\. `(\w+_bench\.py)`", (ROOT / "benchmarks" / "README.md").read_text(), re.M)
    assert sorted(sections) == scripts and set(in_make) <= set(scripts)
    counts = {(d.name, WORDS[m.group(1).lower()], m.group(2)) for d in DOCS for m in re.finditer(
        r"\b(four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|seventeen) (?:of the (?:\w+ )?)?(benchmarks)\b", d.read_text(), re.I)}
    for name, n, _ in counts:
        assert n in (len(scripts), len(in_make)), (name, n, len(scripts), len(in_make))


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, each space a `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    """The anchors of a document's headings; a repeated heading's second is `slug-1`, as on GitHub."""
    anchors: set[str] = set()
    counts: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = _slug(heading)
        anchors.add(f"{slug}-{counts[slug]}" if slug in counts else slug)
        counts[slug] = counts.get(slug, 0) + 1
    return anchors


def _outside_code(path: Path) -> str:
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)


def test_every_relative_link_and_anchor_between_the_docs_resolves() -> None:
    broken = []
    for doc in [*DOCS, *(ROOT / d / "README.md" for d in ("deploy", "deploy/container", "examples/ddp"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", _outside_code(doc)):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            linked = (doc.parent / path).resolve() if path else doc
            if not linked.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(_outside_code(linked)):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken
