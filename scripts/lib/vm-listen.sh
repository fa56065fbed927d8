# Sourced by the scripts that run inside the Soft-RoCE VM.
#
# A server started in the background is waited for until it listens, not for
# a fixed time: under TCG a server that opens a device and registers its
# buffers before it binds can take longer than a second, and its client then
# found nothing to connect to.

# listen_port ARGS...: the port a server command line listens on: the port
# of --listen ADDR:PORT, else the value of -p, else perftest's 18515.
listen_port() {
    local previous="" arg
    for arg in "$@"; do
        case "$previous" in
            --listen) echo "${arg##*:}"; return ;;
            -p) echo "$arg"; return ;;
        esac
        previous="$arg"
    done
    echo 18515
}

# stop_server PID LOG: stops a server (one never seen listening, or whose
# client failed) and shows its log on standard error.
stop_server() {
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    {
        echo "--- the server's log:"
        cat "$2"
    } >&2
}

# report_failed_client NAME PID: shows the log of NAME's client, which
# failed, stops its server PID (which may wait for ever for clients that
# never came) and prints FAILED.
report_failed_client() {
    echo "--- $1 client (failed):" >&2
    cat /tmp/client.log >&2
    stop_server "$2" /tmp/server.log
    echo "FAILED"
}

# wait_for_listener PID PORT: returns once something listens on PORT, as a
# TCP socket (ss) or as an rdma_cm identifier (rdma resource), or once
# process PID has exited (its caller's wait then reports it). Fails after
# 120 s.
wait_for_listener() {
    local pid="$1" port="$2"
    for _ in $(seq 1 1200); do
        if [ -n "$(ss -Hltn "sport = :$port")" ]; then
            return 0
        fi
        # Captured first: `grep -q` stopping early could fail the pipe.
        local ids
        ids="$(rdma resource show cm_id 2>/dev/null || true)"
        if grep -q "state LISTEN .*src-addr [^ ]*:$port " <<< "$ids"; then
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    echo "nothing listened on port $port within 120 s of starting its server" >&2
    return 1
}
