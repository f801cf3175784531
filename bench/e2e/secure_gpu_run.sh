#!/usr/bin/env bash
# The hardened service on one GPU host, in one run: the CUDA backend behind mutual TLS and bearer
# tokens (scripts/gen-dev-certs), checked requests through attnctl, the refusals without a token
# or a client certificate, each request line's code and principal, then decode steps against a
# kept 128K-row context through the plaintext and through the mutual-TLS + token service
# (attnbench_context), so the cost of the transport security per decode step is measured.
#
# Usage (on the GPU host, bundle unpacked):  NEW=/path/to/bundle bench/e2e/secure_gpu_run.sh OUT_DIR
set -u
OUT=${1:?usage: $0 OUT_DIR}
NEW=${NEW:-.gpu-bundle}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
SUMMARY="$OUT/summary.md"
: > "$SUMMARY"
say() { echo "- $*" | tee -a "$SUMMARY"; }
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
source "$(dirname "$0")/start_server.sh"

SECRETS="$OUT/secrets"
"$HERE/scripts/gen-dev-certs" "$SECRETS" > /dev/null
say "gen-dev-certs rc=$?"
TLS=(--ca-cert "$SECRETS/ca.pem" --client-cert "$SECRETS/client.pem"
  --client-key "$SECRETS/client.key")

# 1. Mutual TLS + tokens on the CUDA backend.
mkdir -p "$OUT/secure"
start_server "$NEW/bin" "$OUT/secure" --backend cuda --tls-cert "$SECRETS/server.pem" \
  --tls-key "$SECRETS/server.key" --tls-client-ca "$SECRETS/ca.pem" \
  --token-file "$SECRETS/tokens.txt" --auth-discovery
SECURE=localhost:${ADDR##*:}
say "secure server on $SECURE (pid $PID)"
for spec in '{"dense": {}}' '{"window": {"size": 512}}' \
  '{"blockSparse": {"blockSize": 128, "random": {"keep": 0.1, "seed": 5}}}'; do
  timeout -k 5 120 "$NEW/bin/attnctl" run --server "$SECURE" "${TLS[@]}" \
    --token-file "$SECRETS/token.txt" --random 1,4096,8,8,128 --dtype bf16 --seed 11 \
    --spec "$spec" --causal --check > "$OUT/secure/run.log" 2>&1
  say "attnctl run --check over mTLS + token, spec $spec: rc=$? $(grep -iE 'check|max' "$OUT/secure/run.log" | tail -1)"
done
ATTNSERVE_TOKEN= timeout -k 5 60 "$NEW/bin/attnctl" describe --server "$SECURE" "${TLS[@]}" \
  > "$OUT/secure/no_token.log" 2>&1
say "describe without a token: rc=$? $(tail -1 "$OUT/secure/no_token.log")"
timeout -k 5 60 "$NEW/bin/attnctl" describe --server "$SECURE" --ca-cert "$SECRETS/ca.pem" \
  --token-file "$SECRETS/token.txt" > "$OUT/secure/no_cert.log" 2>&1
say "describe without a client certificate: rc=$? $(tail -1 "$OUT/secure/no_cert.log")"
stop_server
say "request lines of the secure server:"
grep -E "\] attend " "$OUT/secure/attnserve.log" | cut -c1-240 | sed 's/^/    /' | tee -a "$SUMMARY"

# 2. Decode steps against a kept 128K-row context: plaintext, then mutual TLS + token.
SHAPE="--q-heads 32 --kv-heads 8 --head-dim 128"
mkdir -p "$OUT/plain"
start_server "$NEW/bin" "$OUT/plain" --backend cuda
timeout -k 5 200 "$NEW/bin/attnbench_context" --server "$ADDR" --mode decode \
  --context-tokens 131072 --append-rows 65536 $SHAPE --q-lens 1,4,16 --steps ${STEPS:-30} \
  --json-out "$OUT/decode_plain.json" > "$OUT/decode_plain.log" 2>&1
say "decode through the plaintext service, 131072 rows, rc=$?:"
sed 's/^/    /' "$OUT/decode_plain.log" | tee -a "$SUMMARY"
stop_server
start_server "$NEW/bin" "$OUT/secure" --backend cuda --tls-cert "$SECRETS/server.pem" \
  --tls-key "$SECRETS/server.key" --tls-client-ca "$SECRETS/ca.pem" \
  --token-file "$SECRETS/tokens.txt"
ATTNSERVE_TOKEN=$(cat "$SECRETS/token.txt") timeout -k 5 200 "$NEW/bin/attnbench_context" \
  --server "localhost:${ADDR##*:}" "${TLS[@]}" --mode decode \
  --context-tokens 131072 --append-rows 65536 $SHAPE --q-lens 1,4,16 --steps ${STEPS:-30} \
  --json-out "$OUT/decode_mtls.json" > "$OUT/decode_mtls.log" 2>&1
say "decode through the mTLS + token service, 131072 rows, rc=$?:"
sed 's/^/    /' "$OUT/decode_mtls.log" | tee -a "$SUMMARY"
stop_server
