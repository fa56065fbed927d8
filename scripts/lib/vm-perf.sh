#!/usr/bin/env bash
# Runs inside the Soft-RoCE VM (see scripts/perf).
set -euo pipefail
size="$1" batch="$2" depth="$3" iters="$4"
perf=target/release/examples/perf

perftest_mpps() { # tool bytes [flags]: the message rate perftest reports, in Mpps
    local tool="$1" bytes="$2"
    shift 2
    "$tool" -d rxe0 -x 1 -n "$iters" -t "$depth" -l "$batch" -Q "$batch" "$@" -F > /tmp/server.log 2>&1 &
    local server=$!
    sleep 1
    "$tool" -d rxe0 -x 1 -n "$iters" -t "$depth" -l "$batch" -Q "$batch" "$@" -F 127.0.0.1 > /tmp/client.log 2>&1
    wait "$server" || true
    # The result line: #bytes #iterations BW-peak BW-average MsgRate[Mpps]
    awk -v size="$bytes" '$1 == size && NF >= 5 { print $5 }' /tmp/client.log | tail -n 1
}

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

rounds=3
echo "size=$size batch=$batch depth=$depth iters=$iters, CQE every $batch WRs, WRITEs/SENDs up to 220 B inline, rxe0 (TCG VM)"
echo "each side runs $rounds times, interleaved; medians are compared (TCG timing is noisy)"
for op in write read send fetch_add; do
    # Both sides post small WRITEs and SENDs inline (perftest's default,
    # made explicit); atomics are 8 bytes.
    case "$op" in
        write | send) tool="ib_${op}_bw" bytes="$size" flags=(-s "$size" -I 220) ;;
        read) tool=ib_read_bw bytes="$size" flags=(-s "$size") ;;
        fetch_add) tool=ib_atomic_bw bytes=8 flags=(-A FETCH_AND_ADD) ;;
    esac
    : > /tmp/theirs.txt
    : > /tmp/ours.txt
    for _ in $(seq "$rounds"); do
        perftest_mpps "$tool" "$bytes" "${flags[@]}" >> /tmp/theirs.txt
        "$perf" --device rxe0 --op "$op" --size "$size" --batch "$batch" --depth "$depth" --signal "$batch" --iters "$iters" \
            | sed -n 's/.* = \([0-9.]*\) Mops\/s.*/\1/p' >> /tmp/ours.txt
    done
    theirs="$(median < /tmp/theirs.txt)"
    ours="$(median < /tmp/ours.txt)"
    if [ -z "$theirs" ] || [ -z "$ours" ]; then
        echo "$op: could not read a figure (perftest: '${theirs}', rdma-ring: '${ours}')"
        cat /tmp/client.log
        exit 1
    fi
    ratio="$(awk -v a="$ours" -v b="$theirs" 'BEGIN { printf "%.2f", a / b }')"
    echo "$op: rdma-ring $ours Mops/s (runs: $(tr '\n' ' ' < /tmp/ours.txt)), $tool $theirs Mops/s (runs: $(tr '\n' ' ' < /tmp/theirs.txt)), ratio $ratio"
done
"$perf" --device noop --size "$size" --batch "$batch" --depth "$depth" --signal "$batch" --iters "$((iters * 10))"
