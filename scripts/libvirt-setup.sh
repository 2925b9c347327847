#!/bin/sh
# Prepare a real libvirtd + QEMU for vmsched's end-to-end tests.
#
# Idempotent; run as root on Debian 12 (no systemd needed):
#
#   scripts/libvirt-setup.sh [VENV]        # VENV defaults to $VENV, else .venv
#
# Steps (each skipped when already done):
#   1. install the Debian packages (no recommends; NOT libvirt-daemon-system,
#      which drags in systemd and udev); `apt-get update` only when needed
#   2. create the groups/user libvirtd expects (libvirt-qemu, kvm)
#   3. set user/group root, stdio_handler "file", security_driver "none" in
#      /etc/libvirt/qemu.conf, leaving every other setting alone
#   4. install libvirt-python into the venv if `import libvirt` fails
#   5. start `/usr/sbin/libvirtd -d` if it is not running, wait for its socket
#   6. warm the QEMU capability probe (~8 s once, then cached)
#
# State: $STATE_DIR/libvirtd.started holds "yes PID" when this script started
# libvirtd PID, "no PID" when libvirtd PID was already running (see
# scripts/libvirtd-state.sh).  The first run of a session decides; later runs
# (e.g. restarting a libvirtd a test killed) update the pid of "yes" only, so
# scripts/libvirt-teardown.sh stops libvirtd only when setup started it, and
# the tests that kill libvirtd run only then (they skip otherwise).
# Teardown removes the file.
#
# Environment: VMSCHED_TEST_STATE_DIR (default /run/vmsched-test),
# LIBVIRTD_START_TIMEOUT (seconds, default 20).
set -eu

log() { printf 'libvirt-setup: %s\n' "$*"; }
die() { printf 'libvirt-setup: ERROR: %s\n' "$*" >&2; exit 1; }

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
VENV_DIR=${1:-${VENV:-$ROOT/.venv}}
START_TIMEOUT=${LIBVIRTD_START_TIMEOUT:-20}
LIBVIRTD=/usr/sbin/libvirtd
SOCK=/run/libvirt/libvirt-sock
QEMU_CONF=/etc/libvirt/qemu.conf
# shellcheck source=scripts/libvirtd-state.sh
. "$HERE/libvirtd-state.sh"
PACKAGES="libvirt-daemon libvirt-daemon-driver-qemu qemu-system-x86 libvirt-clients libvirt-dev pkg-config"

[ "$(id -u)" = 0 ] || die "must run as root (uid is $(id -u))"

# --- 1. packages -----------------------------------------------------------
missing=""
for p in $PACKAGES; do
    st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    case "$st" in
        *"install ok installed"*) ;;
        *) missing="$missing $p" ;;
    esac
done
if [ -n "$missing" ]; then
    command -v apt-get >/dev/null 2>&1 || die "packages missing:$missing, and no apt-get on this machine"
    export DEBIAN_FRONTEND=noninteractive
    log "installing:$missing"
    APT="flock -o /tmp/vmsched-apt.lock apt-get -o DPkg::Lock::Timeout=600"
    # `apt-get update` only when the package lists are empty or the install fails; apt runs under
    # the lock scripts/apt-install takes (tests install packages in parallel)
    if ! ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1; then
        log "apt package lists are empty: apt-get update"
        $APT update -q >/dev/null || die "apt-get update failed"
    fi
    # shellcheck disable=SC2086
    if ! $APT install -y -q --no-install-recommends $missing >/dev/null; then
        log "install failed; retrying after apt-get update"
        $APT update -q >/dev/null || die "apt-get update failed"
        # shellcheck disable=SC2086
        $APT install -y -q --no-install-recommends $missing >/dev/null \
            || die "apt-get install$missing failed"
    fi
else
    log "packages present: $PACKAGES"
fi
[ -x "$LIBVIRTD" ] || die "$LIBVIRTD is missing after the install"

# --- 2. groups and user ----------------------------------------------------
for g in libvirt-qemu kvm; do
    if ! getent group "$g" >/dev/null; then
        groupadd --system "$g" || die "groupadd $g failed"
        log "created group $g"
    fi
done
if ! getent passwd libvirt-qemu >/dev/null; then
    useradd --system -g libvirt-qemu -M -d /var/lib/libvirt -s /usr/sbin/nologin libvirt-qemu \
        || die "useradd libvirt-qemu failed"
    log "created user libvirt-qemu"
