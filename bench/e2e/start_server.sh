# Sourced by the bench/e2e run scripts: start_server BIN_DIR OUT_DIR [FLAGS...] starts
# BIN_DIR/attnserve on a free loopback port (no metrics listener, requests up to 16 GiB, plus
# FLAGS and $SERVE_ARGS), logging to OUT_DIR/attnserve.log, waits up to 30 s for its port file,
# and sets PID and ADDR (127.0.0.1:PORT). stop_server ends it.
start_server() {
  local bin=$1 out=$2
  shift 2
  rm -f "$out/port"
  "$bin/attnserve" --listen 127.0.0.1:0 --port-file "$out/port" --metrics-listen "" \
    --max-request-bytes 17179869184 "$@" ${SERVE_ARGS:-} > "$out/attnserve.log" 2>&1 &
  PID=$!
  for _ in $(seq 300); do [ -s "$out/port" ] && break; sleep 0.1; done
  ADDR=127.0.0.1:$(cat "$out/port")
}

stop_server() {
  kill "$PID" 2>/dev/null
  wait "$PID" 2>/dev/null
}
