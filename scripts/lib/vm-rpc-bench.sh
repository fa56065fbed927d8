#!/usr/bin/env bash
# Runs inside the Soft-RoCE VM (see scripts/rpc-bench).
set -euo pipefail
calls="$1"
examples=target/release/examples
port=7500
. scripts/lib/vm-listen.sh

# run NAME CLIENTS SIZE: one benchmark; prints "rps p50 p99".
run() {
    local name="$1" clients="$2" size="$3"
    local per_client=$((calls / clients))
    [ "$per_client" -ge 100 ] || per_client=100
    port=$((port + 1))
    local client_failed=0
    case "$name" in
        rdma-ring)
            "$examples/rpc_server" --device rxe0 --listen "127.0.0.1:$port" --exit-after "$clients" > /tmp/server.log 2>&1 &
            local server=$!
            if ! wait_for_listener "$server" "$port"; then
                stop_server "$server" /tmp/server.log
                echo "FAILED"
                return 0
            fi
            "$examples/rpc_client" --device rxe0 --connect "127.0.0.1:$port" --bench \
                --clients "$clients" --size "$size" --calls "$per_client" > /tmp/client.log 2>&1 || client_failed=1 ;;
        tcp)
            "$examples/rpc_server" --tcp --listen "127.0.0.1:$port" --exit-after "$clients" > /tmp/server.log 2>&1 &
            local server=$!
            if ! wait_for_listener "$server" "$port"; then
                stop_server "$server" /tmp/server.log
                echo "FAILED"
                return 0
            fi
            "$examples/rpc_client" --tcp "127.0.0.1:$port" --bench \
                --clients "$clients" --size "$size" --calls "$per_client" > /tmp/client.log 2>&1 || client_failed=1 ;;
    esac
    if [ "$client_failed" -ne 0 ]; then
        report_failed_client "$name" "$server"
        return 0
    fi
    local status=0
    wait "$server" || status=$?
    local figures
    figures="$(sed -n 's/^BENCH .* rps=\([0-9.]*\) p50_us=\([0-9.]*\) p99_us=\([0-9.]*\)$/\1 \2 \3/p' /tmp/client.log)"
    if [ -z "$figures" ] || [ "$status" -ne 0 ]; then
        {
            echo "--- $name client:"; cat /tmp/client.log
            echo "--- $name server:"; cat /tmp/server.log
        } >&2
        echo "FAILED"
        return 0
    fi
    echo "$figures"
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf "%.2f", a / b }'; }

rounds=3
echo "echo RPCs in the TCG VM: rdma-ring on rxe0 vs TCP on loopback; $calls calls per configuration (at least 100 per client), $rounds interleaved rounds, medians"
printf '| clients | size | rdma-ring req/s | TCP req/s | req/s ratio | rdma-ring p50 / p99 µs | TCP p50 / p99 µs | p50 ratio | p99 ratio |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for clients in 1 4 16; do
    for size in 64 4096; do
        for name in rdma-ring tcp; do : > "/tmp/$name.txt"; done
        for _ in $(seq "$rounds"); do
            for name in rdma-ring tcp; do
                run "$name" "$clients" "$size" | grep -v FAILED >> "/tmp/$name.txt" || true
            done
        done
        ours_rps="$(awk '{ print $1 }' /tmp/rdma-ring.txt | median)"
        ours_p50="$(awk '{ print $2 }' /tmp/rdma-ring.txt | median)"
        ours_p99="$(awk '{ print $3 }' /tmp/rdma-ring.txt | median)"
        tcp_rps="$(awk '{ print $1 }' /tmp/tcp.txt | median)"
        tcp_p50="$(awk '{ print $2 }' /tmp/tcp.txt | median)"
        tcp_p99="$(awk '{ print $3 }' /tmp/tcp.txt | median)"
        # Ratios above 1 favour rdma-ring: its rate over TCP's, TCP's
        # latency over its.
        printf '| %s | %s B | %s | %s | %s | %s / %s | %s / %s | %s | %s |\n' \
            "$clients" "$size" "${ours_rps:-failed}" "${tcp_rps:-failed}" "$(ratio "$ours_rps" "$tcp_rps")" \
            "${ours_p50:--}" "${ours_p99:--}" "${tcp_p50:--}" "${tcp_p99:--}" \
            "$(ratio "$tcp_p50" "$ours_p50")" "$(ratio "$tcp_p99" "$ours_p99")"
    done
done
echo "(ratios above 1 favour rdma-ring: its request rate over TCP's, TCP's latency over rdma-ring's)"
