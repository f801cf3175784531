#!/bin/bash
# call 1: A/B main vs epilogue (fast rcp/log, no int divide), sustained, and every GPU test of EPI.
R=$PWD; cd /tmp && tar -xJf $R/.gpu-bundle/bX.tar.xz && cd $R && source /tmp/bX/env.sh
V=/tmp/bX/var
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/gpu.txt
REPS=7 VARIANTS="main:$V/attnbench_cuda_MAIN epi:$V/attnbench_cuda_EPI" bash bench/kernel_ab.sh $OUT/ab > $OUT/ab.log 2>&1
bash .gpu-bundle/sus.sh $OUT/sus dense_n16384,sparse_random_s99,sparse_local_window_s99,sparse_random_s90 main:$V/attnbench_cuda_MAIN epi:$V/attnbench_cuda_EPI > $OUT/sus.txt 2>&1
mkdir -p $OUT/tests
for t in flash_sm90_test cuda_attention_test flash_decode_test rect_attention_test cudnn_sdpa_test cuda_device_test pinned_host_test device_io_test ring_cuda_test; do
  timeout -k 5 200 $V/$t > $OUT/tests/$t.log 2>&1; echo "$t rc=$? $(grep -E '^\[  PASSED|FAILED TEST|tests? ran' $OUT/tests/$t.log | tr '\n' ' ')"
done
cat $OUT/ab/ab.md; cat $OUT/sus.txt
