#!/usr/bin/env bash
# Runs inside the Soft-RoCE VM (see scripts/stream-bench).
set -euo pipefail
bw_count="$1" lat_count="$2"
bench=target/release/examples/stream_bench
addr=10.99.0.1
port=7490
. scripts/lib/vm-listen.sh

# run_pair NAME SIZE COUNT: one transfer test; prints "Gb/s usec/xfer".
run_pair() {
    local name="$1" size="$2" count="$3"
    port=$((port + 1))
    local client_failed=0
    case "$name" in
        rdma-ring)
            "$bench" --cm --listen "$addr:$port" -S "$size" -C "$count" > /tmp/server.log 2>&1 &
            local server=$!
            if ! wait_for_listener "$server" "$port"; then
                stop_server "$server" /tmp/server.log
                echo "FAILED"
                return 0
            fi
            "$bench" --cm --connect "$addr:$port" -S "$size" -C "$count" > /tmp/client.log 2>&1 || client_failed=1 ;;
        rstream | riostream)
            "$name" -b "$addr" -p "$port" -S "$size" -C "$count" > /tmp/server.log 2>&1 &
            local server=$!
            if ! wait_for_listener "$server" "$port"; then
                stop_server "$server" /tmp/server.log
                echo "FAILED"
                return 0
            fi
            "$name" -s "$addr" -p "$port" -S "$size" -C "$count" > /tmp/client.log 2>&1 || client_failed=1 ;;
        tcp)
            rstream -T s -b "$addr" -p "$port" -S "$size" -C "$count" > /tmp/server.log 2>&1 &
            local server=$!
            if ! wait_for_listener "$server" "$port"; then
                stop_server "$server" /tmp/server.log
                echo "FAILED"
                return 0
            fi
            rstream -T s -s "$addr" -p "$port" -S "$size" -C "$count" > /tmp/client.log 2>&1 || client_failed=1 ;;
    esac
    if [ "$client_failed" -ne 0 ]; then
        report_failed_client "$name" "$server"
        return 0
    fi
    local status=0
    wait "$server" || status=$?
    # The result line: name bytes xfers [iters] total time Gb/sec usec/xfer
    local figures
    figures="$(awk 'NF >= 7 && $(NF) ~ /^[0-9.]+$/ && $(NF-1) ~ /^[0-9.]+$/ { print $(NF-1), $NF }' /tmp/client.log | tail -n 1)"
    if [ -z "$figures" ] || [ "$status" -ne 0 ]; then
        echo "FAILED"
        {
            echo "--- $name client:"; cat /tmp/client.log
            echo "--- $name server:"; cat /tmp/server.log
        } >&2
        return 0
    fi
    echo "$figures"
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }

rounds=3
echo "echo transfers over rxe1 (TCG VM): bandwidth = 64 KiB x $bw_count, latency = 64 B x $lat_count; $rounds interleaved rounds, medians"
for test in bandwidth latency; do
    case "$test" in
        bandwidth) size=65536 count="$bw_count" column=1 unit="Gb/s" ;;
        latency) size=64 count="$lat_count" column=2 unit="usec/xfer" ;;
    esac
    for name in rdma-ring rstream riostream tcp; do : > "/tmp/$test-$name.txt"; done
    for _ in $(seq "$rounds"); do
        for name in rdma-ring rstream riostream tcp; do
            run_pair "$name" "$size" "$count" | awk -v c="$column" '$1 != "FAILED" { print $c }' >> "/tmp/$test-$name.txt"
        done
    done
    ours="$(median < "/tmp/$test-rdma-ring.txt")"
    echo "$test ($unit; lower is better for latency):"
    for name in rdma-ring rstream riostream tcp; do
        value="$(median < "/tmp/$test-$name.txt")"
        runs="$(tr '\n' ' ' < "/tmp/$test-$name.txt")"
        if [ -z "$value" ]; then
            echo "  $name: failed every round (see above)"
            continue
        fi
        if [ "$name" = rdma-ring ] || [ -z "$ours" ]; then
            echo "  $name: $value (runs: $runs)"
        elif [ "$test" = bandwidth ]; then
            echo "  $name: $value (runs: $runs); rdma-ring / $name = $(awk -v a="$ours" -v b="$value" 'BEGIN { printf "%.2f", a / b }')"
        else
            echo "  $name: $value (runs: $runs); $name / rdma-ring = $(awk -v a="$ours" -v b="$value" 'BEGIN { printf "%.2f", b / a }') (above 1: rdma-ring is faster)"
        fi
    done
done
