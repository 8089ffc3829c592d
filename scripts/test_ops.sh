# Install-and-operate checks (issue 24), sourced by scripts/test.sh; every step is its own
# function. Under CI=true (or RLARK_REQUIRE_TOOLS=1) a tool that is missing fails the step;
# elsewhere the step says SKIPPED and the run goes on.
#
#   ops_bases            the images' base layers (deploy/docker/make-base.sh), ahead of ops_images
#   ops_install_deps     promtool (Debian prometheus), debootstrap, systemd-analyze, setpriv,
#                        strip; helm-python-sdk (Helm's Go SDK, for crates/rlark/tests/e2e/deploy_helm.rs)
#   ops_systemd_units    deploy/install.sh into a temporary root; systemd-analyze verify
#   ops_raw_host         server and agent from the installed units, in a network namespace, as
#                        their ExecStart runs them (uid 65534, no capabilities), joined with
#                        the raw-host command `rlark token create` prints
#   ops_monitoring       promtool check/test rules; the dashboard's queries checked by
#                        promtool; every metric used is in ops_raw_host's scrapes
#   ops_build_info       rlark version and rlark_build_info name the checkout's commit and date
#   ops_images           the images of deploy/docker from the debug binary cargo test built
#                        (no second build): `up --demo --once` in the demo image, a server's
#                        /readyz from the runtime image, the printed Docker-host join command
#                        run with that image, the embodied image's sockets
#
# Uses ROOT and TARGET_DIR from scripts/test.sh.

OPS_WORK=""
command -v log >/dev/null 2>&1 || log() { printf '\n=== %s\n' "$*"; }

ops_tools_required() {
    [ "${CI:-}" = true ] || [ "${RLARK_REQUIRE_TOOLS:-}" = 1 ]
}

# ops_need STEP TOOL...: 0 when every TOOL is on PATH; else fail (CI) or skip.
ops_need() {
    local step=$1 tool missing=()
    shift
    for tool in "$@"; do
        command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || missing+=("$tool")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if ops_tools_required; then
        echo "$step: ${missing[*]} not installed (scripts/test_ops.sh ops_install_deps installs it)" >&2
        exit 1
    fi
    echo "SKIPPED: $step: ${missing[*]} not installed" >&2
    return 1
}

