#!/usr/bin/env bash
# Runs inside the Soft-RoCE VM (see scripts/softroce), from the repository
# root: the verbs conformance suite and the examples on rxe0, then the
# device-removal test on rxe1 (last: it deletes rxe1). Its arguments are the
# conformance, device-removal, stream, RPC and session test binaries, built
# on the host.
set -euo pipefail
conformance="$1"
removal="$2"
stream="$3"
rpc="$4"
session="$5"
examples=target/debug/examples
. scripts/lib/vm-listen.sh

# server_and_client SERVER SERVER-ARGS -- CLIENT CLIENT-ARGS: runs example
# SERVER in the background and example CLIENT, and fails if either does,
# or if the client runs past five minutes (the server gets the time it may
# wait to be seen listening on top): a hang fails here, not at CI's limit.
server_and_client() {
    local name="$1"
    shift
    local server=()
    while [ "$1" != "--" ]; do
        server+=("$1")
        shift
    done
    shift
    local client="$1"
    shift
    timeout 420 "$examples/$name" "${server[@]}" > "/tmp/$name-server.log" 2>&1 &
    local pid=$!
    if ! wait_for_listener "$pid" "$(listen_port "${server[@]}")"; then
        stop_server "$pid" "/tmp/$name-server.log"
        exit 1
    fi
    if ! timeout 300 "$examples/$client" "$@"; then
        stop_server "$pid" "/tmp/$name-server.log"
        echo "the $client client failed (or ran past five minutes)" >&2
        exit 1
    fi
    if ! wait "$pid"; then
        cat "/tmp/$name-server.log"
        echo "the $name server failed (or ran out of time)" >&2
        exit 1
    fi
    cat "/tmp/$name-server.log"
}

# two_processes NAME SERVER-ARGS -- CLIENT-ARGS: one example as both.
two_processes() {
    local name="$1"
    shift
    local args=()
    for arg in "$@"; do
        args+=("$arg")
        if [ "$arg" = "--" ]; then
            args+=("$name")
        fi
    done
    server_and_client "$name" "${args[@]}"
}

echo "==> [vm] verbs conformance suite on rxe0"
RDMA_RING_DEVICE=rxe0 "$conformance" --include-ignored --test-threads=1

echo "==> [vm] quickstart on rxe0, one process"
"$examples/quickstart" --device rxe0

echo "==> [vm] quickstart with no --device: the first usable device, said aloud"
"$examples/quickstart" | tee /tmp/quickstart.out
grep -q "no --device given: using rxe" /tmp/quickstart.out \
    || { echo "quickstart picked no rxe device on its own" >&2; exit 1; }

echo "==> [vm] quickstart on rxe0, two processes over the TCP handshake"
two_processes quickstart --device rxe0 --listen 127.0.0.1:7471 -- --device rxe0 --connect 127.0.0.1:7471

echo "==> [vm] many_peers on rxe0: one server ring (one CQ, one SRQ) serving 64 clients"
"$examples/many_peers" --device rxe0

echo "==> [vm] the byte stream on rxe0 (TCP handshake) and rxe1 (rdma_cm)"
RDMA_RING_DEVICE=rxe0 "$stream" --include-ignored --test-threads=1

echo "==> [vm] stream_hello on rxe0, two processes"
two_processes stream_hello --device rxe0 --listen 127.0.0.1:7482 -- --device rxe0 --connect 127.0.0.1:7482
echo "==> [vm] stream_echo on rxe0, two processes over the TCP handshake"
two_processes stream_echo --device rxe0 --listen 127.0.0.1:7480 -- --device rxe0 --connect 127.0.0.1:7480
echo "==> [vm] stream_echo on rxe1, two processes over rdma_cm"
two_processes stream_echo --cm --listen 10.99.0.1:7481 -- --cm --connect 10.99.0.1:7481

echo "==> [vm] RPC on rxe0 (TCP handshake) and rxe1 (rdma_cm)"
RDMA_RING_DEVICE=rxe0 "$rpc" --include-ignored --test-threads=1
echo "==> [vm] rpc_server and rpc_client on rxe0, two processes: 16 clients, 8 calls in flight each"
server_and_client rpc_server --device rxe0 --listen 127.0.0.1:7490 --exit-after 16 -- \
    rpc_client --device rxe0 --connect 127.0.0.1:7490 --clients 16 --calls 48 --depth 8
echo "==> [vm] rpc_server (key-value, async handler) and rpc_client on rxe1 over rdma_cm"
server_and_client rpc_server --cm --listen 10.99.0.1:7491 --handler kv --async --exit-after 4 -- \
    rpc_client --cm 10.99.0.1:7491 --handler kv --clients 4 --calls 40 --depth 8

