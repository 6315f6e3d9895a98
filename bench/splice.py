#!/usr/bin/env python3
"""Writes stdin into FILE as the section NAME, between the markers
<!-- bench:NAME:start --> and <!-- bench:NAME:end -->: the old section is
replaced, or the new one appended when FILE has none. The section is
stamped with the commit it was measured at by `fanfold bench splice`, the
same code every `fanfold bench` section is written with; NAME must be in
its table of measured paths (crates/fanfold-bench/src/stamp.rs).

    python3 bench/splice.py NAME FILE < section.md

The binary is $FANFOLD_BIN, else $FANFOLD, else target/release/fanfold of
this checkout.
"""
import os
import subprocess
import sys

name, path = sys.argv[1], sys.argv[2]
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
binary = (
    os.environ.get("FANFOLD_BIN")
    or os.environ.get("FANFOLD")
    or os.path.join(root, "target", "release", "fanfold")
)
if not os.access(binary, os.X_OK):
    sys.exit(f"splice.py: no fanfold binary at {binary}: cargo build --release -p fanfold-cli")
done = subprocess.run(
    [binary, "bench", "splice", name, "--report", path], stdin=sys.stdin
)
sys.exit(done.returncode)
