#!/usr/bin/env bash
# The secure compose setup end to end (deploy/docker-compose.secure.yml over
# deploy/docker-compose.yml, CPU profile): certificates and tokens from scripts/gen-dev-certs, the
# attnserve-cpu container becomes healthy through its mutual-TLS health check, and attnctl on the
# host gets answers with the CA, its client certificate and its token -- and is refused without
# the token, without the client certificate, and in plaintext.
#
#   tests/deploy/secure_compose_smoke.sh [ATTNCTL]
#
# Needs a running dockerd, a compose CLI (docker-compose 1.29 from Debian, or the docker compose
# plugin), the image attnserve/attnserve-cpu:local (docker/README.md) and attnctl (default
# build/bin/attnctl). Exits 77 (CTest: skipped) when one is missing. Works on a copy of deploy/ in
# a temporary folder, with the container's ports published on 127.0.0.1 at free ports, so it
# neither touches deploy/secrets nor needs 50051 free. CTest: deploy_secure_compose_smoke, labels
# "deploy;docker;slow".
set -euo pipefail

IMAGE=${SERVER_IMAGE:-attnserve/attnserve-cpu:local}
repo=$(cd "$(dirname "$0")/../.." && pwd)
attnctl=${1:-$repo/build/bin/attnctl}
skip() { echo "SKIP secure compose smoke: $*"; exit 77; }

command -v docker >/dev/null || skip "no docker client"
docker info >/dev/null 2>&1 || skip "dockerd is not reachable"
if docker compose version >/dev/null 2>&1; then
  compose_cli=(docker compose)
elif command -v docker-compose >/dev/null; then
  compose_cli=(docker-compose)
else
  skip "no compose CLI (docker compose or docker-compose)"
fi
docker image inspect "$IMAGE" >/dev/null 2>&1 || skip "image $IMAGE not built (see docker/README.md)"
[ -x "$attnctl" ] || skip "no attnctl at $attnctl (build it, or pass its path)"
command -v openssl >/dev/null || skip "no openssl (scripts/gen-dev-certs needs it)"

tmp=$(mktemp -d)
project="attnsecure$$"
compose() {
  "${compose_cli[@]}" -p "$project" -f "$tmp/deploy/docker-compose.yml" \
    -f "$tmp/deploy/docker-compose.secure.yml" --profile cpu "$@"
}
cleanup() {
  compose down -v --remove-orphans >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

mkdir -p "$tmp/deploy"
cp -r "$repo/deploy/." "$tmp/deploy/"
rm -rf "$tmp/deploy/secrets"
# Free host ports on loopback instead of 50051 and 9464.
sed -i 's/"50051:50051"/"127.0.0.1::50051"/; s/"9464:9464"/"127.0.0.1::9464"/' \
  "$tmp/deploy/docker-compose.yml"
"$repo/scripts/gen-dev-certs" "$tmp/deploy/secrets" >/dev/null
chmod 0644 "$tmp"/deploy/secrets/*.key "$tmp/deploy/secrets/tokens.txt"
secrets="$tmp/deploy/secrets"

passed=0 failed=0
ok() { echo "PASS $*"; passed=$((passed + 1)); }
bad() { echo "FAIL $*"; failed=$((failed + 1)); }

compose up -d --no-build attnserve-cpu
container=$(compose ps -q attnserve-cpu)
port=$(compose port attnserve-cpu 50051 | sed 's/.*://')
target="localhost:$port"
echo "attnserve-cpu: container ${container:0:12}, gRPC on $target"

# Healthy through the compose file's own health check (attnctl health over mutual TLS).
health=starting
for _ in $(seq 1 90); do
  health=$(docker inspect -f '{{.State.Health.Status}}' "$container" 2>/dev/null || echo gone)
  [ "$health" = healthy ] || [ "$health" = unhealthy ] || [ "$health" = gone ] && break
  sleep 1
done
if [ "$health" = healthy ]; then ok "container healthy (mutual-TLS health check)"; else
  bad "container health: $health"
  docker logs "$container" 2>&1 | tail -20
fi

tls=(--server "$target" --ca-cert "$secrets/ca.pem" --client-cert "$secrets/client.pem"
  --client-key "$secrets/client.key")
if out=$(timeout 60 "$attnctl" describe "${tls[@]}" --token-file "$secrets/token.txt" 2>&1); then
  ok "describe with CA, client certificate and token"
else
  bad "describe with CA, client certificate and token: $out"
fi
if out=$(timeout 120 "$attnctl" run "${tls[@]}" --token-file "$secrets/token.txt" \
  --random 1,512,4,4,64 --dtype f32 --seed 3 --spec '{"dense": {}}' --causal --check 2>&1); then
  ok "run --check over mutual TLS with a token"
else
  bad "run --check over mutual TLS with a token: $out"
fi
if out=$(ATTNSERVE_TOKEN= timeout 60 "$attnctl" describe "${tls[@]}" 2>&1); then
  bad "describe without a token answered (--auth-discovery is set): $out"
else
  ok "describe without a token refused: $(echo "$out" | tail -1)"
fi
if out=$(timeout 60 "$attnctl" describe --server "$target" --ca-cert "$secrets/ca.pem" \
  --token-file "$secrets/token.txt" 2>&1); then
  bad "describe without a client certificate answered: $out"
else
  ok "describe without a client certificate refused: $(echo "$out" | tail -1)"
fi
if out=$(timeout 60 "$attnctl" health --server "$target" 2>&1); then
  bad "plaintext health answered: $out"
else
  ok "plaintext client refused: $(echo "$out" | tail -1)"
fi

echo "secure compose smoke: $passed passed, $failed failed"
((failed == 0))
