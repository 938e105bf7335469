#!/usr/bin/env bash
# .ci/sge.sh -- a real, single-host Son of Grid Engine (Debian's gridengine-* 8.1.9) for the SGE tests.
#
# Installs the packages if missing (as root), makes the machine's name agree with what its address
# resolves to (SGE refuses clients whose IP resolves to another name, e.g. 'vm' -> 127.0.0.1 -> 'localhost'),
# starts sge_qmaster and sge_execd without systemd, and configures what the pilot needs:
#   * a parallel environment 'pilot' (control_slaves TRUE, so the batch script may start agents with
#     qrsh -inherit; allocation_rule $round_robin) and a queue all.q offering it,
#   * root may submit (min_uid 0: CI runs as root), scheduling every second, accounting flushed every second.
# Idempotent: a second run only checks that qstat answers. One host only: SGE identifies an execution
# host by its name, so several execds cannot pretend to be several nodes on one machine.
#
# Last line printed on success:  SGE_CI_HOST=<the execution host's name>
set -euo pipefail
export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
export PATH="$PATH:/usr/sbin:/sbin"
log() { echo ".ci/sge.sh: $*" >&2; }
die() { echo ".ci/sge.sh: ERROR: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root"

if ! [ -x /usr/sbin/sge_qmaster ] || ! [ -x /usr/sbin/sge_execd ] || ! command -v qsub >/dev/null; then
    log "installing gridengine-master gridengine-exec gridengine-client (apt-get) ..."
    host="$(hostname)"
    debconf-set-selections <<EOF
gridengine-common shared/gridengineconfig boolean true
gridengine-common shared/gridenginecell string default
gridengine-common shared/gridenginemaster string $host
gridengine-client shared/gridengineconfig boolean true
gridengine-client shared/gridenginecell string default
gridengine-client shared/gridenginemaster string $host
gridengine-master shared/gridengineconfig boolean true
gridengine-master shared/gridenginecell string default
gridengine-master shared/gridenginemaster string $host
EOF
    # The packages pull in an MTA (bsd-mailx -> exim4): keep package scripts from starting any daemon.
    own_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && own_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -q --no-install-recommends gridengine-master gridengine-exec gridengine-client >/tmp/ci-sge-apt.log 2>&1 \
      || { apt-get update -q >>/tmp/ci-sge-apt.log 2>&1 && \
           apt-get install -y -q --no-install-recommends gridengine-master gridengine-exec gridengine-client >>/tmp/ci-sge-apt.log 2>&1; }; } \
      || { [ "$own_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d; tail -20 /tmp/ci-sge-apt.log >&2; die "apt-get failed"; }
    [ "$own_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
fi

common="$SGE_ROOT/$SGE_CELL/common"
[ -d "$common" ] || die "$common missing: the gridengine-master package did not create the cell"

# The name SGE will see for this machine: what its address resolves back to.
name="$(/usr/lib/gridengine/gethostname | awk '/^Hostname:/ {print $2}')"
addr="$(/usr/lib/gridengine/gethostname | awk '/^Host Address/ {print $NF}')"
canon="$(/usr/lib/gridengine/gethostbyaddr "$addr" 2>/dev/null | awk '/^Hostname:/ {print $2}')"
canon="${canon:-$name}"
if [ "$canon" != "$name" ]; then
    echo "$canon $name" > "$common/host_aliases"
else
    rm -f "$common/host_aliases"
fi

queue_ok() { qstat -f 2>/dev/null | awk -v q="all.q@$canon" '$1 == q && NF == 5 {ok=1} END {exit !ok}'; }
if queue_ok && qconf -sp pilot >/dev/null 2>&1; then
    log "already up"
    echo "SGE_CI_HOST=$canon"
    exit 0
fi

echo "$canon" > "$common/act_qmaster"
# Start the qmaster when none runs (one that is still shutting down is waited for, then replaced).
for _ in $(seq 1 300); do
    qstat >/dev/null 2>&1 && break
    pgrep -x sge_qmaster >/dev/null || /etc/init.d/gridengine-master start >/dev/null 2>&1 || true
    sleep 0.1
done
qstat >/dev/null 2>&1 || die "sge_qmaster does not answer; see /var/spool/gridengine/qmaster/messages"

qconf -ah "$canon" >/dev/null 2>&1 || true
qconf -as "$canon" >/dev/null 2>&1 || true

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
qconf -sconf global | grep -v '^#' > "$work/global"
sed -i 's/^min_uid .*/min_uid 0/; s/^min_gid .*/min_gid 0/; s/flush_time=[0-9:]*/flush_time=00:00:01/' "$work/global"
(cd "$work" && qconf -Mconf global >/dev/null)
qconf -ssconf > "$work/sched"
sed -i 's/^schedule_interval .*/schedule_interval 0:0:1/; s/^flush_submit_sec .*/flush_submit_sec 1/; s/^flush_finish_sec .*/flush_finish_sec 1/' "$work/sched"
qconf -Msconf "$work/sched" >/dev/null

if ! qconf -sp pilot >/dev/null 2>&1; then
    cat > "$work/pe" <<'EOF'
pe_name            pilot
slots              9999
user_lists         NONE
xuser_lists        NONE
start_proc_args    NONE
stop_proc_args     NONE
allocation_rule    $round_robin
control_slaves     TRUE
job_is_first_task  FALSE
urgency_slots      min
accounting_summary FALSE
qsort_args         NONE
EOF
    qconf -Ap "$work/pe" >/dev/null
fi
if ! qconf -sq all.q >/dev/null 2>&1; then
    qconf -sq | sed "s/^qname .*/qname all.q/; s/^hostlist .*/hostlist $canon/; s/^pe_list .*/pe_list pilot/; s/^slots .*/slots $(nproc)/; s/^load_thresholds .*/load_thresholds NONE/; s#^shell .*#shell /bin/bash#; s/^shell_start_mode .*/shell_start_mode unix_behavior/" > "$work/q"
    qconf -Aq "$work/q" >/dev/null
fi
# No load alarms: CI machines are busy, and a queue in alarm state starts nothing.
qconf -rattr queue load_thresholds NONE all.q >/dev/null 2>&1 || true

for _ in $(seq 1 300); do
    pgrep -x sge_execd >/dev/null || /etc/init.d/gridengine-exec start >/dev/null 2>&1 || true
    queue_ok && break
    sleep 0.1
done
queue_ok || die "the execution host $canon did not join; see /var/spool/gridengine/execd/*/messages"
log "up: qmaster and execd on $canon, PE 'pilot', queue all.q"
echo "SGE_CI_HOST=$canon"
