"""The `peloton` argument parser: the parts every command group shares (errors, connection flags, `-o`), and
`build_parser`, which asks each group's module (peloton/cli/groups/) to add its commands.

Start-up time: building the parser imports nothing heavy. Given the command line, only the group it names is built
in full; the others get a stub (their name and help line), enough for `peloton --help` and "did you mean"."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from peloton import __version__
from peloton.cli.exits import EXIT_USAGE

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any, NoReturn

# The output formats of `-o`. table is the default; wide is the table with more columns where a command has them;
# json and yaml are the same document (docs/cli.md#json-output), yaml only written differently.
OUTPUTS = ("table", "wide", "json", "yaml")
DOCUMENTS = frozenset({"json", "yaml"})

# group -> (module under peloton.cli.groups, its one-line help), in the order `peloton --help` lists them
GROUPS: dict[str, tuple[str, str]] = {
    "server": ("server", "run the daemon"),
    "certs": ("server", "certificates for TLS"),
    "token": ("server", "bearer tokens of principals"),
    "db": ("server", "database maintenance"),
    "job": ("job", "jobs"),
    "task": ("task", "tasks"),
    "pool": ("pool", "resource pools"),
    "model": ("model", "model documents of model-aware plans: stored in the daemon (create, get, list, refit, "
                       "delete), and offline (fit a profile, predict, plan)"),
    "queue": ("pool", "the gangs waiting for admission or placement, in queue order, and why"),
    "cluster": ("cluster", "the daemon itself"),
    "host": ("cluster", "hosts"),
    "audit": ("cluster", "the audit log: changing and refused calls, newest first (admin, operator)"),
    "sim": ("sim", "failure injection into a daemon that runs the sim backend; replay a trace offline"),
    "completion": ("completion", "print a shell completion script: source <(peloton completion bash), or zsh"),
}

# The aliases users expect of a verb, wherever the verb is a command
ALIASES = {"list": ["ls"], "delete": ["rm"], "get": ["describe"]}

CONNECTION_HELP = ("connection flags: --address, --context, --tls-ca, --client-cert, --client-key, --token\n"
                   "  before the group or after the command (given in both places, the one after the command\n"
                   "  wins); `peloton --help` says what each does")


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's errors: one line, `peloton: error: COMMAND: FLAG: why`, and a "did you mean" for a
    mistyped command, choice or flag (Python 3.11's argparse suggests nothing)."""

    def error(self, message: str) -> NoReturn:
        message = message.removeprefix("argument ")  # "argument --limit: ..." -> "--limit: ..."
        if message.startswith("the following arguments are required: "):
            missing = message.removeprefix("the following arguments are required: ")
            message = f"missing {missing}"
            subs = [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]
            if subs and missing.split(",")[0] == subs[0].metavar:
                message += f" (one of {', '.join(_names(subs[0]))})"
        where = self.prog.removeprefix("peloton").strip()
        if "did you mean" not in message and "one of" not in message:  # else the line says what to type already
            message += f" (see `{self.prog} --help`)"
        self.exit(EXIT_USAGE, f"peloton: error: {where + ': ' if where else ''}{message}\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is None or value in action.choices:
            return
        import difflib

        choices = [str(c) for c in action.choices]
        close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
        if isinstance(action, argparse._SubParsersAction):
            names = _names(action)
            hint = f"did you mean {close[0]!r}?" if close else f"one of {', '.join(names)}"
            raise argparse.ArgumentError(None, f"unknown command {value!r} ({hint})")
        hint = f"did you mean {close[0]!r}?" if close else f"one of {', '.join(choices)}"
        name = "/".join(action.option_strings) or str(action.metavar or action.dest)
        raise argparse.ArgumentError(None, f"{name}: invalid choice {value!r} ({hint})")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            leaf = leaf_parser(self, ns)
            flag = extra[0].split("=", 1)[0]
            if flag.startswith("-") and flag != "-":
                import difflib

                options = [o for a in leaf._actions for o in a.option_strings
                           if a.help != argparse.SUPPRESS or a.dest in CONNECTION_DESTS]
                close = difflib.get_close_matches(flag, options, n=1, cutoff=0.6)
                leaf.error(f"unknown flag {flag}" + (f" (did you mean {close[0]}?)" if close else ""))
            leaf.error(f"unexpected argument{'s' if len(extra) > 1 else ''} {' '.join(map(repr, extra))}")
        return ns


def _names(action: argparse._SubParsersAction) -> list[str]:
    """The commands of a subparsers action without their aliases (those are in its choices too)."""
    return [c.dest for c in action._choices_actions] or list(action.choices)


def leaf_parser(p: argparse.ArgumentParser, ns: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command `ns` was parsed for: `peloton job list` -> the parser of `list`."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(ns, action.dest, None)
            if chosen in action.choices:
                return leaf_parser(action.choices[chosen], ns)
    return p


def subparsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    seen: dict[int, argparse.ArgumentParser] = {}  # an alias is the same parser under another name: once
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sp in a.choices.values():
                seen.setdefault(id(sp), sp)
    return list(seen.values())


CONNECTION_DESTS = frozenset({"address", "context", "tls_ca", "client_cert", "client_key", "token"})
# the top-level flags that take a value (to find the group on the command line without parsing it)
_VALUED = frozenset({"--address", "--context", "--tls-ca", "--client-cert", "--client-key", "--token",
                     "--rpc-timeout", "-o", "--output"})


INT32_MAX = 2**31 - 1  # what an int32 field of a request holds (limits.INT32_MAX, not imported: start-up time)


def int32(text: str) -> int:
    """An argparse type for a flag that fills an int32 field of a request: a whole number that protobuf can hold,
    else the flag's usage error (exit 2; protobuf would raise ValueError, a traceback). Its own range (not negative,
    at least 1, ...) is checked where it is used, or by the daemon."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None  # argparse's own words
    if not -INT32_MAX - 1 <= n <= INT32_MAX:
        raise argparse.ArgumentTypeError(f"at most {INT32_MAX}, got {text}" if n > 0 else
                                         f"at least {-INT32_MAX - 1}, got {text}")
    return n


def seconds(text: str) -> float:
    """An argparse type for a flag of seconds (`--timeout`, `--reconnect-grace`): a finite number, not negative
    (`nan`, `inf` and `1e309` once reached the transport's deadline arithmetic: a traceback)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None  # argparse's own words
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, got {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def positive_seconds(text: str) -> float:
    """`seconds`, and more than 0 (`--rpc-timeout`: a call with no time at all can only fail)."""
    value = seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def client_flags(p: argparse.ArgumentParser | argparse._ArgumentGroup, default: object) -> None:
    """Which daemon and how: before the command (`default` None, described in `peloton --help`) and again after it
    on every client command (`default` SUPPRESS: absent unless given, so a value after the command wins over one
    before it; not described there again: the command's help names them in one line, CONNECTION_HELP)."""
    top = default is None

    def h(text: str) -> str:
        return text if top else argparse.SUPPRESS

    p.add_argument("--address", default=default,
                   help=h("daemon HOST:PORT or unix:PATH, or several comma-separated (a leader and its standbys; "
                          "default: $PELOTON_ADDRESS, the config's context, the socket in the data dir ($PELOTON_DATA_DIR, else "
                          "the default) if this user may open it, or 127.0.0.1:5391)"))
    p.add_argument("--context", default=default, metavar="NAME",
                   help=h("context of ~/.config/peloton/config.toml to use (default: $PELOTON_CONTEXT, or its "
                          "current-context)"))
    p.add_argument("--tls-ca", default=default, metavar="FILE",
                   help=h("talk TLS, trusting the CA in FILE for the daemon's certificate ($PELOTON_TLS_CA)"))
    p.add_argument("--client-cert", default=default, metavar="FILE",
                   help=h("client certificate for mutual TLS ($PELOTON_CLIENT_CERT; with --client-key)"))
    p.add_argument("--client-key", default=default, metavar="FILE",
                   help=h("the client certificate's key ($PELOTON_CLIENT_KEY)"))
    p.add_argument("--token", default=default, metavar="TOKEN",
                   help=h("bearer token of a principal (`peloton token create`; $PELOTON_TOKEN; prefer the "
                          "environment or a context: a flag shows in the process list)"))
    p.add_argument("--rpc-timeout", type=positive_seconds, default=30.0 if top else default, help=argparse.SUPPRESS)


def output_flag(sp: argparse.ArgumentParser, what: str = "") -> None:
    """`-o` after the command (SUPPRESS: absent unless given, so that it wins over one before the group)."""
    sp.add_argument("-o", "--output", choices=OUTPUTS, default=argparse.SUPPRESS,
                    help=what or "table (default), wide (more columns), json or yaml: a stable record of every "
                                 "field (docs/cli.md, JSON output)")


def grace(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--reconnect-grace", type=seconds, default=60.0, metavar="SECONDS",
                    help="how long the daemon may stay unreachable (a restart) before giving up with exit code "
                         "69 (default %(default)g)")


def add_command(group: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A command of a group, with the aliases users expect of its verb (`ls`, `rm`, `describe`)."""
    return group.add_parser(name, aliases=ALIASES.get(name, []), **kwargs)


# help and metavar of arguments many commands share, where their definition gives none
COMMON_HELP = {
    "job_id": ("JOB_ID", "the job's id, or a prefix of it that only one job has (`job list` lists them)"),
    "instance": ("INSTANCE", "the task's instance number in the job (0, 1, ...; `task list` lists them)"),
    "path": ("PATH", "the pool's path, e.g. /research/vision"),
    "hostname": ("HOST", "the host's name, as `host list` shows it"),
}


def _finish(p: argparse.ArgumentParser) -> None:
    """Once every command is defined: `-o` and the connection flags after each client command too, the shared
    arguments' help, and `COMMAND` for the subcommand slot (errors then read "missing COMMAND")."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            action.metavar = "GROUP" if p.prog == "peloton" else "COMMAND"
        elif action.help is None and action.dest in COMMON_HELP:
            if not action.option_strings:
                action.metavar = action.metavar or COMMON_HELP[action.dest][0]
            action.help = COMMON_HELP[action.dest][1]
    has_output = any(a.dest == "output" for a in p._actions)
    if "server_fn" in p._defaults and "server_parser" not in p._defaults and not has_output:
        # a local command (certs, token, db, completion) takes -o only to refuse it clearly (main.check_output)
        # rather than as an unknown flag; not `server`, whose every flag is also a setting of its config file
        p.add_argument("-o", "--output", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    if "fn" in p._defaults:
        if not has_output:
            output_flag(p)
        client_flags(p, argparse.SUPPRESS)
        p.epilog = CONNECTION_HELP
        p.formatter_class = argparse.RawDescriptionHelpFormatter  # the epilog as written (flags unbroken)
    for sp in subparsers(p):
        _finish(sp)


def group_of(argv: Sequence[str]) -> str | None:
    """The group the command line names (`job` of `peloton --address X job list`); None when it names none that
    is known (the whole parser is then built, for the help or the error)."""
    skip = False
    for w in argv:
        if skip:
            skip = False
        elif w.startswith("-"):
            skip = w in _VALUED
        else:
            return w if w in GROUPS else None
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; given the command line, the one it names in full and the others as stubs."""
    import importlib

    p = Parser(prog="peloton", description="Gang-scheduling workload manager for GPU clusters",
               allow_abbrev=False)  # `certs init --client` is not a prefix of --client-cert
    p.add_argument("--version", action="version", version=f"peloton {__version__}")
    client_flags(p.add_argument_group("connection (also accepted after the command)"), None)
    # -o before the group too (`peloton -o json job list`); after the command it wins
    p.add_argument("-o", "--output", choices=OUTPUTS, default=None,
                   help="output of every client command: table (default), wide, json or yaml (also after the "
                        "command; docs/cli.md, Output)")
    sub = p.add_subparsers(dest="group", required=True)
    only = group_of(argv) if argv is not None else None
    for name, (module, text) in GROUPS.items():
        g = sub.add_parser(name, help=text)
        if only is None or name == only:
            importlib.import_module(f"peloton.cli.groups.{module}").register(name, g)
    _finish(p)
    return p
