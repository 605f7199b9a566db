#!/bin/bash
# Cortex under a real systemd manager on a machine whose PID 1 is not systemd (a CI runner, a
# container, a VM with another init): systemd 252+ runs as PID 1 of private PID, mount,
# network, UTS, IPC and cgroup namespaces, chrooted into a throw-away overlay of / (writes go
# to a tmpfs and vanish), with /proc/sys and /sys read-only and no CAP_SYS_TIME, CAP_SYS_MODULE
# or CAP_SYS_BOOT: it cannot change the host's clock, kernel, network or /etc. Needs root,
# unshare/nsenter/setpriv (util-linux), overlayfs and a cgroup2 hierarchy.
#
#   packaging/systemd-demo.sh demo      # the whole demonstration below, then tear-down
#   packaging/systemd-demo.sh up        # just start the manager
#   packaging/systemd-demo.sh install   # then install Cortex, start the engines (no start)
#   packaging/systemd-demo.sh run CMD…  # run CMD inside (e.g. systemctl status cortex)
#   packaging/systemd-demo.sh down      # stop it; nothing is left behind
#
# Inside the manager's root (the overlay), as packaging/cortex.service's header says: the
# binary ($CORTEX_BIN, dist/cortex by default) as /usr/local/bin/cortex, the unit unchanged as
# /etc/systemd/system/cortex.service, /etc/cortex/cortex.env with the admin token, and
# /etc/cortex/cortex.toml naming two `cortex sim` SGLang engines that run as a second,
# transient unit (model files under /var/lib/cortex). The demo then shows Type=notify, the
# watchdog, reload, a wedged loop being restarted, stop, and `systemd-analyze security`.
# CORTEX_DEMO_WATCHDOG_S=2 adds a drop-in with WatchdogSec=2s (the unit has 30 s): the
# watchdog steps then take seconds instead of a minute. CORTEX_DEMO_STATE: the work directory
# (/tmp/cortex-systemd-demo); CORTEX_DEMO_CGROUP: the cgroup2 directory to nest under.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
STATE=${CORTEX_DEMO_STATE:-/tmp/cortex-systemd-demo}
CORTEX_BIN=${CORTEX_BIN:-$REPO/dist/cortex}
CGROUP_PARENT=${CORTEX_DEMO_CGROUP:-}
SYSTEMD=${SYSTEMD:-/lib/systemd/systemd}

# Units of a full boot that have no business in a throw-away manager (or that would touch
# global kernel state: sysctls, modules, binfmt, the clock): masked in the overlay only.
MASKED=(
    systemd-timesyncd.service systemd-pstore.service systemd-sysctl.service
    systemd-modules-load.service kmod-static-nodes.service systemd-binfmt.service
    proc-sys-fs-binfmt_misc.automount proc-sys-fs-binfmt_misc.mount systemd-random-seed.service
    systemd-firstboot.service systemd-repart.service systemd-pcrphase.service
    systemd-pcrphase-sysinit.service systemd-machine-id-commit.service
    systemd-udevd.service systemd-udev-trigger.service systemd-udev-settle.service
    systemd-hwdb-update.service systemd-remount-fs.service systemd-update-utmp.service
    sys-kernel-config.mount sys-kernel-debug.mount sys-kernel-tracing.mount
    sys-fs-fuse-connections.mount dev-hugepages.mount dev-mqueue.mount
    timers.target getty.target console-getty.service systemd-ask-password-console.path
    systemd-journal-flush.service ldconfig.service e2scrub_reap.service
)

log() { printf '%s %s\n' "$(date -u +%T)" "$*" >&2; }

manager_pid() {  # host pid of the namespaced systemd, or nothing
    local parent
    parent=$(cat "$STATE/unshare.pid" 2>/dev/null) || return 0
    [ -d "/proc/$parent" ] || return 0
    cat "/proc/$parent/task/$parent/children" 2>/dev/null | awk '{print $1}'
}

inside() {  # run a command in the manager's namespaces and root
    local pid
    pid=$(manager_pid)
    [ -n "$pid" ] || { echo "no manager running (packaging/systemd-demo.sh up)" >&2; return 1; }
    nsenter --target "$pid" --mount --pid --net --uts --ipc --cgroup --root --wd -- "$@"
}

