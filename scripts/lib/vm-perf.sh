#!/usr/bin/env bash
# Runs inside the Soft-RoCE VM (see scripts/perf): rdma-ring-perf beside
# perftest, both as server and client processes on rxe0 with the same
# knobs, each side several times, interleaved; medians and ratios.
set -euo pipefail
size="$1" batch="$2" depth="$3" iters="$4" lat_iters="$5"
ours=target/release/examples/rdma-ring-perf
rounds=3
. scripts/lib/vm-listen.sh

# pair LOG COMMAND...: COMMAND as the server, then as the client of
# 127.0.0.1; the client's output goes to LOG. Fails if either side does
# (a server left waiting for a failed client is stopped first, so the
# next pair finds its port free).
pair() {
    local log="$1"
    shift
    "$@" > /tmp/server.log 2>&1 &
    local server=$!
    if ! wait_for_listener "$server" "$(listen_port "$@")"; then
        stop_server "$server" /tmp/server.log
        return 1
    fi
    if ! "$@" 127.0.0.1 > "$log" 2>&1; then
        cat "$log"
        stop_server "$server" /tmp/server.log
        echo "the client side of '$*' failed" >&2
        return 1
    fi
    if ! wait "$server"; then
        cat /tmp/server.log
        echo "the server side of '$*' failed" >&2
        return 1
    fi
}

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# whole FILE...: every file holds one figure per round (a run whose figure
# could not be read must not leave a median of fewer, or an empty line
# sorted as 0).
whole() {
    local f
    for f in "$@"; do
        if [ "$(grep -cE '^[0-9]+(\.[0-9]+)?$' "$f")" -ne "$rounds" ] || [ "$(wc -l < "$f")" -ne "$rounds" ]; then
            echo "$f: expected $rounds figures, got: $(tr '\n' ' ' < "$f")" >&2
            cat /tmp/theirs.log /tmp/ours.log >&2
            exit 1
        fi
    done
}
runs() { tr '\n' ' ' < "$1"; }

# perftest's result lines: bw "#bytes #iterations BW-peak BW-average
# MsgRate[Mpps]"; lat "#bytes #iterations t_min t_max t_typical ...".
perftest_col() { awk -v size="$1" -v col="$2" '$1 == size && NF >= col { v = $col } END { print v }' /tmp/theirs.log; }
ours_json() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p" /tmp/ours.log | tail -n 1; }
# theirs COMMAND...: one perftest run, its figure (column 5) appended to
# /tmp/theirs.txt; run again, twice at most, when the figure is not a
# number (under a loaded host perftest can print `inf` for a latency).
theirs() {
    local try v
    for try in 1 2 3; do
        pair /tmp/theirs.log "$@"
        v="$(perftest_col "$bytes" 5)"
        if [[ "$v" =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
            break
        fi
        echo "perftest gave '$v' on try $try of '$*'" >&2
    done
    echo "$v" >> /tmp/theirs.txt
}

echo "rxe0 (TCG VM), two processes each; bw: size=$size post list=$batch depth=$depth CQE every $batch, $iters ops;"
echo "lat: size=$size, $lat_iters ops; WRITE/SEND up to 220 B inline on both sides; $rounds interleaved runs each, medians"
echo
printf '%-8s %-4s %-22s %12s %12s %12s %12s %12s %8s %8s %8s %8s\n' op test measure perftest ring ring-async ring-fixed fixed-async ratio async-ratio fixed-ratio fa-ratio
for op in write read send atomic; do
    case "$op" in
        write | send) pflags=(-s "$size" -I 220) ; oflags=(-s "$size" -I 220) ; bytes="$size" ;;
        read) pflags=(-s "$size") ; oflags=(-s "$size") ; bytes="$size" ;;
        atomic) pflags=(-A FETCH_AND_ADD) ; oflags=() ; bytes=8 ;;
    esac
    for test in bw lat; do
        : > /tmp/theirs.txt
        : > /tmp/ours.txt
        : > /tmp/async.txt
        : > /tmp/fixed.txt
        : > /tmp/fixed-async.txt
        for _ in $(seq "$rounds"); do
            if [ "$test" = bw ]; then
                theirs "ib_${op}_bw" -d rxe0 -x 1 -n "$iters" -t "$depth" -l "$batch" -Q "$batch" "${pflags[@]}" -F
                pair /tmp/ours.log "$ours" "$op" bw -d rxe0 -x 1 -p 18600 -n "$iters" -t "$depth" -l "$batch" -Q "$batch" "${oflags[@]}" --json
                ours_json mpps >> /tmp/ours.txt
                pair /tmp/ours.log "$ours" "$op" bw -d rxe0 -x 1 -p 18600 -n "$iters" -t "$depth" -Q "$batch" "${oflags[@]}" --json --async
                ours_json mpps >> /tmp/async.txt
                pair /tmp/ours.log "$ours" "$op" bw -d rxe0 -x 1 -p 18600 -n "$iters" -t "$depth" -l "$batch" -Q "$batch" "${oflags[@]}" --json --fixed
                ours_json mpps >> /tmp/fixed.txt
                pair /tmp/ours.log "$ours" "$op" bw -d rxe0 -x 1 -p 18600 -n "$iters" -t "$depth" -Q "$batch" "${oflags[@]}" --json --fixed --async
                ours_json mpps >> /tmp/fixed-async.txt
            else
                theirs "ib_${op}_lat" -d rxe0 -x 1 -n "$lat_iters" "${pflags[@]}" -F
                pair /tmp/ours.log "$ours" "$op" lat -d rxe0 -x 1 -p 18600 -n "$lat_iters" "${oflags[@]}" --json
                ours_json t_p50_us >> /tmp/ours.txt
                pair /tmp/ours.log "$ours" "$op" lat -d rxe0 -x 1 -p 18600 -n "$lat_iters" "${oflags[@]}" --json --async
                ours_json t_p50_us >> /tmp/async.txt
                pair /tmp/ours.log "$ours" "$op" lat -d rxe0 -x 1 -p 18600 -n "$lat_iters" "${oflags[@]}" --json --fixed
                ours_json t_p50_us >> /tmp/fixed.txt
                pair /tmp/ours.log "$ours" "$op" lat -d rxe0 -x 1 -p 18600 -n "$lat_iters" "${oflags[@]}" --json --fixed --async
                ours_json t_p50_us >> /tmp/fixed-async.txt
            fi
        done
        whole /tmp/theirs.txt /tmp/ours.txt /tmp/async.txt /tmp/fixed.txt /tmp/fixed-async.txt
        theirs="$(median < /tmp/theirs.txt)" mine="$(median < /tmp/ours.txt)" awaited="$(median < /tmp/async.txt)" fixed="$(median < /tmp/fixed.txt)" fixed_awaited="$(median < /tmp/fixed-async.txt)"
        if [ -z "$theirs" ] || [ -z "$mine" ] || [ -z "$awaited" ] || [ -z "$fixed" ] || [ -z "$fixed_awaited" ]; then
            echo "$op $test: could not read a figure (perftest '$theirs', ring '$mine', async '$awaited', fixed '$fixed', fixed async '$fixed_awaited')" >&2
            cat /tmp/theirs.log /tmp/ours.log >&2
            exit 1
        fi
        measure="Mpps (higher better)"
        [ "$test" = lat ] && measure="p50 us (lower better)"
        ratio() { awk -v a="$1" -v b="$theirs" 'BEGIN { printf "%.2f", a / b }'; }
        printf '%-8s %-4s %-22s %12s %12s %12s %12s %12s %8s %8s %8s %8s\n' "$op" "$test" "$measure" "$theirs" "$mine" "$awaited" "$fixed" "$fixed_awaited" "$(ratio "$mine")" "$(ratio "$awaited")" "$(ratio "$fixed")" "$(ratio "$fixed_awaited")"
        echo "         runs: perftest $(runs /tmp/theirs.txt)| ring $(runs /tmp/ours.txt)| async $(runs /tmp/async.txt)| fixed $(runs /tmp/fixed.txt)| fixed async $(runs /tmp/fixed-async.txt)"
    done
