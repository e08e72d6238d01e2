#!/bin/sh
# Open MPI's remote-launch agent for "hosts" that are network namespaces on this machine
# (`--mca plm_rsh_agent scripts/netns_rsh.sh`): called as `netns_rsh.sh HOST COMMAND...` like ssh,
# it runs COMMAND in the namespace that owns the IPv4 address HOST. Used by the benchmarks and
# tests that build namespaces joined by veth pairs (scripts/bench_slow_link.sh,
# tests/integration/fault/netns_cluster.py); needs root.
#
# Every namespace shares this machine's hostname, so Open MPI would give all their daemons one
# session directory (/tmp/ompi.HOSTNAME.UID/jf.N): concurrent orted start-ups then race on it
# (orte_init "File exists" at session_dir.c:107, exit 213; "PMIX ERROR ... dstore_base.c";
# a segfault in hwloc_shmem_topology_write on the shared hwloc.sm). So COMMAND gets a session
# directory base of its own, $NETNS_RSH_TMPDIR/NAMESPACE (default /tmp/netns-rsh/NAMESPACE), unless
# OMPI_MCA_orte_tmpdir_base is set already (e.g. by mpirun --mca orte_tmpdir_base).
#
# Fast path: tests/integration/fault/netns_cluster.py writes /run/tf-netns-hosts/HOST (the namespace's name)
# for each of its hosts and removes it on teardown; a hint naming an existing namespace is used
# without asking `ip` (~7 ms on top of `ip netns exec`). Otherwise every namespace on the machine
# is asked for its addresses (one `ip` run each: ~15-25 ms per namespace here).
host="$1"
shift
run_in() {
  : "${OMPI_MCA_orte_tmpdir_base:=${NETNS_RSH_TMPDIR:-/tmp/netns-rsh}/$1}"
  export OMPI_MCA_orte_tmpdir_base
  exec ip netns exec "$1" /bin/sh -c "$2"
}
hint="/run/tf-netns-hosts/$host"
if [ -r "$hint" ]; then
  read -r ns <"$hint" || ns=
  if [ -n "$ns" ] && [ -e "/run/netns/$ns" ]; then
    run_in "$ns" "$*"
  fi
fi
for ns in $(ip netns list | awk '{print $1}'); do
  if ip -n "$ns" -4 -o addr show 2>/dev/null | grep -qF " inet $host/"; then
    run_in "$ns" "$*"
  fi
done
echo "netns_rsh: no network namespace has the address '$host'" >&2
exit 255