# --- stage 2: runs as PID 1 of the new namespaces, prepares the root, becomes systemd -------
init_stage() {
    local root=$STATE/root ovl=$STATE/ovl
    mount --make-rprivate /
    mount -t tmpfs -o mode=755 cortex-demo "$ovl"
    mkdir -p "$ovl/upper" "$ovl/work"
    mount -t overlay -o "lowerdir=/,upperdir=$ovl/upper,workdir=$ovl/work" overlay "$root"

    mount -t proc proc "$root/proc"
    local path
    for path in sys sysrq-trigger; do
        [ -e "$root/proc/$path" ] || continue
        mount --bind "$root/proc/$path" "$root/proc/$path"
        mount -o remount,bind,ro "$root/proc/$path"
    done
    mount -t sysfs -o ro sysfs "$root/sys"
    mount -t cgroup2 cgroup2 "$root/sys/fs/cgroup"

    mount -t tmpfs -o mode=755,nosuid tmpfs "$root/dev"
    local node
    for node in null zero full random urandom tty; do
        touch "$root/dev/$node"
        mount --bind "/dev/$node" "$root/dev/$node"
    done
    touch "$root/dev/console"
    mount --bind /dev/null "$root/dev/console"
    mkdir -p "$root/dev/pts" "$root/dev/shm"
    mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$root/dev/pts"
    ln -s pts/ptmx "$root/dev/ptmx"
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
    mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$root/run"
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/tmp"
    # The checkout (the demo's client and venv), read-only, at its host path.
    mkdir -p "$root$REPO"
    mount --bind "$REPO" "$root$REPO"
    mount -o remount,bind,ro "$root$REPO"

    mkdir -p "$root/etc/systemd/system"
    local unit
    for unit in "${MASKED[@]}"; do
        ln -sf /dev/null "$root/etc/systemd/system/$unit"
    done
    rm -rf "$root/etc/systemd/system/multi-user.target.wants" \
        "$root/etc/systemd/system/timers.target.wants"
    cat > "$root/etc/systemd/system/cortex-demo.target" <<'EOF'
[Unit]
Description=Cortex systemd demo (nothing but basic.target)
Requires=basic.target
After=basic.target
AllowIsolate=yes
EOF
    ln -sf cortex-demo.target "$root/etc/systemd/system/default.target"
    : > "$root/etc/machine-id"  # a transient id, not the host's

    exec chroot "$root" setpriv \
        --bounding-set -sys_time,-sys_module,-sys_boot,-wake_alarm,-audit_control \
        env -i container=cortex-demo TERM=dumb "$SYSTEMD" --system --log-target=journal \
        --log-level=info
}

up() {
    if [ -n "$(manager_pid)" ]; then echo "already running: $(manager_pid)"; return 0; fi
    mkdir -p "$STATE/ovl" "$STATE/root"
    local cgroup=${CGROUP_PARENT:-/sys/fs/cgroup/unified}
    [ -f "$cgroup/cgroup.procs" ] || cgroup=/sys/fs/cgroup
    [ "$(stat -f -c %T "$cgroup")" = cgroup2fs ] || {
        echo "no cgroup2 hierarchy at $cgroup (set CORTEX_DEMO_CGROUP)" >&2; return 1; }
    cgroup=$cgroup/cortex-systemd-demo-$$  # one per manager: demos may run side by side
    mkdir -p "$cgroup"
    echo "$cgroup" > "$STATE/cgroup"
    (
        echo "$BASHPID" > "$cgroup/cgroup.procs"
        exec unshare --pid --fork --kill-child --mount --net --uts --ipc --cgroup \
            "$HERE/systemd-demo.sh" __init > "$STATE/console.log" 2>&1
    ) &
    echo $! > "$STATE/unshare.pid"
    local state="" tries=0
    while [ $tries -lt 300 ]; do
        if [ -z "$(manager_pid)" ] && ! [ -d "/proc/$(cat "$STATE/unshare.pid")" ]; then
            echo "the manager exited; its console:" >&2; cat "$STATE/console.log" >&2
            down 2>/dev/null; return 1
        fi
        state=$(inside systemctl is-system-running 2>/dev/null || true)
        case $state in running|degraded) break ;; esac
        sleep 0.1; tries=$((tries + 1))
    done
    if [ $tries -ge 300 ]; then
        echo "the manager did not finish starting in 30 s: ${state:-no answer}" >&2
        down 2>/dev/null; return 1
    fi
    log "systemd $(inside systemctl --version | head -1 | awk '{print $2}') is up as pid 1" \
        "(host pid $(manager_pid)): $state"
}

