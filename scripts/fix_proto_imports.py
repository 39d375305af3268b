"""Rewrite `from peloton.v1 import x_pb2` in generated code to the package path `peloton.api.v1`."""

import pathlib
import re
import sys

for path in pathlib.Path(sys.argv[1]).glob("*_pb2*.py*"):
    text = path.read_text()
    new = re.sub(r"^from peloton\.v1 import", "from peloton.api.v1 import", text, flags=re.M)
    if new != text:
        path.write_text(new)
