"""The daemon's log: one line per event, as text (the default) or as JSON (`--log-format json`), on stderr.

A JSON line has `time` (RFC 3339, UTC, milliseconds), `level`, `logger`, `message`, and `exception` when there is
one; ids a log call passes with `extra={"job_id": ..., "gang_id": ..., "task_id": ...}` become fields of their own.
"""

from __future__ import annotations

import json
import logging
import time

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ID_FIELDS = ("job_id", "gang_id", "task_id", "pool", "host")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        t = time.gmtime(record.created)
        out: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ID_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


HANDLER_NAME = "peloton"  # the root handler `configure` installs (the tests remove it after one that ran it)


def configure(level: str, fmt: str) -> None:
    """The root logger at `level` (debug, info, warning, error), writing `fmt` (text or json) lines to stderr."""
    handler = logging.StreamHandler()
    handler.set_name(HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
