#!/usr/bin/env python3
"""Writes labels.jsonl: loghub's own human label of every line of the
sample, as the decisions `failure_judge` allows (a label of `-` is not an
alert). A cascade in `target.toml` reads it as its oracle, standing in for
a person labelling the lines it asks about.

    python3 examples/bgl-alerts/labels.py
"""
import csv
import json
import pathlib

here = pathlib.Path(__file__).parent
with open(here / "data" / "BGL_2k.log_structured.csv", newline="") as f, open(
    here / "labels.jsonl", "w"
) as out:
    for row in csv.DictReader(f):
        decision = "not_failure" if row["Label"] == "-" else "failure"
        out.write(json.dumps({"id": row["LineId"], "decision": decision}) + "\n")
