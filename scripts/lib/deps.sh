# Installs what building rdma-ring needs on a Debian machine, if missing.
# Sourced by scripts/demo and scripts/test.

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

ensure_build_deps() {
    local packages="pkg-config libibverbs-dev librdmacm-dev libclang-dev"
    local missing=""
    for p in $packages; do
        dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        echo "==> installing build dependencies:$missing"
        as_root apt-get update -q
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing
    fi
    if ! command -v cargo >/dev/null 2>&1; then
        echo "error: cargo not found; install a Rust toolchain (rustup) first" >&2
        exit 1
    fi
}

ensure_cargo_fuzz() {
    if ! cargo fuzz --version >/dev/null 2>&1; then
        echo "==> installing cargo-fuzz"
        cargo install cargo-fuzz --locked
    fi
}

# What the Soft-RoCE VM needs: QEMU, a stock Debian kernel (its rdma_rxe
# module is Soft-RoCE), the rdma-core user space, and virtme-ng.
ensure_vm_deps() {
    local packages="qemu-system-x86 linux-image-amd64 rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest iproute2 kmod busybox-static"
    local missing=""
    for p in $packages; do
        dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        echo "==> installing Soft-RoCE VM packages:$missing"
        as_root apt-get update -q
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing
    fi
    if ! command -v vng >/dev/null 2>&1; then
        echo "==> installing virtme-ng"
        python3 -m pip install -q virtme-ng
    fi
}
