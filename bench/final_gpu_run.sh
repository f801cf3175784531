#!/usr/bin/env bash
# One lease, everything that needs GPUs: run on nvidia-h200-x2 after `source .gpu-bundle/env.sh`.
#   1. the service on the CUDA backend, driven by attnctl (single GPU and ring placement), checked
#      against the float64 reference; its /metrics scraped afterwards
#   2. bench/multigpu_run.sh: ring tests on 2 GPUs, attnbench_ring, the PyTorch+NCCL ring
#   3. bench/gpu_run.sh: single-GPU tests (kernels, cuDNN engine, CudaDevice) and the side-by-side
#      benchmarks against PyTorch SDPA (flash, cuDNN) and FlexAttention, on GPU 0
# Results: $OUT/{service,multi,single}.tgz (every file of each step, written as each step ends,
# so a lease cut short still returns what finished) plus the three summaries.
set -u
OUT=${OUT:?OUT must be set}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=/tmp/attn_results
rm -rf "$R"; mkdir -p "$R/service" "$R/multi" "$R/single"
BIN=.gpu-bundle/bin
T0=$(date +%s)
stamp() { echo "[$(($(date +%s) - T0)) s] $*"; }

# 1. Service.
S="$R/service"
stamp "service: start attnserve --backend cuda"
"$BIN/attnserve" --backend cuda --listen 127.0.0.1:0 --port-file "$S/port" \
  --metrics-listen 127.0.0.1:0 --metrics-port-file "$S/mport" > "$S/attnserve.log" 2>&1 &
SPID=$!
for _ in $(seq 1 100); do [ -s "$S/port" ] && [ -s "$S/mport" ] && break; sleep 0.2; done
SERVICE_DEADLINE=$(( $(date +%s) + 140 ))
left() { echo $(( SERVICE_DEADLINE - $(date +%s) > 5 ? SERVICE_DEADLINE - $(date +%s) : 5 )); }
if [ -s "$S/port" ]; then
  ADDR=127.0.0.1:$(cat "$S/port")
  {
    timeout 20 "$BIN/attnctl" health --server "$ADDR"; echo "health rc=$?"
    timeout 20 "$BIN/attnctl" describe --server "$ADDR"; echo "describe rc=$?"
    for spec in '{"dense": {}}' '{"dense": {}, "causal": true}' '{"window": {"size": 300}, "causal": true}' \
        '{"dilated": {"segmentLengths": [512, 1024], "dilationRates": [1, 2]}, "causal": true}' \
        '{"blockSparse": {"blockSize": 128, "random": {"keep": 0.2, "seed": "3"}}, "causal": true}'; do
      for placement in single ring; do
        echo "### spec=$spec placement=$placement"
        timeout $(( $(left) < 30 ? $(left) : 30 )) "$BIN/attnctl" run --server "$ADDR" --random 1,2000,8,4,128 --dtype bf16 --seed 11 \
          --spec "$spec" --placement "$placement" --check
        echo "rc=$?"
      done
    done
    echo "### larger ring request through the service (no check): N=262144, Hq=8, D=128, causal"
    timeout $(( $(left) < 60 ? $(left) : 60 )) "$BIN/attnctl" run --server "$ADDR" --random 1,262144,8,8,128 --dtype bf16 --seed 5 \
      --spec '{"dense": {}}' --causal --placement ring
    echo "rc=$?"
    timeout $(( $(left) < 60 ? $(left) : 60 )) "$BIN/attnctl" run --server "$ADDR" --random 1,262144,8,8,128 --dtype bf16 --seed 5 \
      --spec '{"dense": {}}' --causal --placement single
    echo "rc=$?"
  } > "$S/attnctl.log" 2>&1
  python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
    "http://127.0.0.1:$(cat "$S/mport")/metrics" > "$S/metrics.txt" 2>&1 || true
else
  echo "attnserve did not start" > "$S/attnctl.log"
fi
kill -TERM $SPID 2>/dev/null; for _ in $(seq 1 50); do kill -0 $SPID 2>/dev/null || break; sleep 0.2; done
kill -KILL $SPID 2>/dev/null
{
  echo "# service on CUDA"; grep -E "^###|rc=|PASS|FAIL|placement|devices|backend|error" "$S/attnctl.log" | head -80
  echo; echo "## metrics"; grep -E "^attnserve_(device_tokens_total|device_memory_peak_bytes|nccl_bytes_total|device_memory_imbalance_ratio|requests_total\{code=\"OK\"\})" "$S/metrics.txt"
} > "$S/summary.md"
tar czf "$OUT/service.tgz" -C "$R" service 2>/dev/null; cp "$S/summary.md" "$OUT/service_summary.md"
stamp "service done"

# 2. Multi-GPU.
OUT="$R/multi" timeout -k 5 230 bash bench/multigpu_run.sh > "$R/multi/stdout.log" 2>&1
rc=$?
tar czf "$OUT/multi.tgz" -C "$R" multi 2>/dev/null; cp "$R/multi/summary.md" "$OUT/multi_summary.md" 2>/dev/null
stamp "multigpu done rc=$rc"

# 3. Single GPU (huge cases were measured in an earlier lease; skipped here to fit this one).
OUT="$R/single" ATTN_SKIP_HUGE=1 timeout -k 5 190 bash bench/gpu_run.sh > "$R/single/stdout.log" 2>&1
rc=$?
tar czf "$OUT/single.tgz" -C "$R" single 2>/dev/null; cp "$R/single/summary.md" "$OUT/single_summary.md" 2>/dev/null
stamp "single done rc=$rc"
cat "$OUT/service_summary.md"; tail -40 "$OUT/multi_summary.md" 2>/dev/null; tail -30 "$OUT/single_summary.md" 2>/dev/null
stamp "all done"
