#!/bin/sh
# Undo what scripts/libvirt-setup.sh and the end-to-end tests left behind.
#
#   scripts/libvirt-teardown.sh
#
#   1. destroy and undefine every guest named vmsched-e2e-* (only those)
#   2. remove /etc/libvirt/hooks/qemu if the tests installed it (marker
#      $STATE_DIR/hook.installed) and it is still vmsched's hook
#   3. stop libvirtd only if setup started it ($STATE_DIR/libvirtd.started
#      says "yes"); a libvirtd that was running before is left running
#
# Packages, users and qemu.conf settings are kept (they are harmless and make
# the next run fast).
set -eu

log() { printf 'libvirt-teardown: %s\n' "$*"; }
die() { printf 'libvirt-teardown: ERROR: %s\n' "$*" >&2; exit 1; }

STATE_DIR=${VMSCHED_TEST_STATE_DIR:-/run/vmsched-test}
STATE_FILE=$STATE_DIR/libvirtd.started
HOOK_MARK=$STATE_DIR/hook.installed
HOOK=/etc/libvirt/hooks/qemu
PIDFILE=/run/libvirtd.pid
SOCK=/run/libvirt/libvirt-sock
PREFIX=vmsched-e2e-

[ "$(id -u)" = 0 ] || die "must run as root (uid is $(id -u))"

running_pid() {
    if [ -r "$PIDFILE" ]; then
        pid=$(cat "$PIDFILE" 2>/dev/null || true)
        if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = libvirtd ]; then
            echo "$pid"; return 0
        fi
    fi
    for d in /proc/[0-9]*; do
        if [ "$(cat "$d/comm" 2>/dev/null)" = libvirtd ] && ! grep -q '^State:[[:space:]]*Z' "$d/status" 2>/dev/null; then
            echo "${d#/proc/}"; return 0
        fi
    done
}

pid=$(running_pid)

# --- 1. test guests --------------------------------------------------------
if [ -n "$pid" ] && [ -S "$SOCK" ]; then
    n=0
    for dom in $(virsh -q -c qemu:///system list --all --name 2>/dev/null | grep "^$PREFIX" || true); do
        virsh -q -c qemu:///system destroy "$dom" >/dev/null 2>&1 || true
        virsh -q -c qemu:///system undefine "$dom" >/dev/null 2>&1 \
            || log "WARNING: could not undefine $dom"
        n=$((n + 1))
    done
    log "removed $n test guest(s) ($PREFIX*)"
else
    log "libvirtd not running: no guests to remove"
fi

# --- 2. hook ---------------------------------------------------------------
hook_removed=no
if [ -e "$HOOK_MARK" ]; then
    if [ -e "$HOOK" ] && grep -q 'vmsched policy agent' "$HOOK" 2>/dev/null; then
        rm -f "$HOOK"
        hook_removed=yes
        log "removed $HOOK"
    fi
    rm -f "$HOOK_MARK"
fi

# --- 3. libvirtd -----------------------------------------------------------
started=$(cat "$STATE_FILE" 2>/dev/null || echo no)
if [ "$started" = yes ]; then
    if [ -n "$pid" ]; then
        log "stopping libvirtd (pid $pid), which setup started"
        kill -TERM "$pid" 2>/dev/null || true
        i=0
        while [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = libvirtd ]; do
            i=$((i + 1))
            if [ "$i" -eq 100 ]; then
                log "libvirtd ignored SIGTERM for 10 s: SIGKILL"
                kill -KILL "$pid" 2>/dev/null || true
            fi
            [ "$i" -le 150 ] || die "libvirtd (pid $pid) did not exit"
            sleep 0.1
        done
        log "libvirtd stopped"
    else
        log "libvirtd (started by setup) is no longer running"
    fi
else
    if [ -n "$pid" ] && [ "$hook_removed" = yes ]; then
        log "NOTE: libvirtd (pid $pid) predates setup and was left running; it still caches the removed hook until restarted"
    fi
    log "libvirtd was not started by setup: left as it is"
fi
rm -f "$STATE_FILE"
rmdir "$STATE_DIR" 2>/dev/null || true
log "done"