down() {
    local parent pid
    parent=$(cat "$STATE/unshare.pid" 2>/dev/null) || return 0
    pid=$(manager_pid)
    if [ -n "$pid" ]; then
        kill -s SIGRTMIN+4 "$pid" 2>/dev/null || true  # poweroff: a container manager exits
        for _ in $(seq 100); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
    fi
    if [ -d "/proc/$parent" ]; then kill -KILL "$parent" 2>/dev/null || true; fi
    while [ -d "/proc/$parent" ]; do sleep 0.1; done
    local cgroup
    cgroup=$(cat "$STATE/cgroup" 2>/dev/null) || cgroup=""
    for _ in $(seq 300); do  # emptied as the last processes are reaped
        [ -n "$cgroup" ] && [ -d "$cgroup" ] || break
        find "$cgroup" -depth -type d -exec rmdir {} + 2>/dev/null || sleep 0.1
    done
    rm -f "$STATE/unshare.pid"
    log "manager stopped"
}

# --- the demo -----------------------------------------------------------------------------
PY=$REPO/.venv/bin/python
MODEL=deepseek
BOS='<｜begin▁of▁sentence｜>'
EOS='<｜end▁of▁sentence｜>'

put() {  # put FILE MODE: stdin -> FILE inside the manager's root
    inside install -D -m "$2" /dev/stdin "$1"
}

