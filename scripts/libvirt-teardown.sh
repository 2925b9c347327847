#!/bin/sh
# Undo what scripts/libvirt-setup.sh and the end-to-end tests left behind.
#
#   scripts/libvirt-teardown.sh
#
#   1. destroy and undefine every guest named vmsched-e2e-* (only those)
#   2. remove /etc/libvirt/hooks/qemu if the tests installed it (marker
#      $STATE_DIR/hook.installed) and it is still vmsched's hook
#   3. stop libvirtd only if setup started it ($STATE_DIR/libvirtd.started
#      says "yes PID" and PID is the libvirtd running now); a libvirtd that was
#      running before is left running.  Prints exactly what it stopped or left.
#
# Packages, users and qemu.conf settings are kept (they are harmless and make
# the next run fast).
set -eu

log() { printf 'libvirt-teardown: %s\n' "$*"; }
die() { printf 'libvirt-teardown: ERROR: %s\n' "$*" >&2; exit 1; }

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/libvirtd-state.sh
. "$HERE/libvirtd-state.sh"
HOOK_MARK=$STATE_DIR/hook.installed
HOOK=/etc/libvirt/hooks/qemu
SOCK=/run/libvirt/libvirt-sock
PREFIX=vmsched-e2e-

[ "$(id -u)" = 0 ] || die "must run as root (uid is $(id -u))"

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
if [ "$(state_owner)" != yes ] && [ -n "$pid" ] && [ "$hook_removed" = yes ]; then
    log "NOTE: libvirtd (pid $pid) still caches the removed hook until it is restarted"
fi
report=$(teardown_libvirtd) || { log "$report"; exit 1; }
log "$report"
rmdir "$STATE_DIR" 2>/dev/null || true
log "done"
