"""Facts the docs state about the repository, checked against it: the migration head they name, how many
benchmarks there are and which `make bench` runs (they once disagreed: 0007 against 0011; four, five and seven), and
that every relative link between them (and deploy's and examples' READMEs) reaches a file and heading that exist
(four anchors had gone stale when their headings grew `[-o FORMAT]`); and what they say of the code: every flag
they name is peloton's and every command they show takes the flags shown with it, cli.md's table of the server's
flags is every flag with its default, its exit codes are the CLI's, every metric named exists with the labels
given, job-spec.md's table of the members' environment is what they get, every `PELOTON_*` variable named is one
the code reads or sets, cli.md's time fields are those the CLI writes as times, and every test they cite exists."""

from __future__ import annotations

import argparse
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


# --- what the docs say of the code: flags, their defaults, metrics, exit codes, the members' environment ----------

FLAG_DOCS = [ROOT / "docs" / f"{name}.md" for name in ("running", "cli", "job-spec", "pools", "security")]
# flags those docs name that are other programs': nvidia-smi's, a Mesos agent's, a training script's; Mesos' own
# (`--container_logger`, `--switch_user`) are told apart by their underscores
FOREIGN_FLAGS = {"--query-gpu", "--attributes", "--hostfile", "--master", "--rank", "--world-size"}


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by its words ("" for `peloton` itself, "job list"), aliases left out."""
    from peloton.cli.parser import build_parser

    out: dict[str, argparse.ArgumentParser] = {}

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        out[path] = p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    if sp not in out.values():
                        walk(sp, f"{path} {name}".strip())

    walk(build_parser(), "")
    return out


def _flags(p: argparse.ArgumentParser) -> set[str]:
    return {o for a in p._actions for o in a.option_strings}


def test_every_flag_the_docs_name_is_a_flag_of_peloton() -> None:
    known = set().union(*map(_flags, _parsers().values()))
    unknown = set()
    for doc in FLAG_DOCS:
        text = doc.read_text()
        unknown |= {(doc.name, f) for f in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)(?![\w*-])", text)
                    if f not in known and f not in FOREIGN_FLAGS and f"unknown flag {f}" not in text}  # (a typo shown)
    assert not unknown, sorted(unknown)


def test_a_command_the_docs_show_takes_the_flags_shown_with_it() -> None:
    """`peloton host list --label gpu_error`: --label is a flag of `host list` (or of `peloton` itself), wherever a
    doc shows the command, in a code span or a code block."""
    parsers = _parsers()
    top = _flags(parsers[""])
    wrong = []
    for doc in DOCS:
        text = doc.read_text()
        spans = [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", _outside_code(doc))]  # (may wrap)
        lines = spans + re.findall(r"^\s*(?:\$ )?(?:\S*/)?peloton .*$", text, re.M)
        for line in lines:
            for part in re.split(r"\$\(|\||;|&&", line):  # `job stop $(peloton job list -q)`: two commands
                m = re.match(r"\s*(?:\$ )?(?:\S*/)?peloton ((?:[a-z][a-z-]* ?)+)(.*)", part)
                if not m:
                    continue
                words, path = m.group(1).split(), ""
                while words and f"{path} {words[0]}".strip() in parsers:
                    path = f"{path} {words.pop(0)}".strip()
                if not path:
                    continue
                for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", " ".join(words) + m.group(2)):
                    if flag not in _flags(parsers[path]) | top and f"unknown flag {flag}" not in text:
                        wrong.append(f"{doc.name}: `peloton {path}` has no {flag} ({line.strip()[:80]})")
    assert not wrong, wrong


def _server_rows() -> list[tuple[list[str], list[str]]]:
    """cli.md's table of `peloton server`'s flags: (the flags of a row, their defaults as written)."""
    text = (ROOT / "docs" / "cli.md").read_text()
    section = text[text.index("### `peloton server [flags]`"):text.index("\n## ", text.index("### `peloton server"))]
    return [(re.findall(r"`(--[a-z-]+)", flags), [d.strip() for d in default.split(" / ")])
            for flags, default in re.findall(r"^\| (`--.*?[^\\]) \| (.*?) \|", section, re.M)]


def test_cli_md_lists_every_server_flag_with_its_default() -> None:
    flags = {a.option_strings[-1]: a for a in _parsers()["server"]._actions if a.help != argparse.SUPPRESS}
    rows = _server_rows()
    listed = {f for fs, _ in rows for f in fs}
    assert listed == set(flags) - {"--help"}, (sorted(listed - set(flags)), sorted(set(flags) - listed - {"--help"}))
    wrong = []
    for fs, defaults in rows:
        for flag, said in zip(fs, defaults if len(defaults) == len(fs) else defaults * len(fs), strict=True):
            actual = flags[flag].default
            if actual in (None, "") or isinstance(actual, str) and "," in actual:
                continue  # worked out at start (the data dir, the backend's sizes, every role): said in words
            literal = re.fullmatch(r"`([^`]*)`(?: \(.*\))?|(off)", said)
            shown = "off" if actual is False else f"{actual:g}" if isinstance(actual, float) else str(actual)
            if literal is None or (literal.group(1) or literal.group(2)) != shown:
                wrong.append(f"{flag}: cli.md says {said}, the default is {shown}")
    assert not wrong, wrong


def test_the_exit_codes_cli_md_lists_are_the_clis() -> None:
    from peloton.cli import exits

    text = (ROOT / "docs" / "cli.md").read_text()
    table = text[text.index("## Exit codes"):text.index("\n## ", text.index("## Exit codes"))]
    listed = {int(c) for c in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert listed == {v for k, v in vars(exits).items() if k.startswith("EXIT_")}


def _metrics() -> dict[str, tuple[str, ...]]:
    """Every metric the daemon can export, with its label names: those of the modules that define them (all of
    peloton imported) and the census' families, which are made when scraped."""
    import importlib
    import pkgutil

    from prometheus_client import REGISTRY

    import peloton
    from peloton.observability import census

    for m in pkgutil.walk_packages(peloton.__path__, "peloton."):
        importlib.import_module(m.name)
    out = {name: tuple(getattr(c, "_labelnames", ())) for name, c in REGISTRY._names_to_collectors.items()
           if name.startswith("peloton_")}
    for collector in (census.StoreCensus(), census.ClusterCensus()):
        out.update({f.name: tuple(f._labelnames) for f in collector.collect()})
    return out


