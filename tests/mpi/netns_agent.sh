#!/usr/bin/env bash
# The "ssh" of two_hosts.sh. Open MPI's rsh launcher calls it as
#   netns_agent.sh [ssh options] HOST COMMAND...
# and it runs COMMAND in the network namespace that owns HOST's address, with a
# hostname of its own (a UTS namespace), so that namespace looks like another host.
# DTENSOR_NETNS_HOSTS maps addresses to namespaces: "10.77.0.2=dt-b-123 ...".
set -eu
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done  # ssh options (-x ...)
host=$1
shift
ns=""
for pair in ${DTENSOR_NETNS_HOSTS:-}; do
  [ "${pair%%=*}" = "$host" ] && ns=${pair#*=}
done
[ -n "$ns" ] || { echo "netns_agent: no namespace for host '$host' in DTENSOR_NETNS_HOSTS" >&2; exit 1; }
exec ip netns exec "$ns" unshare --uts sh -c "hostname '$ns' && $*"
