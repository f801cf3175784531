#!/usr/bin/env bash
# End-to-end smoke test of the CPU image and the Prometheus config, with plain `docker run` (no
# compose plugin needed): attnserve-cpu becomes healthy, serves a request, exports the metrics of
# docs/DESIGN.md "Metrics", Prometheus scrapes it and evaluates the recording rules, and SIGTERM
# drains and exits 0 within the grace period.
#
#   tests/deploy/docker_smoke.sh
#
# Needs a running dockerd and the images attnserve/attnserve-cpu:local and attnserve/prometheus:local
# (docker/README.md). Exits 77 (CTest: skipped) when either is missing. Talks only to 127.0.0.1
# and a private docker network it creates and removes. CTest: deploy_docker_smoke, labels
# "deploy;docker;slow" (not in the default `make test`, which leaves out "slow").
set -euo pipefail

SERVER_IMAGE=${SERVER_IMAGE:-attnserve/attnserve-cpu:local}
PROM_IMAGE=${PROM_IMAGE:-attnserve/prometheus:local}
repo=$(cd "$(dirname "$0")/../.." && pwd)
skip() { echo "SKIP docker smoke: $*"; echo "0 passed, 0 failed, 1 skipped"; exit 77; }

command -v docker >/dev/null || skip "no docker client"
docker info >/dev/null 2>&1 || skip "dockerd is not reachable"
for img in "$SERVER_IMAGE" "$PROM_IMAGE"; do
  docker image inspect "$img" >/dev/null 2>&1 || skip "image $img not built (see docker/README.md)"
done

id="attnserve-smoke-$$"
net="$id-net"
passed=0 failed=0
cleanup() {
  docker rm -fv "$id-server" "$id-prom" >/dev/null 2>&1 || true
  docker network rm "$net" >/dev/null 2>&1 || true
}
trap cleanup EXIT
ok() { echo "PASS $*"; passed=$((passed + 1)); }
bad() { echo "FAIL $*"; failed=$((failed + 1)); }
finish() {
  echo "docker smoke: $passed passed, $failed failed"
  ((failed == 0))
  exit $?
}

docker network create "$net" >/dev/null
docker run -d --name "$id-server" --network "$net" --network-alias attnserve \
  -p 127.0.0.1::50051 -p 127.0.0.1::9464 "$SERVER_IMAGE" --drain-timeout=5s >/dev/null
metrics_port=$(docker port "$id-server" 9464/tcp | head -n1 | sed 's/.*://')

# 1. HEALTHCHECK (attnctl health inside the container) turns healthy.
status=""
for _ in $(seq 1 60); do
  status=$(docker inspect --format '{{.State.Health.Status}}' "$id-server")
  [ "$status" = healthy ] && break
  [ "$(docker inspect --format '{{.State.Running}}' "$id-server")" = true ] || break
  sleep 1
done
if [ "$status" = healthy ]; then ok "server healthy (HEALTHCHECK attnctl health)"; else
  bad "server not healthy: $status"; docker logs "$id-server" 2>&1 | tail -20; finish; fi

# 2. One request through attnctl inside the container; non-root user.
if docker exec "$id-server" attnctl run --server 127.0.0.1:50051 --random 1,256,4,4,64 \
     --dtype f32 --check --quiet >/tmp/$id.run 2>&1; then ok "attnctl run --check"; else
  bad "attnctl run: $(tail -3 /tmp/$id.run)"; fi
rm -f /tmp/$id.run
uid=$(docker exec "$id-server" id -u)
[ "$uid" != 0 ] && ok "runs as uid $uid" || bad "runs as root"

# 3. /metrics has every docs/DESIGN.md "Metrics" name the deploy files use.
metrics=$(curl -fsS "http://127.0.0.1:$metrics_port/metrics" || true)
missing=()
for n in attnserve_device_memory_used_bytes attnserve_device_memory_total_bytes \
         attnserve_device_memory_reserved_bytes attnserve_device_memory_peak_bytes \
         attnserve_device_tokens_total attnserve_device_flops_total \
         attnserve_device_busy_seconds_total attnserve_device_memory_imbalance_ratio \
         attnserve_requests_total attnserve_request_duration_seconds_bucket \
         attnserve_queue_wait_seconds_bucket attnserve_queue_length attnserve_inflight_requests \
         attnserve_received_bytes_total attnserve_sent_bytes_total; do
  grep -q "^$n[{ ]" <<<"$metrics" || missing+=("$n")
done
((${#missing[@]} == 0)) && ok "/metrics exports the dashboard metrics" || bad "/metrics lacks ${missing[*]}"
grep -q '^attnserve_requests_total{code="OK"} [1-9]' <<<"$metrics" \
  && ok 'attnserve_requests_total{code="OK"} counted the request' \
  || bad 'attnserve_requests_total{code="OK"} did not count the request'

# 4. Prometheus with deploy/prometheus scrapes attnserve:9464 and evaluates the rules.
docker run -d --name "$id-prom" --network "$net" -p 127.0.0.1::9090 \
  -v "$repo/deploy/prometheus:/etc/prometheus:ro" "$PROM_IMAGE" \
  --config.file=/etc/prometheus/prometheus.yml --storage.tsdb.path=/prometheus >/dev/null
prom_port=$(docker port "$id-prom" 9090/tcp | head -n1 | sed 's/.*://')
query() { curl -fsS --get "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1" 2>/dev/null || true; }
up=""
for _ in $(seq 1 60); do
  up=$(query 'up{job="attnserve"}')
  grep -q '"value":\[[0-9.]*,"1"\]' <<<"$up" && break
  sleep 1
done
grep -q '"value":\[[0-9.]*,"1"\]' <<<"$up" && ok 'Prometheus scrapes up{job="attnserve"} == 1' \
  || bad "Prometheus target not up: $up"
res=""
for _ in $(seq 1 40); do
  res=$(query 'attnserve:device_memory_gap:bytes')
  grep -q '"result":\[{' <<<"$res" && break
  sleep 1
done
grep -q '"result":\[{' <<<"$res" && ok "recording rule attnserve:device_memory_gap:bytes evaluated" \
  || bad "recording rule attnserve:device_memory_gap:bytes has no result: $res"

# 5. SIGTERM drains and exits 0 well within the grace period.
start=$(date +%s)
docker stop -t 30 "$id-server" >/dev/null
took=$(($(date +%s) - start))
code=$(docker inspect --format '{{.State.ExitCode}}' "$id-server")
if [ "$code" = 0 ] && ((took < 30)); then ok "SIGTERM: exit 0 after ${took}s"; else
  bad "SIGTERM: exit code $code after ${took}s"; docker logs "$id-server" 2>&1 | tail -10; fi

finish