def test_every_metric_the_docs_name_is_exported_with_the_labels_they_give() -> None:
    metrics = _metrics()
    wrong = []
    for doc in DOCS:
        for m in re.finditer(r"(?<![#\w])(peloton_[a-z0-9_]*[a-z0-9])(?![\w*<])(\{[^}]*\})?", doc.read_text()):
            name, labels = m.group(1), m.group(2)
            if name not in metrics:
                wrong.append(f"{doc.name}: {name} is no metric")
            elif labels and not set(re.findall(r"(\w+)\s*(?:[,}]|=)", labels)) <= set(metrics[name]):
                wrong.append(f"{doc.name}: {name}{labels}, its labels are {metrics[name]}")
    assert not wrong, wrong


def test_the_environment_job_spec_md_lists_is_what_members_get() -> None:
    """Both ways: each variable the tables list is set somewhere in peloton, and each that training_env sets (a
    gang with roles, so every variable) is listed."""
    from peloton.domain.placement import MemberAssignment
    from peloton.domain.resources import Resources
    from peloton.domain.spec import Role
    from peloton.jobmgr.training_env import training_env

    text = (ROOT / "docs" / "job-spec.md").read_text()
    tables = text[text.index("## The environment of a member"):text.index("## Full example")]
    listed = set(re.findall(r"^\| `([A-Z_<>]+)`(?:, `([A-Z_]+)`)? \|", tables, re.M))
    names = {n for row in listed for n in row if n}
    source = "\n".join(p.read_text() for p in (ROOT / "peloton").rglob("*.py"))
    unset = {n for n in names if not re.search(r"[\"']" + re.escape(n.split("<")[0]) + (r"\{" if "<" in n else r"[\"']"),
                                               source)}
    assert not unset, unset
    r = Resources(cpu=1, mem=0, gpu=0)
    members = [MemberAssignment(i, f"j-{i}-1", "h", "10.0.0.1", r, ports=(31000 + i,)) for i in range(2)]
    roles = [Role("ps", 1, "c", r), Role("param-server", 1, "c", r)]
    set_by_gang = {re.sub(r"PELOTON_ROLE_HOSTS_\w+", "PELOTON_ROLE_HOSTS_<NAME>", k)
                   for env in training_env("j", 1, members, roles).values() for k in env}
    assert set_by_gang <= names, set_by_gang - names


