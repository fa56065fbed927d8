#!/usr/bin/env bash
# Runs inside the Soft-RoCE VM (see scripts/perf).
set -euo pipefail
size="$1" batch="$2" depth="$3" iters="$4"
perf=target/release/examples/perf

perftest_mpps() { # tool: the message rate perftest reports, in Mpps
    local tool="$1"
    "$tool" -d rxe0 -x 1 -s "$size" -n "$iters" -t "$depth" -l "$batch" -Q "$batch" -F > /tmp/server.log 2>&1 &
    local server=$!
    sleep 1
    "$tool" -d rxe0 -x 1 -s "$size" -n "$iters" -t "$depth" -l "$batch" -Q "$batch" -F 127.0.0.1 > /tmp/client.log 2>&1
    wait "$server" || true
    # The result line: #bytes #iterations BW-peak BW-average MsgRate[Mpps]
    awk -v size="$size" '$1 == size && NF >= 5 { print $5 }' /tmp/client.log | tail -n 1
}

echo "size=$size batch=$batch depth=$depth iters=$iters, CQE every $batch WRs, rxe0 (TCG VM)"
for op in write read; do
    tool="ib_${op}_bw"
    theirs="$(perftest_mpps "$tool")"
    "$perf" --device rxe0 --op "$op" --size "$size" --batch "$batch" --depth "$depth" --signal "$batch" --iters "$iters" | tee /tmp/ring.log
    ours="$(sed -n 's/.* = \([0-9.]*\) Mops\/s.*/\1/p' /tmp/ring.log)"
    if [ -z "$theirs" ] || [ -z "$ours" ]; then
        echo "$op: could not read a figure (perftest: '${theirs}', rdma-ring: '${ours}')"
        cat /tmp/client.log
        exit 1
    fi
    ratio="$(awk -v a="$ours" -v b="$theirs" 'BEGIN { printf "%.2f", a / b }')"
    echo "$op: rdma-ring $ours Mops/s, $tool $theirs Mops/s, ratio $ratio"
done
"$perf" --device noop --size "$size" --batch "$batch" --depth "$depth" --signal "$batch" --iters "$((iters * 10))"
