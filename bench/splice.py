#!/usr/bin/env python3
"""Writes stdin into FILE as the section NAME, between the markers
<!-- bench:NAME:start --> and <!-- bench:NAME:end -->: the old section is
replaced, or the new one appended when FILE has none.

    python3 bench/splice.py NAME FILE < section.md
"""
import sys

name, path = sys.argv[1], sys.argv[2]
start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
body = sys.stdin.read().strip("\n")
block = f"{start}\n{body}\n{end}"
with open(path) as f:
    text = f.read()
if start in text and end in text:
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    text = head + block + tail
else:
    text = text.rstrip("\n") + "\n\n" + block + "\n"
with open(path, "w") as f:
    f.write(text)