install_cortex() {  # as packaging/cortex.service's header says, inside the throw-away root
    put /usr/local/bin/cortex 0755 < "$CORTEX_BIN"
    (cd "$REPO" && "$PY" -c 'import shutil, sys; from tests import deepseek_profile as ds
shutil.copyfileobj(open(ds.TOKENIZER_JSON, "rb"), sys.stdout.buffer)') \
        | put /var/lib/cortex/deepseek/tokenizer.json 0644
    (cd "$REPO" && "$PY" -c 'import sys; from tests import deepseek_profile as ds
sys.stdout.write(ds.TEMPLATE)') | put /var/lib/cortex/deepseek/chat.jinja 0644
    printf 'CORTEX_CONTROL_ADMIN_TOKEN=demo-secret\n' | put /etc/cortex/cortex.env 0600
    put /etc/systemd/system/cortex.service 0644 < "$HERE/cortex.service"
    if [ -n "${CORTEX_DEMO_WATCHDOG_S:-}" ]; then  # a shorter watchdog: the demo in seconds
        printf '[Service]\nWatchdogSec=%ss\n' "$CORTEX_DEMO_WATCHDOG_S" \
            | put /etc/systemd/system/cortex.service.d/demo-watchdog.conf 0644
    fi
    inside systemctl daemon-reload
}

start_sim() {  # two SGLang-flavoured `cortex sim` engines, as a transient unit; prints their lines
    inside systemd-run --quiet --unit=cortex-sim --property=Type=exec /usr/local/bin/cortex sim \
        --engine sglang --count 2 --port 30000 --kv-events-port 5557 --model "$MODEL" \
        --block-size 16 --tokenizer /var/lib/cortex/deepseek/tokenizer.json \
        --chat-template /var/lib/cortex/deepseek/chat.jinja --bos-token "$BOS" --eos-token "$EOS" \
        --decode-ms-per-token "${SIM_DECODE_MS:-5}"
    local lines=""
    for _ in $(seq 600); do
        lines=$(inside journalctl -u cortex-sim -o cat --no-pager | grep -E '^sim[0-9] ' || true)
        [ "$(printf '%s\n' "$lines" | grep -c .)" -ge 2 ] && break
        sleep 0.1
    done
    printf '%s\n' "$lines"
}

write_config() {  # write_config SIM_LINES [WEIGHT_OF_SIM1]
    local name url events replay
    {
        printf '[server]\nhost = "127.0.0.1"\nport = 8080\n'
        printf '[control]\nhost = "127.0.0.1"\nport = 8081\n'
        printf '[health]\ninterval_s = 0.5\n'
        printf '[[models]]\nname = "%s"\n' "$MODEL"
        printf 'tokenizer = "/var/lib/cortex/deepseek/tokenizer.json"\nblock_size = 16\n'
        printf 'chat_template = "/var/lib/cortex/deepseek/chat.jinja"\n'
        printf 'bos_token = "%s"\neos_token = "%s"\n' "$BOS" "$EOS"
        while read -r name _ url _ events replay _; do
            printf '[[workers]]\nname = "%s"\nurl = "%s"\nengine = "sglang"\n' "$name" "$url"
            printf 'model = "%s"\nevents = "%s"\nreplay = "%s"\n' \
                "$MODEL" "${events#rank0=}" "${replay#replay0=}"
            printf 'weight = %s\n' "$([ "$name" = sim1 ] && echo "${2:-1.0}" || echo 1.0)"
        done <<< "$1"
    } | put /etc/cortex/cortex.toml 0644
}

client() { inside "$PY" "$HERE/systemd-demo-client.py" "$@"; }
show() { inside systemctl show cortex "${@/#/-p}" | tr '\n' ' '; echo; }
step() { printf '\n== %s\n' "$*"; }
journal_since() {  # journal_since CURSOR_FILE (inside): the unit's new lines (systemd + cortex)
    inside journalctl --no-pager -o short-precise -u cortex --cursor-file="$1" \
        | grep -v -E '^-- ' | cut -c8-230 || true
}

wait_for() {  # wait_for SECONDS COMMAND...: poll until COMMAND succeeds
    local deadline=$((SECONDS + $1)); shift
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || { echo "timed out: $*" >&2; return 1; }
        sleep 0.1
    done
}

demo() {
    local cursor=/run/cortex-demo-journal.cursor sims state last="" pid child
    [ -x "$CORTEX_BIN" ] || { echo "$CORTEX_BIN is not built: make dist" >&2; return 1; }
    step "a private systemd manager"
    trap 'down 2>/dev/null' EXIT  # a failed step leaves nothing running either
    up
    install_cortex
    inside cmp -s /etc/systemd/system/cortex.service "$HERE/cortex.service" \
        && echo "installed packaging/cortex.service unchanged as /etc/systemd/system/cortex.service"
    step "the unit is accepted: systemd-analyze verify, then security"
    inside systemd-analyze verify /etc/systemd/system/cortex.service && echo "verify: no complaint"
    inside systemd-analyze security --no-pager cortex.service | tail -1
    step "two cortex sim engines (transient unit cortex-sim.service), the configuration"
    sims=$(start_sim)
    printf '%s\n' "$sims"
    write_config "$sims"
    inside cortex check-config --config /etc/cortex/cortex.toml

    step "Type=notify: activating until READY=1, then active"
    journal_since "$cursor" > /dev/null
    inside systemctl start --no-block cortex
    local deadline=$((SECONDS + 150))  # past the unit's TimeoutStartSec
    while [ $SECONDS -lt $deadline ]; do
        state=$(show ActiveState SubState StatusText)
        [ "$state" = "$last" ] || printf '%s %s\n' "$(date -u +%T.%N | cut -c1-12)" "$state"
        last=$state
        case $state in *ActiveState=active*|*failed*) break ;; esac
        sleep 0.02
    done
    journal_since "$cursor" | grep -E 'Starting|data plane on|Started'
    show ExecMainStartTimestamp ActiveEnterTimestamp NotifyAccess MainPID
    client chat

    step "watchdog: WATCHDOG=1 from the trio loop every WatchdogSec/2"
    show WatchdogUSec WatchdogTimestamp
    sleep "$(inside systemctl show -p WatchdogUSec --value cortex | awk '
        /min/ {print 31; exit} {v = $1 + 0; print (v > 1 ? v / 2 + 1 : 1)}')"
    show WatchdogTimestamp

    step "reload (SIGHUP): sim1's weight 1 -> 2; a keep-alive connection and a stream carry on"
    write_config "$sims" 2.0
    client reload
    journal_since "$cursor" | grep -E 'Reload|SIGHUP'

    step "a wedged loop (the Cortex process SIGSTOPped): the watchdog kills it, systemd restarts it"
    pid=$(inside systemctl show -p MainPID --value cortex)
    child=$(inside cat "/proc/$pid/task/$pid/children" | awk '{print $1}')
    child=${child:-$pid}  # a pip-installed cortex has no one-file launcher
    echo "SIGSTOP to pid $child (main pid $pid)"
    inside kill -STOP "$child"
    wait_for 120 inside sh -c '[ "$(systemctl show -p NRestarts --value cortex)" -ge 1 ]'
    wait_for 120 inside systemctl is-active --quiet cortex
    journal_since "$cursor" | grep -E 'Watchdog|Killing|Main process|Failed|Scheduled|Started'
    show NRestarts MainPID ActiveState

    step "stop: STOPPING=1, the stream in flight drains, then a clean exit"
    client stop
    journal_since "$cursor" | grep -E 'Stopping|draining|Deactivated|Stopped'

    step "tear-down"
    down
}

case ${1:-} in
    __init) init_stage ;;
    up) up ;;
    down) down ;;
    run) shift; inside "$@" ;;
    install) install_cortex; write_config "$(start_sim)" ;;
    demo) demo ;;
    *) sed -n '2,/^set /p' "$0" | sed '$d'; exit 2 ;;
esac