ops_install_deps() {
    [ "${RLARK_SKIP_INSTALL:-0}" = 1 ] && return 0
    local pkgs=()
    command -v promtool >/dev/null 2>&1 || pkgs+=(prometheus)
    command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || pkgs+=(debootstrap)
    command -v systemd-analyze >/dev/null 2>&1 || pkgs+=(systemd)
    command -v strip >/dev/null 2>&1 || pkgs+=(binutils)
    command -v setpriv >/dev/null 2>&1 || pkgs+=(util-linux)
    if [ ${#pkgs[@]} -gt 0 ]; then
        log "installing Debian packages for the install-and-operate checks: ${pkgs[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
        # The prometheus package starts no server here (no systemd); promtool is what we use.
    fi
    # Helm is not packaged by Debian; helm-python-sdk carries Helm v4's Go SDK (libhelm_c).
    python3 -m pip install -q --disable-pip-version-check 'helm-python-sdk==0.2.2' 'pyyaml>=6'
}

# The base images of deploy/docker (deploy/docker/make-base.sh: Debian packages, debootstrap,
# PyPI wheels; minutes on a fresh machine, mostly downloads), made by the background setup
# of scripts/test.sh while the compiler works; ops_images needs them. Nothing to do without
# an engine or debootstrap: ops_images then fails (CI) or skips and says why.
ops_bases() {
    docker version >/dev/null 2>&1 || return 0
    command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || return 0
    log "base images for deploy/docker (make-base.sh)"
    PATH=$PATH:/usr/sbin "$ROOT/deploy/docker/make-base.sh"
}

ops_workdir() {
    if [ -z "$OPS_WORK" ]; then
        OPS_WORK=$(mktemp -d /tmp/rlark-ops.XXXXXX)
        # The services run as uid 65534 and read their config under it.
        chmod 0755 "$OPS_WORK"
    fi
}

ops_systemd_units() {
    log "systemd units: deploy/install.sh into a temporary root, systemd-analyze verify"
    ops_need ops_systemd_units systemd-analyze || return 0
    ops_workdir
    local root=$OPS_WORK/root unit out
    rm -rf "$root"
    "$ROOT/deploy/install.sh" --destdir "$root" --binary "$TARGET_DIR/debug/rlark" server
    "$ROOT/deploy/install.sh" --destdir "$root" --binary "$TARGET_DIR/debug/rlark" embodied
    "$ROOT/deploy/install.sh" --destdir "$root" --binary "$TARGET_DIR/debug/rlark" agent \
        --server https://127.0.0.1:8443 --cluster-id ops --token placeholder.token --ca-hash sha256:00
    # verify --root resolves the units' dependencies (multi-user.target, ...) under the root.
    mkdir -p "$root/usr/lib/systemd"
    cp -a /usr/lib/systemd/system "$root/usr/lib/systemd/"
    for unit in rlark-server rlark-agent rlark-embodied; do
        # Any message (an unknown key, a missing binary) fails, not only the exit code.
        if ! out=$(systemd-analyze verify --root="$root" "$root/etc/systemd/system/$unit.service" 2>&1) || [ -n "$out" ]; then
            echo "systemd-analyze verify $unit.service:" >&2
            echo "$out" >&2
            exit 1
        fi
        echo "$unit.service: verified; $(systemd-analyze security --offline=yes --root="$root" \
            "$root/etc/systemd/system/$unit.service" 2>/dev/null | tail -1 | sed 's/^→ //')"
    done
}

# Run a unit's ExecStart as systemd would (scripts/unit_exec.py), in the network namespace,
# as uid/gid 65534 with no capabilities and no_new_privs (DynamicUser=, User= with
# CapabilityBoundingSet= and NoNewPrivileges=). Prints the pid.
ops_run_unit() {
    local ns=$1 unit=$2 state=$3 log=$4
    shift 4
    local argv=()
    mapfile -d '' argv < <(python3 "$ROOT/scripts/unit_exec.py" "$OPS_WORK/root/etc/systemd/system/$unit.service" \
        --root "$OPS_WORK/root" "STATE_DIRECTORY=$state" "$@")
    install -d -o 65534 -g 65534 -m 0700 "$state"
    # EnvironmentFile= is the process's environment too (RLARK_JOIN_TOKEN is read from it).
    local env_file=/dev/null
    [ "${1:-}" = --env-file ] && env_file=$2
    (set -a && . "$env_file" && set +a && cd / && exec ip netns exec "$ns" setpriv --reuid=65534 --regid=65534 --clear-groups \
        --inh-caps=-all --bounding-set=-all --no-new-privs "${argv[@]}") >"$log" 2>&1 &
    echo $!
}

ops_raw_host() (
    log "raw host: server and agent from the installed units in a network namespace, joined by the printed command"
    ops_need ops_raw_host ip setpriv curl python3 || exit 0
    if [ -z "$OPS_WORK" ] || [ ! -d "$OPS_WORK/root" ]; then
        ops_tools_required && { echo "ops_raw_host: ops_systemd_units did not install the units" >&2; exit 1; }
        echo "SKIPPED: ops_raw_host: no installed units (ops_systemd_units skipped)" >&2
        exit 0
    fi
    ns=rlark-ops-$$
    pids=()
    cleanup() {
        local pid
        for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill "$pid" 2>/dev/null || true; done
        sleep 1
        ip netns del "$ns" 2>/dev/null || true
    }
    trap cleanup EXIT
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    in_ns() { ip netns exec "$ns" "$@"; }
    state=$OPS_WORK/state
    rm -rf "$state" && mkdir -p "$state"
    pids+=("$(ops_run_unit "$ns" rlark-server "$state/rlark" "$OPS_WORK/server.log")")
    ready=""
    for _ in $(seq 1 60); do
        if [ "$(in_ns curl -sk https://127.0.0.1:8443/readyz)" = ok ]; then ready=1; break; fi
        sleep 0.5
    done
    [ -n "$ready" ] || { cat "$OPS_WORK/server.log" >&2; echo "the server's /readyz never answered ok" >&2; exit 1; }
    echo "server (uid 65534, no capabilities): /readyz ok"
    kubeconfig=$state/rlark/admin.kubeconfig
    in_ns "$TARGET_DIR/debug/rlark" token create --cluster-id raw-1 --kubeconfig "$kubeconfig" >"$OPS_WORK/token.txt"
    join=$(grep -A1 '^Raw host' "$OPS_WORK/token.txt" | tail -1)
    case "$join" in ./deploy/install.sh\ agent\ *) ;; *) cat "$OPS_WORK/token.txt" >&2; echo "no raw-host command printed" >&2; exit 1 ;; esac
    # The printed command, as printed, plus where to install (a temporary root, not /).
    (cd "$ROOT" && eval "$join --destdir \"\$OPS_WORK/root\" --binary \"\$TARGET_DIR/debug/rlark\"")
    pids+=("$(ops_run_unit "$ns" rlark-agent "$state/rlark-agent" "$OPS_WORK/agent.log" \
        --env-file "$OPS_WORK/root/etc/rlark/agent.env")")
    online=""
    for _ in $(seq 1 60); do
        if in_ns "$TARGET_DIR/debug/rlark" get nodes -n rlark-raw-1 --kubeconfig "$kubeconfig" 2>/dev/null | grep -q ' Online '; then
            online=1; break
        fi
        sleep 0.5
    done
    [ -n "$online" ] || { cat "$OPS_WORK/agent.log" >&2; echo "the agent's node never came Online" >&2; exit 1; }
    echo "agent (uid 65534, no capabilities) joined with the printed command: node Online in rlark-raw-1"
    # Scrapes for ops_monitoring: the server's /metrics (admin certificate) and the agent's.
    sleep 1
    in_ns curl -sfk --cert "$state/rlark/pki/admin.crt" --key "$state/rlark/pki/admin.key" \
        https://127.0.0.1:8443/metrics >"$OPS_WORK/server.metrics"
    in_ns curl -sf http://127.0.0.1:9101/metrics >"$OPS_WORK/agent.metrics"
    grep -q '^rlark_nodes{phase="Online"} 1$' "$OPS_WORK/server.metrics" || {
        # The node gauges are recounted every 15 s: wait for the next count once.
        sleep 16
        in_ns curl -sfk --cert "$state/rlark/pki/admin.crt" --key "$state/rlark/pki/admin.key" \
            https://127.0.0.1:8443/metrics >"$OPS_WORK/server.metrics"
    }
    for want in '^rlark_nodes{phase="Online"} 1$' '^rlark_build_info{version="' '^process_resident_memory_bytes ' \
        '^rlark_certificate_expiry_timestamp_seconds{certificate="serving"} '; do
        grep -q "$want" "$OPS_WORK/server.metrics" || { echo "server /metrics lacks $want" >&2; exit 1; }
    done
    grep -q '^rlark_agent_tunnel_connected 1$' "$OPS_WORK/agent.metrics" ||
        { echo "agent /metrics: no connected tunnel" >&2; exit 1; }
    echo "metrics scraped: server $(grep -vc '^#' "$OPS_WORK/server.metrics") samples, agent $(grep -vc '^#' "$OPS_WORK/agent.metrics")"
)

