# Shared by run.sh and fanfold.sh: the model server and the usage proxy.
# Expects SERVER_PORT, PROXY_PORT, LCP_PYTHON, MODEL, N_CTX, N_THREADS and
# HERE; processes it starts are stopped when the calling script exits.

STARTED=()
cleanup() {
  for pid in "${STARTED[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${STARTED[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

up() { curl -sf -o /dev/null "http://127.0.0.1:$1/v1/models"; }

# start_server LOG: reuse a server answering on SERVER_PORT, else start
# llama_cpp.server there, writing its output to LOG.
start_server() {
  if up "$SERVER_PORT"; then
    echo "reusing the server on :$SERVER_PORT"
    return
  fi
  echo "starting llama_cpp.server on :$SERVER_PORT"
  "$LCP_PYTHON" -m llama_cpp.server --model "$MODEL" --host 127.0.0.1 --port "$SERVER_PORT" \
    --model_alias local --n_ctx "$N_CTX" --n_threads "$N_THREADS" --n_threads_batch "$N_THREADS" \
    --interrupt_requests False >"$1" 2>&1 &
  STARTED+=($!)
  for _ in $(seq 120); do up "$SERVER_PORT" && break; sleep 1; done
  up "$SERVER_PORT" || { echo "server did not come up; see $1" >&2; exit 1; }
}

# start_proxy USAGE_LOG PROXY_LOG TAG [--log-bodies]: usage_proxy.py on
# PROXY_PORT in front of the server, with an empty usage log.
start_proxy() {
  local usage="$1" log="$2" tag="$3"
  shift 3
  if up "$PROXY_PORT"; then
    echo "port $PROXY_PORT is taken: stop what listens there or set PROXY_PORT" >&2; exit 1
  fi
  python3 "$HERE/usage_proxy.py" --listen "127.0.0.1:$PROXY_PORT" --upstream "127.0.0.1:$SERVER_PORT" \
    --log "$usage" --tag "$tag" "$@" 2>"$log" &
  STARTED+=($!)
  for _ in $(seq 30); do up "$PROXY_PORT" && break; sleep 0.2; done
  up "$PROXY_PORT" || { echo "proxy did not come up; see $log" >&2; exit 1; }
  : >"$usage"  # drop the readiness probes (not logged anyway)
}
