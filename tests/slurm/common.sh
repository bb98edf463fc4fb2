# common.sh - sourced by the other scripts in tests/slurm/. A private, throw-away Slurm for
# rpcctl's tests (Debian bookworm, Slurm 22.05, munge 0.5; root; no systemd needed).
#
# Everything lives under $RS_STATE (the test fixture picks it, e.g. /tmp/rpcctl-slurm-<pid>):
#   $RS_STATE/munge/        our own munged: key, socket, pid file, log (it never touches /run/munge)
#   $RS_STATE/single/       the one-node cluster (root network namespace), slurm.conf + state + logs
#   $RS_STATE/pair/         the two-node cluster across two network namespaces, slurm.conf + ...
# Nothing is written to /etc/slurm or /etc/munge; clients find a cluster via SLURM_CONF.
# Every daemon is stopped by the pid in its pid file, and only if /proc/PID/comm matches.
set -uo pipefail

: "${RS_STATE:?set RS_STATE to the state directory}"
MUNGE_DIR=$RS_STATE/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
MUNGE_PIDFILE=$MUNGE_DIR/munged.pid

log() { echo "[rpcctl-slurm] $*" >&2; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# alive <pidfile>: the pid in it exists
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# stop_pidfiles <pidfile:comm>...: SIGTERM each pid whose /proc/PID/comm matches (others are left
# alone), all at once (slurmctld takes a few seconds to shut down), then SIGKILL what is still
# there after 10 s. Removes the pid files.
stop_pidfiles() {
  local item pf comm pid pids=()
  for item in "$@"; do
    pf=${item%:*} comm=${item##*:}
    if alive "$pf"; then
      pid=$(cat "$pf")
      if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ]; then
        kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
      else
        log "pid $pid in $pf is not $comm: leaving it alone"
      fi
    fi
    rm -f "$pf"
  done
  [ ${#pids[@]} = 0 ] && return 0
  for _ in $(seq 100); do
    local left=()
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left+=("$pid"); done
    [ ${#left[@]} = 0 ] && return 0
    sleep 0.1
  done
  for pid in "${left[@]}"; do log "pid $pid ($(cat /proc/$pid/comm 2>/dev/null)) ignored SIGTERM: SIGKILL"; kill -KILL "$pid" 2>/dev/null; done
}

# Pitfall: there is no systemd here, and apt's policy-rc.d keeps the packages' services from
# starting, so we start munged ourselves. munged must run as user munge (`runuser -u munge`) and
# refuses a key that is not 0600 and owned by munge, or a socket directory others can write to.
# The Debian service normally makes /run/munge; we point munged (and Slurm, via
# AuthInfo=socket=...) at a socket of our own instead, so a munged someone else runs is never
# touched, and ours never serves anyone else. A unix socket is a file: it is reachable from
# every network namespace too.
munge_up() {
  id munge >/dev/null 2>&1 || { log "no user munge (is the munge package installed?)"; return 1; }
  if alive "$MUNGE_PIDFILE"; then return 0; fi
  install -d -m 755 "$RS_STATE"
  install -d -o munge -g munge -m 700 "$MUNGE_DIR"
  chmod 711 "$MUNGE_DIR"  # others may reach the socket inside, not list or write
  if [ ! -s "$MUNGE_DIR/munge.key" ]; then
    mungekey --create --keyfile="$MUNGE_DIR/munge.key" --force >/dev/null || return 1
  fi
  chown munge:munge "$MUNGE_DIR/munge.key" && chmod 600 "$MUNGE_DIR/munge.key"
  runuser -u munge -- /usr/sbin/munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
    --pid-file="$MUNGE_PIDFILE" --log-file="$MUNGE_DIR/munged.log" --seed-file="$MUNGE_DIR/munged.seed" \
    || { log "munged did not start"; cat "$MUNGE_DIR/munged.log" >&2; return 1; }
  for _ in $(seq 50); do [ -S "$MUNGE_SOCKET" ] && alive "$MUNGE_PIDFILE" && break; sleep 0.1; done
  munge -S "$MUNGE_SOCKET" -n | unmunge -S "$MUNGE_SOCKET" >/dev/null || { log "munge self-test failed"; return 1; }
}

munge_down() { stop_pidfiles "$MUNGE_PIDFILE:munged"; }

# slurm_common <base> <cluster name>: the slurm.conf lines both clusters share.
# Pitfalls kept here:
#  * SlurmUser=root and SlurmdUser=root: daemons and jobs run as root, so state/spool dirs under
#    /tmp need no chown.
#  * No cgroup setup in this VM: proctrack/linuxproc, task/none and jobacct_gather/none work
#    without a cgroup.conf. slurmd 22.05 still initialises its cgroup plugin (there is no
#    CgroupPlugin=disabled yet), so /sys/fs/cgroup must stay visible: see onhost.sh.
#  * sacct does NOT work (no slurmdbd): accounting_storage/none. Use squeue / `scontrol show job`
#    (MinJobAge=300 keeps finished jobs for 5 minutes) or the jobcomp/filetxt log.
#  * MailProg=/bin/true silences an error at every job end. "mpi/pmix_v4: can not load PMIx
#    library" and "Could not open ... state file" on a first start are harmless log noise.
slurm_common() {
  local base=$1 name=$2
  cat <<EOC
ClusterName=$name
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$base/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=$base/state
InactiveLimit=0
KillWait=5
SlurmdTimeout=${RS_SLURMD_TIMEOUT:-300}
MinJobAge=300
EOC
}

# real_memory_mb: what slurmd -C detects (a node configured with more memory is drained as INVALID)
real_memory_mb() { slurmd -C | head -1 | tr ' ' '\n' | awk -F= '$1=="RealMemory"{print $2}'; }
real_cpus() { slurmd -C | head -1 | tr ' ' '\n' | awk -F= '$1=="CPUs"{print $2}'; }

# cancel_all_jobs <client prefix...>: scancel every job of the cluster SLURM_CONF names, and wait
cancel_all_jobs() {
  local ids
  ids=$("$@" squeue -h -o %i 2>/dev/null) || return 0
  [ -z "$ids" ] && return 0
  log "cancelling jobs: $(echo $ids)"
  # shellcheck disable=SC2086
  "$@" scancel --full $ids 2>/dev/null
  for _ in $(seq 150); do [ -z "$("$@" squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.1; done
}
