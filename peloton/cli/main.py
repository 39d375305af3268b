"""The `peloton` command line. Client commands talk only gRPC to the daemon (--address / PELOTON_ADDRESS).

The parser is built per command group (peloton/cli/parser.py, peloton/cli/groups/); this module runs what it
parsed. Start-up time: parsing the arguments imports nothing heavy; a command imports what it uses when it runs (the
generated code of its service, yaml for `job create`; `-o json` is render.to_dict's, not json_format; never grpc, see
transport.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from peloton.cli.exits import (
    EXIT_BROKEN_PIPE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_TIMEOUT,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)
from peloton.cli.parser import ALIASES, DOCUMENTS, build_parser
from peloton.errors import InvalidArgument, PelotonError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from collections.abc import Callable

    from peloton.cli.client import Client

CANONICAL = {alias: verb for verb, aliases in ALIASES.items() for alias in aliases}

__all__ = ["EXIT_ERROR", "EXIT_TIMEOUT", "EXIT_UNAVAILABLE", "EXIT_USAGE", "build_parser", "main"]


def check_output(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The rule of `-o` (docs/cli.md, Output): every client command takes it; a local command (server, certs,
    token, db, completion) has no output to choose; a command that prints bytes rather than records (the logs) or
    only ids (`-q`) refuses the formats that contradict that, instead of quietly printing something else."""
    command = " ".join(str(w) for w in (args.group, getattr(args, "cmd", None)) if w)
    given = args.output
    if given is None:
        args.output = "table"
        return
    if hasattr(args, "server_fn") and not getattr(args, "prints_records", False):
        parser.exit(EXIT_USAGE, f"peloton: error: -o/--output: `peloton {command}` has no output format to "
                                "choose\n")
    if getattr(args, "quiet", False):
        parser.exit(EXIT_USAGE, f"peloton: error: {command}: -q/--quiet prints only ids, one a line: not with "
                                f"-o {given} (drop -q for the {given} records, or -o for the ids)\n")
    if given in DOCUMENTS and getattr(args, "fn", "") in ("tasks:cmd_job_logs", "tasks:cmd_task_logs"):
        parser.exit(EXIT_USAGE, f"peloton: error: {command}: -o {given}: a log is printed as written, not as a "
                                "record (`task get -o json` has the task's)\n")
    if given == "yaml":
        from peloton.cli import render

        render.FORMAT = "yaml"


def main(argv: Sequence[str] | None = None) -> int:
    """The `peloton` command: its exit code. Run as the program (`argv` None), a client command ends the process
    itself once its output is flushed (os._exit): tearing down the interpreter takes milliseconds that a
    command has no use for. Given `argv`, it returns."""
    import os

    args: argparse.Namespace | None = None
    try:
        raw = list(sys.argv[1:] if argv is None else argv)
        parser = build_parser(raw)
        args = parser.parse_args(raw)
        if getattr(args, "cmd", None) in CANONICAL:  # `job ls` is `job list` in what is said of it
            args.cmd = CANONICAL[args.cmd]
        check_output(parser, args)
        if args.group == "server":
            args = _with_config(parser, raw, args)
        code = _run(args)
        sys.stdout.flush()  # here, where a closed pipe can still be handled
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader went away (`peloton job list | head -3`): stop quietly; stdout to /dev/null so that the
        # interpreter's last flush does not complain either
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = EXIT_BROKEN_PIPE
    if argv is None and args is not None and not hasattr(args, "server_fn"):
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:  # a closed pipe: nothing more can be said
            pass
        os._exit(code)
    return code


def _with_config(parser: argparse.ArgumentParser, raw: list[str], args: argparse.Namespace) -> argparse.Namespace:
    """`peloton server`'s arguments again, with the config file's and the environment's settings under the flags."""
    from peloton.cli import server_config

    at = raw.index("server")
    try:
        layered = server_config.layered(args.server_parser, raw[at + 1:])
    except InvalidArgument as e:
        parser.exit(2, f"peloton: error: {e.message}\n")
    return parser.parse_args([*raw[:at + 1], *layered])


def _run(args: argparse.Namespace) -> int:
    try:
        if hasattr(args, "server_fn"):
            return int(args.server_fn(args))
        from peloton.cli.client import Client
        from peloton.cli.connection import resolve

        client = Client(resolve(args), timeout=args.rpc_timeout)
        client.command = " ".join(str(w) for w in (args.group, getattr(args, "cmd", None)) if w)
        from peloton.cli.ids import resolve_args

        resolve_args(client, args)
        return int(_command(args.fn)(client, args))
    except InvalidArgument as e:
        print(f"peloton: error: {e.message}", file=sys.stderr)
        return EXIT_USAGE
    except PelotonError as e:
        from peloton.cli.reconnect import DaemonUnreachable

        print(f"peloton: error: {e.message}", file=sys.stderr)
        return EXIT_UNAVAILABLE if isinstance(e, DaemonUnreachable) else EXIT_ERROR


def _command(fn: Callable[[Client, argparse.Namespace], int] | str) -> Callable[[Client, argparse.Namespace], int]:
    """A command given as "module:function" (of peloton.cli) is imported only when it runs."""
    if not isinstance(fn, str):
        return fn
    import importlib

    module, _, name = fn.partition(":")
    return getattr(importlib.import_module(f"peloton.cli.{module}"), name)


if __name__ == "__main__":
    sys.exit(main())