echo "==> [vm] sessions on rxe0 (TCP handshake) and rxe1 (rdma_cm)"
RDMA_RING_DEVICE=rxe0 "$session" --include-ignored --test-threads=1
echo "==> [vm] lab_server and lab_client (exercises 4.1-4.5) on rxe0, two processes over the TCP handshake"
server_and_client lab_server --device rxe0 --listen 127.0.0.1:7500 -- lab_client --device rxe0 --connect 127.0.0.1:7500
echo "==> [vm] lab_server and lab_client on rxe1, two processes over rdma_cm"
server_and_client lab_server --cm --listen 10.99.0.1:7501 -- lab_client --cm --connect 10.99.0.1:7501
echo "==> [vm] file_transfer of 24 MiB on rxe0, two processes, 4 writes in flight"
two_processes file_transfer --device rxe0 --listen 127.0.0.1:7510 -- --device rxe0 --connect 127.0.0.1:7510 --size 25165824 --depth 4

echo "==> [vm] rdma-ring-perf on rxe0, two processes: WRITE bandwidth 2 B - 64 KiB, table, JSON and SVG plot"
rm -f /tmp/rdma-ring-perf.svg
server_and_client rdma-ring-perf write bw -d rxe0 -p 18515 -a --max-size 65536 -n 2000 -- \
    rdma-ring-perf write bw -d rxe0 -p 18515 -a --max-size 65536 -n 2000 --json --plot /tmp/rdma-ring-perf.svg 127.0.0.1
grep -q "<svg" /tmp/rdma-ring-perf.svg || { echo "rdma-ring-perf drew no plot" >&2; exit 1; }
echo "==> [vm] rdma-ring-perf on rxe0, two processes: SEND latency, awaited"
server_and_client rdma-ring-perf send lat -d rxe0 -p 18516 -n 500 -- \
    rdma-ring-perf send lat -d rxe0 -p 18516 -n 500 --async 127.0.0.1

echo "==> [vm] rdma-ring-perf on rxe0, two processes: READ bandwidth and SEND latency, fixed-buffer ring"
server_and_client rdma-ring-perf read bw -d rxe0 -p 18517 -s 4096 -n 2000 -- \
    rdma-ring-perf read bw -d rxe0 -p 18517 -s 4096 -n 2000 --fixed 127.0.0.1
server_and_client rdma-ring-perf send lat -d rxe0 -p 18518 -n 500 -- \
    rdma-ring-perf send lat -d rxe0 -p 18518 -n 500 --fixed 127.0.0.1
echo "==> [vm] rdma-ring-perf on rxe0, two processes: WRITE bandwidth, fixed-buffer ring awaited"
server_and_client rdma-ring-perf write bw -d rxe0 -p 18519 -s 4096 -n 2000 -- \
    rdma-ring-perf write bw -d rxe0 -p 18519 -s 4096 -n 2000 --fixed --async 127.0.0.1
echo "==> [vm] rdma-ring-perf on rxe0, two processes: WRITE latency (a ping-pong), 2 B - 4 KiB, each path"
server_and_client rdma-ring-perf write lat -d rxe0 -p 18520 -a --max-size 4096 -n 300 -- \
    rdma-ring-perf write lat -d rxe0 -p 18520 -a --max-size 4096 -n 300 127.0.0.1
server_and_client rdma-ring-perf write lat -d rxe0 -p 18521 -n 300 -- \
    rdma-ring-perf write lat -d rxe0 -p 18521 -n 300 --async 127.0.0.1
server_and_client rdma-ring-perf write lat -d rxe0 -p 18522 -n 300 -- \
    rdma-ring-perf write lat -d rxe0 -p 18522 -n 300 --fixed 127.0.0.1
server_and_client rdma-ring-perf write lat -d rxe0 -p 18523 -n 300 -- \
    rdma-ring-perf write lat -d rxe0 -p 18523 -n 300 --fixed --async 127.0.0.1

for example in async_tokio async_smol async_block_on; do
    echo "==> [vm] $example on rxe0"
    # A stall fails within minutes, not at the VM's own time limit.
    timeout 300 "$examples/$example" --device rxe0
done
echo "==> [vm] device removal under an rdma_cm connection on rxe1 (last: it deletes rxe1)"
"$removal" --include-ignored --test-threads=1
for _ in $(seq 1 300); do
    rdma link show rxe1/1 >/dev/null 2>&1 || break
    sleep 0.1
done
if rdma link show rxe1/1 >/dev/null 2>&1; then
    echo "rxe1 was not removed after the process let go of it" >&2
    exit 1
fi
rdma link add rxe1 type rxe netdev dummy0
echo "==> [vm] all checks passed on rxe0 and rxe1"
