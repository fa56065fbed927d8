# Installs what rdma-ring's scripts need on a Debian machine, if missing.
# Sourced by scripts/demo, scripts/test, scripts/softroce and scripts/perf.

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        echo "error: installing packages needs root: run as root, or install sudo" >&2
        exit 1
    fi
}

# ensure_packages WHAT PACKAGE...: installs the Debian packages not yet there.
ensure_packages() {
    local what="$1"
    shift
    local missing=""
    for p in "$@"; do
        # `dpkg -s` also succeeds for a package removed but not purged.
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
            missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        echo "==> installing $what:$missing"
        as_root apt-get update -q
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing
    fi
}

ensure_build_deps() {
    # Checked first: without a toolchain nothing can be built, and the
    # machine is left as it was.
    if ! command -v cargo >/dev/null 2>&1; then
        echo "error: cargo not found; install a Rust toolchain (rustup) first" >&2
        exit 1
    fi
    # gcc and libc6-dev: the linker and C runtime rustc links with, which
    # a rustup-only machine lacks.
    ensure_packages "build dependencies" gcc libc6-dev pkg-config libibverbs-dev librdmacm-dev libclang-dev
}

# rustfmt and clippy, which a minimal rustup profile leaves out.
ensure_lint_tools() {
    if { ! cargo fmt --version || ! cargo clippy --version; } >/dev/null 2>&1; then
        if command -v rustup >/dev/null 2>&1; then
            rustup component add rustfmt clippy
        else
            echo "error: cargo fmt or cargo clippy is missing, and there is no rustup to add them" >&2
            exit 1
        fi
    fi
}

# What the Soft-RoCE VM needs: QEMU, a stock Debian kernel (its rdma_rxe
# module is Soft-RoCE), the rdma-core user space, and virtme-ng.
ensure_vm_deps() {
    ensure_packages "Soft-RoCE VM packages" qemu-system-x86 linux-image-amd64 rdma-core ibverbs-providers \
        ibverbs-utils rdmacm-utils perftest iproute2 kmod busybox-static python3 python3-pip
    # vng runs virtme-run from PATH: put pip's script directory first, so
    # both are found whatever wraps python3 (pyenv shims need a rehash).
    local scripts
    scripts="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
    export PATH="$scripts:$PATH"
    if ! command -v vng >/dev/null 2>&1 || ! command -v virtme-run >/dev/null 2>&1; then
        echo "==> installing virtme-ng"
        python3 -m pip install -q virtme-ng || python3 -m pip install -q --break-system-packages virtme-ng
        if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
    fi
}

ensure_cargo_fuzz() {
    # libfuzzer-sys compiles libFuzzer's C++.
    ensure_packages "fuzzing build tools" g++ make
    if ! cargo fuzz --version >/dev/null 2>&1; then
        echo "==> installing cargo-fuzz"
        cargo install cargo-fuzz --locked
    fi
}

# valgrind, for instruction counts (callgrind).
ensure_valgrind() {
    ensure_packages "valgrind (instruction counts)" valgrind
}