def test_every_test_the_docs_cite_exists() -> None:
    """security.md's threats name the tests that try them (`e2e/test_x.py::test_y`, then `::test_z` of the same
    file): each file and function must exist, or a threat is said to be tried by nothing."""
    tests = ROOT / "tests"
    missing = []
    for doc in DOCS:
        for line in doc.read_text().splitlines():
            current: Path | None = None
            for m in re.finditer(r"`(?:tests/)?((?:\w+/)*test_\w+\.py)?((?:::test_\w+)*)`", line):
                name, functions = m.group(1), m.group(2)
                if name:
                    found = [tests / name] if "/" in name else sorted(tests.rglob(name))
                    current = found[0] if found and found[0].exists() else None
                    if current is None:
                        missing.append(f"{doc.name}: {name}")
                        continue
                if functions:
                    if current is None:
                        missing.append(f"{doc.name}: {functions} of no file named before it on its line")
                        continue
                    missing += [f"{doc.name}: {current.relative_to(ROOT)}::{f}"
                                for f in functions.strip(":").split("::")
                                if not re.search(rf"^\s*(?:async )?def {f}\(", current.read_text(), re.M)]
    assert not missing, missing


def test_every_environment_variable_the_docs_name_is_read_or_set() -> None:
    """A `PELOTON_*` variable a doc names is one the code reads or sets (a string of peloton's or deploy's), or a
    server flag's (`PELOTON_METRICS_LISTEN`); `PELOTON_ROLE_HOSTS_PS` is one of a family (`f"PELOTON_ROLE_HOSTS_{`)."""
    from peloton.cli.server_config import env_name

    source = "\n".join(p.read_text() for d in ("peloton", "deploy") for p in (ROOT / d).rglob("*")
                       if p.is_file() and p.suffix in (".py", ".env", ".service", ""))
    named = set(re.findall(r"\bPELOTON_[A-Z0-9_]*[A-Z0-9]\b", source))
    families = set(re.findall(r"\b(PELOTON_[A-Z0-9_]*_)\{", source))
    named |= {env_name(flag[2:]) for flag in _flags(_parsers()["server"]) if flag.startswith("--")}
    unknown = {(doc.name, v) for doc in FLAG_DOCS
               for v in re.findall(r"\b(PELOTON_[A-Z0-9_]*[A-Z0-9])\b(?!\.\.\.)", doc.read_text())
               if v not in named and not any(v.startswith(f) for f in families)}
    assert not unknown, sorted(unknown)


def test_the_time_fields_cli_md_lists_are_those_the_cli_writes_as_times() -> None:
    """cli.md's JSON output names the fields written as RFC 3339 times: a program parses those and no others."""
    from peloton.cli.render import TIMESTAMPS

    text = (ROOT / "docs" / "cli.md").read_text()
    said = re.search(r"They are (`created_at`.*?)\n- \*\*Durations", text, re.S)
    assert said is not None
    assert set(re.findall(r"`(\w+)`", said.group(1))) == set().union(*TIMESTAMPS.values())
