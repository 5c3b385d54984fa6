#!/usr/bin/env bash
# Two hosts for real on one machine: two network namespaces joined by a veth pair
# (10.77.X.1 and 10.77.X.2), Open MPI started across them without sshd (its rsh
# launcher calls netns_agent.sh, which enters the other namespace), TCP only
# (--mca btl tcp,self: no shared memory between the "hosts"). Runs the MPI test
# subset and train_gpt --backend mpi --mesh dp=2 with one rank per host; with
# --bench also bench_collectives, across the hosts and, for comparison, on one.
#   two_hosts.sh BUILD_DIR [--bench]
# Needs root and iproute2; exits 77 (CTest: skipped) without them.
set -u
build=$(cd "$1" && pwd)
bench=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null || ! command -v unshare >/dev/null; then
  echo "two_hosts: needs root, ip (iproute2) and unshare; skipped"
  exit 77
fi
id=$$
subnet=$((id % 200 + 20))
a=dt-a-$id b=dt-b-$id
addr_a=10.77.$subnet.1 addr_b=10.77.$subnet.2
cleanup() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; rm -f "$hostfile"; }
hostfile=$(mktemp)
trap cleanup EXIT
ip netns add "$a" && ip netns add "$b" || { echo "two_hosts: cannot create network namespaces; skipped"; exit 77; }
ip link add veth-a netns "$a" type veth peer name veth-b netns "$b" || exit 1
ip -n "$a" addr add $addr_a/24 dev veth-a && ip -n "$b" addr add $addr_b/24 dev veth-b || exit 1
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set veth-a up && ip -n "$b" link set veth-b up || exit 1
printf '%s slots=1\n%s slots=1\n' $addr_a $addr_b >"$hostfile"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DTENSOR_NETNS_HOSTS="$addr_b=$b"
mca=(--mca plm_rsh_agent "$here/netns_agent.sh" --mca btl tcp,self
     --mca btl_tcp_if_include 10.77.$subnet.0/24 --mca oob_tcp_if_include 10.77.$subnet.0/24)
# Runs `mpirun -np 2` from namespace a, one rank per host.
across() {
  ip netns exec "$a" unshare --uts sh -c "hostname $a && exec \"\$0\" \"\$@\"" \
    mpirun -np 2 --hostfile "$hostfile" --map-by node --bind-to none "${mca[@]}" -x DTENSOR_TIMEOUT_S=60 "$@"
}
fail=0
step() {
  echo "=== $*"
  "$@" || { echo "two_hosts: FAILED: $*"; fail=1; }
}
# A program this build lacks (examples or benchmarks switched off) is skipped.
have() { [ -x "$1" ] || { echo "=== $1: not built, skipped"; return 1; }; }
# Each rank says where it runs: two different namespaces, two addresses.
step across sh -c 'echo "rank $OMPI_COMM_WORLD_RANK on $(hostname)"'
step across "$build/tests/mpi/test_comm_mpi"
step across "$build/tests/mpi/test_dist_mpi"
have "$build/examples/train_gpt" && step across "$build/examples/train_gpt" --backend mpi --mesh dp=2 --steps 20 --out "$(mktemp -d)/loss.csv"
step across -x DTENSOR_DEBUG=collectives "$build/tests/mpi/test_comm_mpi"

if [ "$bench" = --bench ] && have "$build/bench/bench_collectives"; then
  echo "=== bench_collectives: two hosts (veth, TCP)"
  across "$build/bench/bench_collectives" --worlds=2 --max-mib=16
  echo "=== bench_collectives: one host, TCP over loopback"
  ip netns exec "$a" mpirun -np 2 --bind-to none --mca btl tcp,self "$build/bench/bench_collectives" --worlds=2 --max-mib=16
  echo "=== bench_collectives: one host, Open MPI defaults (shared memory)"
  mpirun -np 2 --bind-to none "$build/bench/bench_collectives" --worlds=2 --max-mib=16
  if have "$build/examples/train_gpt"; then
    gpt=("$build/examples/train_gpt" --backend mpi --mesh dp=2 --steps 60 --out "$(mktemp -d)/loss.csv")
    echo "=== train_gpt: two hosts (veth, TCP)"
    across "${gpt[@]}" | tail -1
    echo "=== train_gpt: one host, TCP over loopback"
    ip netns exec "$a" mpirun -np 2 --bind-to none --mca btl tcp,self "${gpt[@]}" | tail -1
    echo "=== train_gpt: one host, Open MPI defaults (shared memory)"
    mpirun -np 2 --bind-to none "${gpt[@]}" | tail -1
  fi
fi

# A host becomes unreachable mid-collective (its link goes down): the ranks block in
# MPI, the watchdog ends the job at the timeout, naming the call.
echo "=== unreachable host"
log=$(mktemp)
start=$(date +%s)
# Keepalives on the daemons' connections let mpirun notice the lost host in seconds
# (Open MPI's default: 300 s idle, then 9 probes 20 s apart).
across --mca oob_tcp_keepalive_time 1 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 2 \
  -x DTENSOR_TIMEOUT_S=3 "$build/tests/mpi/mpi_faults" loop >"$log" 2>&1 &
job=$!
for _ in $(seq 1 100); do grep -q "pid" "$log" && break; sleep 0.1; done
sleep 1
ip -n "$b" link set veth-b down
# mpirun cannot reach the other host's daemon to end it: once rank 0's abort ended
# the job here, whatever runs in namespace b is ours to stop.
for _ in $(seq 1 30); do kill -0 $job 2>/dev/null || break; sleep 1; done
kill -9 $job 2>/dev/null
wait $job
status=$?
elapsed=$(($(date +%s) - start))
cat "$log"
echo "--- status $status after ${elapsed} s"
grep -q "\[watchdog\] all_reduce in group 'world'" "$log" || { echo "two_hosts: FAILED: no watchdog report"; fail=1; }
[ "$elapsed" -le 20 ] || { echo "two_hosts: FAILED: the job took ${elapsed} s to end"; fail=1; }
leftover=$(ip netns pids "$b")
[ -n "$leftover" ] && kill -9 $leftover
rm -f "$log"

exit $fail
