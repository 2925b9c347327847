# shellcheck shell=sh
# Who owns the libvirtd the end-to-end tests use: sourced by libvirt-setup.sh
# and libvirt-teardown.sh (and by tests/cli/test_libvirt_scripts.py, which runs
# these functions against a stand-in process instead of a real libvirtd).
#
# $STATE_FILE holds one line, written by the first setup of a session:
#   "yes PID"  setup started libvirtd PID (updated when setup restarts it)
#   "no PID"   libvirtd PID was already running: it is not ours, and nothing
#              of vmsched's may stop or kill it
# Teardown stops libvirtd only on "yes PID" when PID is the daemon running
# now, and says exactly what it stopped or left alone.
#
# Environment (defaults in brackets): VMSCHED_TEST_STATE_DIR [/run/vmsched-test],
# LIBVIRTD_PIDFILE [/run/libvirtd.pid], LIBVIRTD_COMM [libvirtd] (process name).

STATE_DIR=${VMSCHED_TEST_STATE_DIR:-/run/vmsched-test}
STATE_FILE=$STATE_DIR/libvirtd.started
PIDFILE=${LIBVIRTD_PIDFILE:-/run/libvirtd.pid}
LIBVIRTD_COMM=${LIBVIRTD_COMM:-libvirtd}

_alive() {  # _alive PID: a live (not zombie) process named $LIBVIRTD_COMM
    [ -n "$1" ] && [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$LIBVIRTD_COMM" ] \
        && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

running_pid() {  # prints the pid of the live libvirtd, or nothing
    if [ -r "$PIDFILE" ]; then
        pid=$(cat "$PIDFILE" 2>/dev/null || true)
        if _alive "$pid"; then echo "$pid"; return 0; fi
    fi
    for d in /proc/[0-9]*; do
        if _alive "${d#/proc/}"; then echo "${d#/proc/}"; return 0; fi
    done
}

state_owner() { cut -d' ' -f1 "$STATE_FILE" 2>/dev/null || true; }  # yes | no | (nothing)
state_pid() { cut -s -d' ' -f2 "$STATE_FILE" 2>/dev/null || true; }

record_found() {  # record_found PID: libvirtd PID was running when setup looked (first run decides)
    mkdir -p "$STATE_DIR"
    [ -e "$STATE_FILE" ] || echo "no $1" >"$STATE_FILE"
}

record_started() {  # record_started PID: setup started libvirtd PID
    mkdir -p "$STATE_DIR"
    if [ ! -e "$STATE_FILE" ] || [ "$(state_owner)" = yes ]; then
        echo "yes $1" >"$STATE_FILE"
    fi  # "no": a libvirtd was running before the session; the replacement is left running at teardown
}

teardown_libvirtd() {  # stop libvirtd only if setup started it; print exactly what was done
    pid=$(running_pid)
    owner=$(state_owner)
    recorded=$(state_pid)
    if [ "$owner" = yes ] && [ -z "$recorded" ]; then
        recorded=$pid  # a state file of an older setup.sh, which recorded no pid: "yes" meant the running one
    fi
    if [ "$owner" = yes ] && [ -n "$pid" ] && [ "$pid" = "$recorded" ]; then
        kill -TERM "$pid" 2>/dev/null || true
        i=0
        while _alive "$pid"; do
            i=$((i + 1))
            if [ "$i" -eq 100 ]; then
                echo "libvirtd (pid $pid) ignored SIGTERM for 10 s: sending SIGKILL"
                kill -KILL "$pid" 2>/dev/null || true
            fi
            if [ "$i" -gt 150 ]; then
                echo "FAILED to stop libvirtd (pid $pid), which setup started: it is still running"
                return 1
            fi
            sleep 0.1
        done
        echo "stopped libvirtd (pid $pid), which setup started"
    elif [ "$owner" = yes ] && [ -n "$pid" ]; then
        echo "left libvirtd (pid $pid) running: setup started pid $recorded, not this one"
    elif [ "$owner" = yes ]; then
        echo "nothing to stop: libvirtd started by setup (pid $recorded) is no longer running"
    elif [ "$owner" = no ] && [ -n "$pid" ]; then
        echo "left libvirtd (pid $pid) running: libvirtd (pid $recorded) was already running before setup"
    elif [ "$owner" = no ]; then
        echo "nothing to stop: libvirtd (pid $recorded) was running before setup and is no longer running"
    elif [ -n "$pid" ]; then
        echo "left libvirtd (pid $pid) running: no record that setup started it ($STATE_FILE missing)"
    else
        echo "nothing to stop: libvirtd is not running"
    fi
    rm -f "$STATE_FILE"
    return 0
}