done
echo
echo "ratio = ring / perftest. Latency: WRITE and SEND latencies are half a ping-pong round trip on"
echo "both sides (each side WRITEs or SENDs the other's back); READ and atomics are round trips."

echo
echo "Awaited beside sync at depth 16, WRITE $size B, two processes on rxe0: the sync ring with one doorbell"
echo "per op (post list 1) against 16 tasks awaiting one WRITE at a time, doorbells coalesced (AsyncRing,"
echo "and the fixed-buffer ring's AsyncFixedRing)."
: > /tmp/ours.txt
: > /tmp/async.txt
: > /tmp/fixed-async.txt
for _ in $(seq "$rounds"); do
    pair /tmp/ours.log "$ours" write bw -d rxe0 -x 1 -p 18600 -n "$iters" -t 16 -l 1 -Q 16 -s "$size" -I 220 --json
    ours_json mpps >> /tmp/ours.txt
    pair /tmp/ours.log "$ours" write bw -d rxe0 -x 1 -p 18600 -n "$iters" -t 16 -Q 16 -s "$size" -I 220 --json --async --coalesce
    ours_json mpps >> /tmp/async.txt
    pair /tmp/ours.log "$ours" write bw -d rxe0 -x 1 -p 18600 -n "$iters" -t 16 -Q 16 -s "$size" -I 220 --json --fixed --async --coalesce
    ours_json mpps >> /tmp/fixed-async.txt
done
whole /tmp/ours.txt /tmp/async.txt /tmp/fixed-async.txt
sync1="$(median < /tmp/ours.txt)" coalesced="$(median < /tmp/async.txt)" fixed_coalesced="$(median < /tmp/fixed-async.txt)"
echo "sync, post list 1: $sync1 Mpps (runs: $(runs /tmp/ours.txt)); awaited, coalesced: $coalesced Mpps (runs: $(runs /tmp/async.txt)); ratio $(awk -v a="$coalesced" -v b="$sync1" 'BEGIN { printf "%.2f", a / b }')"
echo "fixed-buffer ring awaited, coalesced: $fixed_coalesced Mpps (runs: $(runs /tmp/fixed-async.txt)); ratio to sync $(awk -v a="$fixed_coalesced" -v b="$sync1" 'BEGIN { printf "%.2f", a / b }')"
