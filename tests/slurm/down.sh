#!/usr/bin/env bash
# down.sh - stop everything up-single.sh / up-pair.sh started under $RS_STATE: cancel the jobs,
# stop slurmd(s), slurmctld(s) and our munged by their pid files (checking /proc/PID/comm), then
# delete the two network namespaces (killing what is still inside them: only our jobs can be) and
# the state directory. Env: RS_STATE, RS_TAG (namespace prefix, when up-pair.sh ran), RS_KEEP=1
# keeps $RS_STATE (logs) for a look after a failure.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); . "$HERE/common.sh"
if [ -s "$RS_STATE/single/slurm.conf" ] && alive "$RS_STATE/single/run/slurmctld.pid"; then
  SLURM_CONF=$RS_STATE/single/slurm.conf cancel_all_jobs env
fi
if [ -n "${RS_TAG:-}" ] && [ -s "$RS_STATE/pair/slurm.conf" ] && alive "$RS_STATE/pair/run/slurmctld.pid"; then
  SLURM_CONF=$RS_STATE/pair/slurm.conf cancel_all_jobs "$HERE/onhost.sh" a
fi
daemons=()
for pf in "$RS_STATE"/single/run/slurmd.pid "$RS_STATE"/pair/run/slurmd-*.pid; do [ -e "$pf" ] && daemons+=("$pf:slurmd"); done
for pf in "$RS_STATE"/single/run/slurmctld.pid "$RS_STATE"/pair/run/slurmctld.pid; do [ -e "$pf" ] && daemons+=("$pf:slurmctld"); done
stop_pidfiles "${daemons[@]}"
munge_down
if [ -n "${RS_TAG:-}" ]; then
  for ns in "${RS_TAG}a" "${RS_TAG}b"; do
    [ -e "/run/netns/$ns" ] || continue
    # Anything left in our namespace is ours (a job step, a rank): TERM, then KILL, by pid.
    pids=$(ip netns pids "$ns" 2>/dev/null)
    if [ -n "$pids" ]; then
      log "processes left in $ns: $(echo $pids)"
      # shellcheck disable=SC2086
      kill -TERM $pids 2>/dev/null; sleep 1
      pids=$(ip netns pids "$ns" 2>/dev/null)
      # shellcheck disable=SC2086
      [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    fi
    ip netns del "$ns" || log "could not delete netns $ns"
  done
fi
[ "${RS_KEEP:-0}" = 1 ] || rm -rf "$RS_STATE"
exit 0
