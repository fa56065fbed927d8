#!/usr/bin/env bash
# Runs inside the Soft-RoCE VM (see scripts/softroce), from the repository
# root: the verbs conformance suite and the examples on rxe0, then the
# device-removal test on rxe1 (last: it deletes rxe1). Its arguments are the
# conformance and device-removal test binaries, built on the host.
set -euo pipefail
conformance="$1"
removal="$2"
examples=target/debug/examples

echo "==> [vm] verbs conformance suite on rxe0"
RDMA_RING_DEVICE=rxe0 "$conformance" --include-ignored --test-threads=1

echo "==> [vm] quickstart on rxe0, one process"
"$examples/quickstart" --device rxe0

echo "==> [vm] quickstart on rxe0, two processes over the TCP handshake"
"$examples/quickstart" --device rxe0 --listen 127.0.0.1:7471 > /tmp/quickstart-b.log 2>&1 &
listener=$!
sleep 1
"$examples/quickstart" --device rxe0 --connect 127.0.0.1:7471
if ! wait "$listener"; then
    cat /tmp/quickstart-b.log
    echo "the listening quickstart failed" >&2
    exit 1
fi
cat /tmp/quickstart-b.log

echo "==> [vm] many_peers on rxe0: one server ring (one CQ, one SRQ) serving 64 clients"
"$examples/many_peers" --device rxe0

for example in async_tokio async_smol async_block_on; do
    echo "==> [vm] $example on rxe0"
    "$examples/$example" --device rxe0
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