ops_monitoring() {
    log "monitoring: promtool check/test rules, the dashboard's queries, every metric exported"
    ops_need ops_monitoring promtool python3 || return 0
    if [ ! -s "$OPS_WORK/server.metrics" ] || [ ! -s "$OPS_WORK/agent.metrics" ]; then
        ops_tools_required && { echo "ops_monitoring: no scrapes from ops_raw_host" >&2; exit 1; }
        echo "SKIPPED: ops_monitoring: no scrapes (ops_raw_host skipped)" >&2
        return 0
    fi
    promtool check rules "$ROOT/deploy/monitoring/rlark-alerts.yaml"
    (cd "$ROOT/deploy/monitoring" && promtool test rules rlark-alerts.test.yaml)
    python3 "$ROOT/scripts/check_monitoring.py" "$OPS_WORK/server.metrics" "$OPS_WORK/agent.metrics"
}

ops_images() (
    log "images: bases from Debian packages, images from the debug binary, up --demo --once inside"
    ops_need ops_images docker debootstrap strip || exit 0
    if ! docker version >/dev/null 2>&1; then
        ops_tools_required && { echo "ops_images: no Docker engine answers" >&2; exit 1; }
        echo "SKIPPED: ops_images: no Docker engine answers" >&2
        exit 0
    fi
    "$ROOT/deploy/docker/make-base.sh"
    ctx=$(mktemp -d)
    cid=""
    trap '{ [ -z "$cid" ] || docker rm -f "$cid"; } >/dev/null 2>&1 || true; rm -rf "$ctx"' EXIT
    # The binary cargo test built, without its symbols: no second (release) build here.
    mkdir -p "$ctx/bin" "$ctx/state/rlark" "$ctx/state/rlark-agent" "$ctx/examples/embodied"
    strip -o "$ctx/bin/rlark" "$TARGET_DIR/debug/rlark"
    strip -o "$ctx/bin/rlark-supervise" "$TARGET_DIR/debug/rlark-supervise"
    cp "$ROOT/examples/embodied/sim.yaml" "$ctx/examples/embodied/"
    bases=(--build-arg RUNTIME_BASE=rlark-base-cc:bookworm --build-arg DEMO_BASE=rlark-base-python:bookworm)
    docker build -q -f "$ROOT/deploy/docker/Dockerfile" --target prebuilt "${bases[@]}" -t rlark:ops-test "$ctx" >"$ctx/build.log" 2>&1 || { cat "$ctx/build.log" >&2; exit 1; }
    docker build -q -f "$ROOT/deploy/docker/Dockerfile" --target prebuilt-demo "${bases[@]}" -t rlark-demo:ops-test "$ctx" >"$ctx/build.log" 2>&1 || { cat "$ctx/build.log" >&2; exit 1; }
    docker build -q -f "$ROOT/deploy/docker/embodied.Dockerfile" --target prebuilt "${bases[@]}" -t rlark-embodied:ops-test "$ctx" >"$ctx/build.log" 2>&1 || { cat "$ctx/build.log" >&2; exit 1; }
    docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep ':ops-test '

    # The demo: a whole platform in one container, as a user runs it.
    if ! timeout 300 docker run --rm rlark-demo:ops-test up --demo --once >"$ctx/demo.log" 2>&1; then
        tail -40 "$ctx/demo.log" >&2
        echo "docker run rlark-demo:ops-test up --demo --once failed" >&2
        exit 1
    fi
    grep -E '^Workflow demo Succeeded|^Learned:' "$ctx/demo.log"

    # The runtime image (no shell, uid 65532): a server answering /readyz through a port.
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    cid=$(docker run -d -p "127.0.0.1:$port:8443" rlark:ops-test server --listen 0.0.0.0:8443)
    ready=""
    for _ in $(seq 1 60); do
        if [ "$(curl -sk "https://127.0.0.1:$port/readyz")" = ok ]; then ready=1; break; fi
        sleep 0.5
    done
    [ -n "$ready" ] || { docker logs "$cid" >&2; echo "the server in rlark:ops-test never became ready" >&2; exit 1; }
    [ "$(docker inspect -f '{{.Config.User}}' rlark:ops-test)" = 65532:65532 ] ||
        { echo "rlark:ops-test does not run as 65532" >&2; exit 1; }
    docker rm -f "$cid" >/dev/null
    echo "rlark:ops-test: server /readyz ok as uid 65532"

    # The Docker-host join command `rlark token create` prints, run as printed but for the
    # image tag (rlark:ops-test for rlark:VERSION) and a container and volume name of this run;
    # the agent in the container joins a server on this host's loopback (--network host).
    data=$(mktemp -d -p "$ctx")
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$TARGET_DIR/debug/rlark" server --data-dir "$data" --listen "127.0.0.1:$port" >"$ctx/server.log" 2>&1 &
    server_pid=$!
    # (Every command of an EXIT trap must succeed: under set -e a failing one sets the status.)
    trap '{ [ -z "$cid" ] || docker rm -f "$cid"; kill "$server_pid"; docker rm -f "rlark-agent-ops-$$"
            docker volume rm "rlark-agent-ops-$$"; } >/dev/null 2>&1 || true; rm -rf "$ctx"' EXIT
    for _ in $(seq 1 60); do [ -s "$data/admin.kubeconfig" ] && break; sleep 0.5; done
    "$TARGET_DIR/debug/rlark" token create --cluster-id dock-1 --kubeconfig "$data/admin.kubeconfig" >"$ctx/token.txt"
    join=$(grep -A1 '^Docker host' "$ctx/token.txt" | tail -1)
    version=$("$TARGET_DIR/debug/rlark" version --client -o json |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"][1:])')
    case "$join" in "docker run -d --name rlark-agent "*" rlark:$version agent "*) ;;
        *) cat "$ctx/token.txt" >&2; echo "no Docker-host command printed" >&2; exit 1 ;; esac
    join=${join//rlark:$version /rlark:ops-test }
    join=${join//--name rlark-agent /--name rlark-agent-ops-$$ }
    join=${join//-v rlark-agent:/-v rlark-agent-ops-$$:}
    eval "$join" >/dev/null
    online=""
    for _ in $(seq 1 60); do
        if "$TARGET_DIR/debug/rlark" get nodes -n rlark-dock-1 --kubeconfig "$data/admin.kubeconfig" 2>/dev/null | grep -q ' Docker .* Online '; then
            online=1; break
        fi
        sleep 0.5
    done
    [ -n "$online" ] || { docker logs "rlark-agent-ops-$$" >&2; echo "the Docker-host agent never came Online" >&2; exit 1; }
    docker rm -f "rlark-agent-ops-$$" >/dev/null
    docker volume rm "rlark-agent-ops-$$" >/dev/null
    kill "$server_pid"
    echo "Docker host: the printed docker run joined (agent type Docker, node Online)"

    # The embodied image: the simulated arm and camera serve their sockets.
    sockets=$(mktemp -d -p "$ctx")
    cid=$(docker run -d -v "$sockets:/run/rlark" rlark-embodied:ops-test)
    for _ in $(seq 1 40); do
        [ -S "$sockets/ros-ctrl.sock" ] && [ -S "$sockets/camera-ctrl.sock" ] && break
        sleep 0.5
    done
    [ -S "$sockets/ros-ctrl.sock" ] && [ -S "$sockets/camera-ctrl.sock" ] ||
        { docker logs "$cid" >&2; echo "rlark-embodied:ops-test served no sockets" >&2; exit 1; }
    docker rm -f "$cid" >/dev/null
    cid=""
    echo "rlark-embodied:ops-test: ros-ctrl.sock and camera-ctrl.sock served"
)

# The build information the binary carries (crates/rlark-cli/build.rs): the checkout's commit,
# and the date of SOURCE_DATE_EPOCH or else of that commit, in `rlark version` and in every
# process's rlark_build_info (the scrape of ops_raw_host).
ops_build_info() {
    log "build info: rlark version and rlark_build_info name the commit and its date"
    ops_need ops_build_info git python3 || return 0
    local commit epoch info
    commit=$(git -C "$ROOT" rev-parse HEAD)
    epoch=${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct)}
    info=$("$TARGET_DIR/debug/rlark" version --client -o json)
    python3 - "$commit" "$epoch" "$info" <<'PY'
import datetime, json, sys
commit, epoch, info = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])["clientVersion"]
date = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
if info["gitCommit"] != commit or info["buildDate"] != date:
    sys.exit(f"rlark version says {info['gitCommit']} {info['buildDate']}; the checkout is {commit} {date} "
             "(a binary built before the last commit? rebuild)")
print(f"rlark version: commit {commit[:12]}, built {date}")
PY
    if [ -s "$OPS_WORK/server.metrics" ]; then
        grep -q "^rlark_build_info{version=\"[^\"]*\",commit=\"$commit\",date=\"" "$OPS_WORK/server.metrics" ||
            { grep rlark_build_info "$OPS_WORK/server.metrics" >&2; echo "rlark_build_info does not name $commit" >&2; exit 1; }
        echo "rlark_build_info names the same commit"
    fi
}

ops_checks() {
    ops_workdir
    ops_systemd_units
    ops_raw_host
    ops_monitoring
    ops_build_info
    ops_images
    rm -rf "$OPS_WORK"
    OPS_WORK=""
}
