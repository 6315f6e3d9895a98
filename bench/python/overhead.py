"""Measures the Python package against the CLI (see run.sh) and prints the
section as Markdown. Every figure is measured here, in one run."""

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

import fanfold

BIN = os.environ["FANFOLD_BIN"]


def args():
    p = argparse.ArgumentParser()
    p.add_argument("--spec", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--repeat", type=int, default=3)
    return p.parse_args()


def fresh(work: Path, name: str) -> Path:
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def cli_run(spec, data_file, folder):
    started = time.perf_counter()
    done = subprocess.run(
        [BIN, "run", spec, "--input", data_file, "--store", folder / "store.sqlite",
         "--out", folder / "out", "--json"],
        capture_output=True, text=True,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"fanfold run failed ({done.returncode}): {done.stderr[-2000:]}")
    answer = json.loads((folder / "out" / "answer.json").read_text())
    return wall, sorted(i["unit_id"] for i in answer["items"])


def py_run(spec, data, folder):
    started = time.perf_counter()
    res = fanfold.run(spec, input=data, store=folder / "store.sqlite", out=folder / "out",
                      progress=False)
    wall = time.perf_counter() - started
    assert res.complete, res
    return wall, sorted(res.answer["id"])


def crossing(frame, folder, arrow: bool):
    """Seconds to write the table as the engine's input, one way or the other."""
    original = fanfold._arrow_source
    if not arrow:
        fanfold._arrow_source = lambda data: None
    try:
        started = time.perf_counter()
        fanfold._input_path(frame, folder)
        return time.perf_counter() - started
    finally:
        fanfold._arrow_source = original


PEAK = """
import json, os, sys, threading, time
import pandas as pd, fanfold

def status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0

frame = pd.read_json(sys.argv[2], lines=True, dtype=False)
before = status("self", "VmRSS")
# The high-water mark from here on: the call's own peak, not the read's.
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
engine = {"kib": 0}
done = threading.Event()

def watch():
    me = os.getpid()
    while not done.is_set():
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                if status(pid, "PPid") == me:
                    engine["kib"] = max(engine["kib"], status(pid, "VmHWM"))
            except (OSError, ValueError):
                pass
        time.sleep(0.02)

watcher = threading.Thread(target=watch)
watcher.start()
res = fanfold.run(sys.argv[1], input=frame, store=sys.argv[3], out=sys.argv[4], progress=False)
done.set()
watcher.join()
assert res.complete
print(json.dumps({"before_kib": before, "during_kib": status("self", "VmHWM"),
                  "engine_kib": engine["kib"]}))
"""


def peak_memory(spec, data_file, work):
    cli = fresh(work, "peak-cli")
    timed = subprocess.run(
        ["/usr/bin/time", "-f", "%M", BIN, "run", spec, "--input", data_file,
         "--store", cli / "store.sqlite", "--out", cli / "out", "--json"],
        capture_output=True, text=True,
    )
    if timed.returncode != 0:
        sys.exit(f"fanfold run failed: {timed.stderr[-2000:]}")
    cli_kib = int(timed.stderr.strip().splitlines()[-1])
    py = fresh(work, "peak-py")
    done = subprocess.run(
        [sys.executable, "-c", PEAK, spec, data_file, py / "store.sqlite", py / "out"],
        capture_output=True, text=True,
    )
    if done.returncode != 0:
        sys.exit(f"the Python run failed: {done.stderr[-2000:]}")
    py_mem = json.loads(done.stdout.strip().splitlines()[-1])
    return cli_kib, py_mem


def main():
    a = args()
    work = Path(a.work)
    spec = a.spec
    load = os.getloadavg()
    rows = {}
    for n in (10000, 100000):
        data_file = work / f"{n}.jsonl"
        frame = pd.read_json(data_file, lines=True, dtype=False)
        walls = {"cli": [], "py_frame": [], "py_path": []}
        answers = {}
        for r in range(a.repeat):
            for side in walls:
                folder = fresh(work, f"{side}-{n}-{r}")
                if side == "cli":
                    wall, ids = cli_run(spec, data_file, folder)
                elif side == "py_frame":
                    wall, ids = py_run(spec, frame, folder)
                else:
                    wall, ids = py_run(spec, str(data_file), folder)
                walls[side].append(wall)
                answers.setdefault(side, ids)
        same = answers["cli"] == answers["py_frame"] == answers["py_path"]
        arrow = statistics.median(
            crossing(frame, fresh(work, f"cross-a-{n}-{r}"), True) for r in range(a.repeat)
        )
        plain = statistics.median(
            crossing(frame, fresh(work, f"cross-j-{n}-{r}"), False) for r in range(a.repeat)
        )
        rows[n] = {
            "walls": {k: statistics.median(v) for k, v in walls.items()},
            "kept": len(answers["cli"]),
            "same": same,
            "arrow": arrow,
            "plain": plain,
        }
    cli_kib, py_mem = peak_memory(spec, work / "100000.jsonl", work)

    out = []
    w = out.append
    w("## Python: the package against the CLI (`bench/python/run.sh`) [SIMULATED]\n")
    w("Every figure below comes from one run.\n")
    w(f"- Machine: {os.cpu_count()} logical CPUs, {platform.processor() or platform.machine()}, "
      f"Linux {platform.release()}; 1-minute load average {load[0]:.2f} / {load[1]:.2f} / "
      f"{load[2]:.2f} when the run started. Python {platform.python_version()}, "
      f"pandas {pd.__version__}.")
    w("- Spec: `bench/scale/spec.toml` (a prefilter keeping about 1 %, one map stage on the "
      "scripted backend **[SIMULATED]**, a jq judge: the figures measure fanfold, not a model); "
      "records from `fanfold fixture jsonl --seed 7`. Every run starts from an empty store.")
    w("- **CLI**: `fanfold run SPEC --input FILE`, spawn to exit. **Python, DataFrame**: "
      "`fanfold.run(SPEC, input=df)` on a DataFrame already in memory (read beforehand with "
      "`pd.read_json(..., lines=True)`), the call's wall time: the table written through Arrow's "
      "C stream interface, the engine's own process started and waited for, the outputs read back "
      "into DataFrames. **Python, path**: the same call given the file's path.")
    w(f"- Wall times are medians of {a.repeat} interleaved runs.\n")
    w("| rows | CLI s | Python, DataFrame s | Python, path s | DataFrame / CLI | path / CLI | "
      "units kept | same answer |")
    w("|---:|---:|---:|---:|---:|---:|---:|---|")
    for n, r in rows.items():
        c, f, p = r["walls"]["cli"], r["walls"]["py_frame"], r["walls"]["py_path"]
        w(f"| {n} | {c:.2f} | {f:.2f} | {p:.2f} | **{f / c:.2f}x** | {p / c:.2f}x | {r['kept']} | "
          f"{'yes' if r['same'] else 'NO'} |")
    w("")
    w("The table's crossing alone (writing the DataFrame as the engine's JSON Lines input, median "
      f"of {a.repeat}): ")
    w("")
    w("| rows | Arrow C stream, written by the native half s | pandas `to_json` s |")
    w("|---:|---:|---:|")
    for n, r in rows.items():
        w(f"| {n} | {r['arrow']:.3f} | {r['plain']:.3f} |")
    w("")
    w("Peak memory at 100,000 rows (peak RSS, MiB): the CLI "
      f"**{cli_kib / 1024:.1f}** (GNU time `%M`). From Python, the engine's own process "
      f"**{py_mem['engine_kib'] / 1024:.1f}** (its `VmHWM`, read while it runs); the interpreter "
      f"held {py_mem['before_kib'] / 1024:.1f} with pandas and the DataFrame loaded, and peaked at "
      f"**{py_mem['during_kib'] / 1024:.1f}** during the call (its `VmHWM`, reset just before "
      "the call): the table's Arrow copy and the results read back.")
    fixed = [
        (r["walls"]["py_frame"] - r["walls"]["cli"]) * 1000 for r in rows.values()
    ]
    w("")
    w("The Python path's wall minus the CLI's, a DataFrame given: "
      + ", ".join(f"{f:.0f} ms at {n} rows" for f, n in zip(fixed, rows))
      + ". It holds the table's crossing (above), a Python interpreter started for the engine "
      "(its own process, so a runaway jq program or a second Ctrl-C ends that process, never "
      "the caller's) and the outputs read back; those last two are not timed apart.")
    print("\n".join(out))


if __name__ == "__main__":
    main()
