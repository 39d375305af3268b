"""`peloton model ...`: the stored models' commands (peloton/cli/model.py) beside the offline ones
(peloton/cli/model_offline.py), each module adding its own."""

from __future__ import annotations

import argparse

from peloton.cli.parser import output_flag


def register(name: str, g: argparse.ArgumentParser) -> None:
    from peloton.cli import model, model_offline

    models = g.add_subparsers(dest="cmd", required=True)
    model.register_stored(models, output_flag)
    model_offline.register(models)  # no daemon: model_offline.py
