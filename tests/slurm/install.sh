#!/usr/bin/env bash
# install.sh - apt-get install slurm-wlm and munge (Debian packages) when a command is missing.
# Exit 0: installed (or already there); 3: cannot install here (not root, no apt-get/dpkg);
# 4: the install failed (its log is printed). About 15 s cold on the 2-core test VM.
# The packages' services do not start (no systemd; policy-rc.d): up-*.sh start the daemons.
set -uo pipefail
need=()
for cmd in slurmctld slurmd srun sbatch squeue scontrol munged munge unmunge mungekey; do
  command -v "$cmd" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "$cmd" >/dev/null 2>&1 || need+=("$cmd")
done
for cmd in nsenter unshare ip runuser; do
  PATH=$PATH:/usr/sbin command -v "$cmd" >/dev/null 2>&1 || need+=("$cmd")
done
[ ${#need[@]} = 0 ] && exit 0
[ "$(id -u)" = 0 ] || { echo "missing ${need[*]} and not root: cannot apt-get install slurm-wlm munge"; exit 3; }
command -v apt-get >/dev/null && command -v dpkg >/dev/null || { echo "missing ${need[*]} and no apt-get/dpkg"; exit 3; }
log=$(mktemp /tmp/rpcctl-slurm-apt.XXXXXX)
pkgs=(slurm-wlm munge util-linux iproute2)
echo "apt-get install ${pkgs[*]} (missing: ${need[*]})" >&2
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${pkgs[@]}" >"$log" 2>&1; then
  # a stale package index is the usual cause on a fresh machine
  DEBIAN_FRONTEND=noninteractive apt-get update >>"$log" 2>&1
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${pkgs[@]}" >>"$log" 2>&1 \
    || { echo "apt-get install ${pkgs[*]} failed:"; tail -15 "$log"; rm -f "$log"; exit 4; }
fi
rm -f "$log"
exit 0
