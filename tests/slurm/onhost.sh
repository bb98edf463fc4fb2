#!/usr/bin/env bash
# onhost.sh <a|b> <cmd...> - run cmd "on" emulated host a or b of the two-node cluster: in network
# namespace ${RS_TAG}a/b, with a private UTS namespace whose hostname is the namespace's name, and
# a private mount namespace in which $RS_STATE/pair/hosts is bind-mounted over /etc/hosts (so
# both hosts' names resolve to their veth addresses, and torch's TensorPipe/Gloo, which work out
# their own address from the hostname, advertise the right one).
# Pitfall: NOT `ip netns exec`: it remounts /sys, which hides /sys/fs/cgroup, and slurmd 22.05 then
# dies with "No filesystem mounted on /sys/fs/cgroup / Unable to initialize cgroup plugin".
# Entering only the net namespace (nsenter --net) plus unshare --mount --uts keeps /sys as it is.
# Env: RS_STATE, RS_TAG.
set -u
: "${RS_STATE:?}" "${RS_TAG:?}"
ns=${RS_TAG}$1; shift
[ -e "/run/netns/$ns" ] || { echo "onhost: no network namespace $ns (run up-pair.sh)" >&2; exit 1; }
exec nsenter --net="/run/netns/$ns" unshare --mount --uts --propagation private sh -c '
  mount --bind "$1" /etc/hosts || exit 1
  hostname "$0" || exit 1
  shift; exec "$@"' "$ns" "$RS_STATE/pair/hosts" "$@"
