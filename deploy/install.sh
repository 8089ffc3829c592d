#!/bin/sh
# Install rlark on a host: the binary, the systemd units, their configuration, and start
# them. No download: run it from this release's source tree (or an unpacked release) with
# the binary built (target/release/rlark) or given with --binary.
#
#   deploy/install.sh [OPTIONS] server
#   deploy/install.sh [OPTIONS] agent --server URL --cluster-id ID [--token T --ca-hash H] [--agent-type raw|docker]
#   deploy/install.sh [OPTIONS] embodied [--config FILE]
#
# Options:
#   --binary PATH   the rlark binary (default: target/release/rlark, else rlark on PATH);
#                   rlark-supervise beside it is installed too
#   --prefix DIR    where bin/rlark goes (default /usr/local); the units are rewritten to it
#   --destdir DIR   install under DIR (packaging, tests); implies --no-start
#   --no-start      do not run systemctl (daemon-reload, enable --now)
#
# What it writes: PREFIX/bin/rlark, PREFIX/share/doc/rlark/operations.md, /etc/systemd/system/rlark-COMPONENT.service,
# /usr/lib/sysusers.d/rlark.conf (agent), /etc/rlark/server.yaml (server; kept if present),
# /etc/rlark/agent.env (agent; 0600, replaced), /etc/rlark/embodied.yaml (embodied; kept if
# present, else --config or the simulated example).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
tree=$(dirname "$here")
binary=""
prefix=/usr/local
destdir=""
start=1
component=""
server="" cluster_id="" token="" ca_hash="" agent_type=raw embodied_config=""

die() { echo "install.sh: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary=$2; shift 2 ;;
        --prefix) prefix=$2; shift 2 ;;
        --destdir) destdir=$2; start=0; shift 2 ;;
        --no-start) start=0; shift ;;
        --server) server=$2; shift 2 ;;
        --cluster-id) cluster_id=$2; shift 2 ;;
        --token) token=$2; shift 2 ;;
        --ca-hash) ca_hash=$2; shift 2 ;;
        --agent-type) agent_type=$2; shift 2 ;;
        --config) embodied_config=$2; shift 2 ;;
        server|agent|embodied) [ -z "$component" ] || die "one component at a time"; component=$1; shift ;;
        -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
[ -n "$component" ] || die "name a component: server, agent or embodied (see --help)"

if [ -z "$binary" ]; then
    if [ -x "$tree/target/release/rlark" ]; then
        binary=$tree/target/release/rlark
    else
        binary=$(command -v rlark) || die "no rlark binary: build it (cargo build --release) or pass --binary"
    fi
fi
[ -x "$binary" ] || die "$binary is not an executable"

if [ "$component" = agent ]; then
    [ -n "$server" ] || die "agent: --server URL is required"
    [ -n "$cluster_id" ] || die "agent: --cluster-id ID is required"
    if [ -n "$token" ] && [ -z "$ca_hash" ]; then die "agent: --token needs --ca-hash"; fi
    case "$agent_type" in raw|docker) ;; *) die "agent: --agent-type is raw or docker (Kubernetes: the Helm chart)" ;; esac
fi

bindir=$prefix/bin
unitdir=$destdir/etc/systemd/system
confdir=$destdir/etc/rlark
umask 022
install -d "$destdir$bindir" "$unitdir" "$confdir"
install -m 0755 "$binary" "$destdir$bindir/rlark"
supervise=$(dirname "$binary")/rlark-supervise
[ -x "$supervise" ] && install -m 0755 "$supervise" "$destdir$bindir/rlark-supervise"
docdir=$prefix/share/doc/rlark
install -d "$destdir$docdir"
install -m 0644 "$tree/docs/operations.md" "$destdir$docdir/operations.md"
sed -e "s|/usr/local/bin/rlark|$bindir/rlark|g" -e "s|/usr/local/share/doc/rlark|$docdir|g" \
    "$here/systemd/rlark-$component.service" >"$unitdir/rlark-$component.service"
chmod 0644 "$unitdir/rlark-$component.service"

case "$component" in
    server)
        if [ ! -e "$confdir/server.yaml" ]; then
            cat >"$confdir/server.yaml" <<'YAML'
# rlark server configuration (docs/operations.md). The data directory is the unit's
# StateDirectory (/var/lib/rlark).
listen: 0.0.0.0:8443
# Names and addresses agents and users reach this server by (the serving certificate's).
tlsSans: []
YAML
        fi
        ;;
    agent)
        install -d "$destdir/usr/lib/sysusers.d"
        install -m 0644 "$here/systemd/rlark.sysusers" "$destdir/usr/lib/sysusers.d/rlark.conf"
        flags=""
        [ -n "$ca_hash" ] && flags="--ca-hash=$ca_hash"
        (
            umask 077
            {
                echo "# rlark-agent.service; written by deploy/install.sh"
                echo "RLARK_SERVER=$server"
                echo "RLARK_CLUSTER_ID=$cluster_id"
                echo "RLARK_AGENT_TYPE=$agent_type"
                # Used at the first start only (the agent keeps its identity); it expires.
                [ -n "$token" ] && echo "RLARK_JOIN_TOKEN=$token"
                echo "RLARK_AGENT_FLAGS=$flags"
            } >"$confdir/agent.env.tmp"
            mv "$confdir/agent.env.tmp" "$confdir/agent.env"
        )
        ;;
    embodied)
        if [ ! -e "$confdir/embodied.yaml" ]; then
            install -m 0644 "${embodied_config:-$tree/examples/embodied/sim.yaml}" "$confdir/embodied.yaml"
        fi
        ;;
esac

echo "installed rlark $("$destdir$bindir/rlark" version --client 2>/dev/null | sed -n 's/^Client Version: //p') as $destdir$bindir/rlark, unit rlark-$component.service"
if [ "$start" = 1 ]; then
    [ "$component" = agent ] && systemd-sysusers rlark.conf
    systemctl daemon-reload
    systemctl enable --now "rlark-$component.service"
    echo "started: systemctl status rlark-$component; journalctl -u rlark-$component"
fi
