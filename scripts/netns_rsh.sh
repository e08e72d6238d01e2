#!/bin/sh
# Open MPI's remote-launch agent for "hosts" that are network namespaces on this machine
# (`--mca plm_rsh_agent scripts/netns_rsh.sh`): called as `netns_rsh.sh HOST COMMAND...` like ssh,
# it runs COMMAND in the namespace that owns the IPv4 address HOST. Used by the benchmarks and
# tests that build namespaces joined by veth pairs (scripts/bench_slow_link.sh); needs root.
host="$1"
shift
for ns in $(ip netns list | awk '{print $1}'); do
  if ip -n "$ns" -4 -o addr show 2>/dev/null | grep -q " inet $host/"; then
    exec ip netns exec "$ns" /bin/sh -c "$*"
  fi
done
echo "netns_rsh: no network namespace has the address '$host'" >&2
exit 255
