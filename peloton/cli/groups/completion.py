"""`peloton completion bash|zsh`."""

from __future__ import annotations

import argparse
import sys


def register(name: str, x: argparse.ArgumentParser) -> None:
    x.add_argument("shell", choices=["bash", "zsh"], help="the shell the script is for")
    x.set_defaults(server_fn=cmd_completion)


def cmd_completion(a: argparse.Namespace) -> int:
    from peloton.cli.completion import script
    from peloton.cli.parser import build_parser

    sys.stdout.write(script(build_parser(), a.shell))
    return 0