fi

# --- 3. qemu.conf ----------------------------------------------------------
mkdir -p /etc/libvirt
[ -e "$QEMU_CONF" ] || : >"$QEMU_CONF"
conf_changed=no
set_conf() {  # set_conf KEY VALUE  (VALUE written verbatim, e.g. "\"root\"")
    key=$1 val=$2
    if grep -Eq "^[[:space:]]*$key[[:space:]]*=[[:space:]]*$val[[:space:]]*$" "$QEMU_CONF"; then
        return 0
    fi
    if grep -Eq "^[[:space:]]*$key[[:space:]]*=" "$QEMU_CONF"; then
        sed -i -E "s|^[[:space:]]*$key[[:space:]]*=.*$|$key = $val|" "$QEMU_CONF"
    else
        printf '%s = %s\n' "$key" "$val" >>"$QEMU_CONF"
    fi
    conf_changed=yes
    log "qemu.conf: $key = $val"
}
set_conf user '"root"'
set_conf group '"root"'
set_conf stdio_handler '"file"'
set_conf security_driver '"none"'

# --- 4. libvirt-python -----------------------------------------------------
PY=$VENV_DIR/bin/python
if [ -x "$PY" ]; then
    if "$PY" -c 'import libvirt' >/dev/null 2>&1; then
        log "libvirt-python present in $VENV_DIR"
    else
        log "installing libvirt-python into $VENV_DIR (compiles, ~10 s)"
        "$PY" -m pip install -q libvirt-python || die "pip install libvirt-python failed"
    fi
else
    log "no venv at $VENV_DIR: skipping libvirt-python"
fi

# --- 5. libvirtd -----------------------------------------------------------
# directories libvirt-daemon-system would normally create
mkdir -p /var/log/libvirt/qemu /var/lib/libvirt/qemu /var/cache/libvirt/qemu /run/libvirt "$STATE_DIR"

start_libvirtd() {
    log "starting $LIBVIRTD -d"
    # a stale pid file from a killed daemon makes libvirtd refuse to start
    rm -f "$PIDFILE"
    "$LIBVIRTD" -d || die "$LIBVIRTD -d failed (exit $?); see /var/log/libvirt/libvirtd.log"
    i=0
    until [ -n "$(running_pid)" ]; do  # -d returns once it has forked: wait for the daemon's pid file
        i=$((i + 1)); [ "$i" -le 100 ] || die "$LIBVIRTD -d returned but no libvirtd process appeared"
        sleep 0.05
    done
    record_started "$(running_pid)"
}

pid=$(running_pid)
if [ -n "$pid" ]; then
    if [ "$conf_changed" = yes ]; then
        log "WARNING: libvirtd (pid $pid) was already running; qemu.conf changes apply after its restart"
    fi
    record_found "$pid"
    if [ "$(state_owner)" = yes ] && [ "$(state_pid)" = "$pid" ]; then
        log "libvirtd already running (pid $pid, started by setup earlier in this session)"
    else
        log "libvirtd already running (pid $pid): not started by setup; it will be left running, and the tests that kill libvirtd skip"
    fi
else
    start_libvirtd
fi

# Wait for the socket to answer.  A daemon seen above may have been on its way
# out (SIGTERM takes a second or two): if it is gone, start a new one.
i=0
limit=$((START_TIMEOUT * 10))
until [ -S "$SOCK" ] && virsh -q -c qemu:///system uri >/dev/null 2>&1; do
    i=$((i + 1))
    [ "$i" -le "$limit" ] || die "libvirtd socket $SOCK did not answer within ${START_TIMEOUT}s"
    if [ -z "$(running_pid)" ]; then
        log "libvirtd exited before answering"
        start_libvirtd
    fi
    sleep 0.1
done
log "libvirtd answers on $SOCK (pid $(running_pid))"

# --- 6. capability probe ---------------------------------------------------
t0=$(date +%s)
virsh -c qemu:///system capabilities >/dev/null || die "virsh capabilities failed"
virsh -c qemu:///system domcapabilities --virttype qemu >/dev/null 2>&1 || true
log "QEMU capabilities ready ($(( $(date +%s) - t0 )) s)"
log "done (state: $STATE_FILE = $(cat "$STATE_FILE"))"
