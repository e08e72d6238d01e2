#!/usr/bin/env python3
"""Several simulated "hosts" on one machine, as Linux network namespaces, for chaos tests.

    with NetnsCluster(3, tag="7") as c:      # needs root (ip netns, bridge, veth)
        c.hosts            -> ["10.200.7.11", "10.200.7.12", "10.200.7.13"]
        c.run_on(c.hosts[0], ["sleep", "1"])  # a subprocess.Popen inside that host
        c.partition(c.hosts[1]); c.heal(c.hosts[1])

Layout for tag T (a short string of letters/digits, unique per concurrent test run):
  root namespace: bridge `tfbrT` with 10.X.Y.1/24 (the supervisor's address; mpirun runs here)
  host k (1..n):  namespace `tfThk`, veth pair `tfTvk` (root side, on the bridge) <-> `eth0`
                  (inside), 10.X.Y.(10+k)/24, `lo` up, default route via 10.X.Y.1.
X.Y comes from the tag: a decimal tag N < 2048 gives 10.(200 + N // 256).(N % 256); any other
tag is hashed into the same 10.200.0.0/13 range. Open MPI uses the host addresses as host names
(hostfile) and scripts/netns_rsh.sh as its remote-shell agent.

Containment: the bridge does not forward IPv4 to other interfaces (its conf/forwarding is 0,
whatever net.ipv4.ip_forward says), IPv6 is disabled on every interface of the cluster, and
nothing is NATed, so packets from the hosts can only reach each other and the bridge address.
partition(host) sets the root-side veth of the host down: the host keeps running, cut off.

Open MPI: mpirun runs in the root namespace with the host addresses in its hostfile and
`c.mpirun_flags()` (scripts/netns_rsh.sh as remote shell, OOB and TCP BTL pinned to the subnet,
--bind-to none: every orted sees the whole machine and would bind the ranks of different hosts to
the same core). The setup writes /run/tf-netns-hosts/ADDR hints that make netns_rsh.sh fast, and
netns_rsh.sh gives each namespace its own Open MPI session directory (see that script).

teardown() kills (SIGKILL) every process still inside the namespaces (`ip netns pids`), then
deletes namespaces, veths and bridge, hints and session directories. It finds them by name, so it
also cleans up after a crash mid-setup or in another process (CLI: `down --tag T`), and is safe to
call twice. It does not touch processes in the root namespace (mpirun): stop those by PID.

CLI:  python3 tests/integration/fault/netns_cluster.py up --hosts 3 --tag 7    (prints JSON, leaves it up)
      python3 tests/integration/fault/netns_cluster.py down --tag 7
      python3 tests/integration/fault/netns_cluster.py check --hosts 3 --tag 7 (up, connectivity test, down)
"""
import argparse
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import zlib

IP_TIMEOUT_S = 10  # any single `ip` invocation
HINT_DIR = "/run/tf-netns-hosts"  # address -> namespace hints read by scripts/netns_rsh.sh
RSH_AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "scripts",
                         "netns_rsh.sh")


def rsh_tmpdir(ns):
    """The Open MPI session-directory base scripts/netns_rsh.sh gives namespace `ns`."""
    return os.path.join(os.environ.get("NETNS_RSH_TMPDIR", "/tmp/netns-rsh"), ns)


class NetnsError(RuntimeError):
    pass


def _ip(*args, check=True, timeout=IP_TIMEOUT_S, input=None):
    """Runs `ip ARGS`; returns stdout. Raises NetnsError on failure when check is set."""
    try:
        p = subprocess.run(["ip", *args], input=input, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise NetnsError(f"ip {' '.join(args)}: timed out after {timeout} s") from e
    if check and p.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {p.stderr.strip() or p.returncode}")
    return p.stdout


def _write_sysctl(path, value):
    try:
        with open(path, "w") as f:
            f.write(value)
        return True
    except OSError:
        return False


def _read_sysctl(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def subnet_octets(tag):
    """(X, Y) of the 10.X.Y.0/24 subnet of `tag`, inside 10.200.0.0/13."""
    tag = str(tag)
    if tag.isdigit() and int(tag) < 2048:
        n = int(tag)
    else:
        n = zlib.crc32(tag.encode()) % 2048
    return 200 + n // 256, n % 256


def _check_tag(tag):
    tag = str(tag)
    # "tf" + tag + "v" + k must fit IFNAMSIZ-1 = 15 characters with k up to 2 digits.
    if not re.fullmatch(r"[A-Za-z0-9]{1,10}", tag):
        raise ValueError(f"tag {tag!r}: use 1-10 letters/digits")
    return tag


def netns_list():
    out = _ip("netns", "list", check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def netns_pids(ns):
    out = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def kill_netns_processes(ns, timeout=5.0):
    """SIGKILLs every process inside namespace `ns` until none is left (or `timeout` passes).
    Returns the PIDs that were signalled."""
    killed = set()
    deadline = time.monotonic() + timeout
    while True:
        pids = [p for p in netns_pids(ns) if p != os.getpid()]
        if not pids:
            return sorted(killed)
        if time.monotonic() > deadline:
            raise NetnsError(f"processes still alive in {ns} after {timeout} s: {pids}")
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
                killed.add(p)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


class NetnsCluster:
    def __init__(self, n_hosts, tag, reclaim=False):
        """Creates the cluster now. With reclaim, leftovers of an earlier run with the same
        tag are torn down first; without it they are an error."""
        if not 1 <= int(n_hosts) <= 99:
            raise ValueError("n_hosts must be 1..99")
        self._names(int(n_hosts), tag)
        if self._leftovers():
            if not reclaim:
                raise NetnsError(f"tag {self.tag}: leftovers of an earlier cluster exist "
                                 f"({', '.join(self._leftovers())}); "
                                 f"run `netns_cluster.py down --tag {self.tag}`")
            self.teardown()
        try:
            self._setup()
        except BaseException:
            self.teardown()
            raise

    def _names(self, n_hosts, tag):
        self.n_hosts = n_hosts
        self.tag = _check_tag(tag)
        x, y = subnet_octets(self.tag)
        self.prefix = f"10.{x}.{y}"
        self.subnet = f"{self.prefix}.0/24"
        self.supervisor_addr = f"{self.prefix}.1"
        self.bridge = f"tfbr{self.tag}"
        self.hosts = [f"{self.prefix}.{10 + k}" for k in range(1, n_hosts + 1)]
        self._ns = {h: f"tf{self.tag}h{k}" for k, h in enumerate(self.hosts, 1)}
        self._veth = {h: f"tf{self.tag}v{k}" for k, h in enumerate(self.hosts, 1)}

    # ---- queries
    @property
    def namespaces(self):
        return [self._ns[h] for h in self.hosts]

    def namespace_of(self, host):
        """Namespace name of `host` (its address, or its 1-based index)."""
        if isinstance(host, int):
            host = self.hosts[host - 1]
        try:
            return self._ns[host]
        except KeyError:
            raise KeyError(f"{host!r} is not a host of cluster {self.tag}") from None

    def veth_of(self, host):
        return self._veth[self.hosts[host - 1] if isinstance(host, int) else host]

    def pids_on(self, host):
        """PIDs of the processes running inside `host`'s namespace."""
        return netns_pids(self.namespace_of(host))

    def describe(self):
        return {"subnet": self.subnet, "supervisor_addr": self.supervisor_addr,
                "hosts": list(self.hosts), "namespaces": self.namespaces,
                "bridge": self.bridge}

    def hostfile(self, path, slots=1):
        """Writes an Open MPI hostfile naming every host with `slots` slots; returns path."""
        with open(path, "w") as f:
            for h in self.hosts:
                f.write(f"{h} slots={slots}\n")
        return path

    def mpirun_flags(self):
        """mpirun options that start one orted per host through scripts/netns_rsh.sh and keep
        every Open MPI connection (launcher and TCP BTL) on the cluster's subnet."""
        return ["--allow-run-as-root", "--oversubscribe",
                "--mca", "plm_rsh_agent", os.path.realpath(RSH_AGENT),
                "--mca", "oob_tcp_if_include", self.subnet,
                "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", self.subnet,
                "--bind-to", "none"]

    # ---- faults
    def partition(self, host):
        """Cuts `host` off the network (root-side veth down); its processes keep running."""
        _ip("link", "set", self.veth_of(host), "down")

    def heal(self, host):
        _ip("link", "set", self.veth_of(host), "up")

    def run_on(self, host, argv, **popen_kwargs):
        """Starts argv inside `host`'s namespace; returns the subprocess.Popen (its pid is the
        process in the namespace: `ip netns exec` execs argv)."""
        return subprocess.Popen(["ip", "netns", "exec", self.namespace_of(host), *argv],
                                **popen_kwargs)

    def check_connectivity(self, timeout=3.0):
        """Every host reaches the supervisor address and every other host over TCP (a tiny
        listener in the root namespace, then one in each host). Raises NetnsError if not."""
        code = ("import socket,sys\n"
                "s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=%g)\n"
                "s.close()\n" % timeout)
        for target_ns, addr in [(None, self.supervisor_addr)] + [
                (self._ns[h], h) for h in self.hosts]:
            srv = self._listener(target_ns, addr)
            try:
                ready, _, _ = select.select([srv.stdout], [], [], timeout + 5)
                port = srv.stdout.readline().strip() if ready else ""
                if not port.isdigit():
                    raise NetnsError(f"listener on {addr} did not start")
                for h in self.hosts:
                    r = subprocess.run(["ip", "netns", "exec", self._ns[h], sys.executable,
                                        "-c", code, addr, port], capture_output=True,
                                       text=True, timeout=timeout + 5)
                    if r.returncode != 0:
                        raise NetnsError(f"{h} cannot reach {addr}:{port}: "
                                         f"{r.stderr.strip().splitlines()[-1:]}")
            finally:
                srv.kill()
                srv.wait(timeout=5)

    def _listener(self, ns, addr):
        code = ("import socket,sys\n"
                "s=socket.socket(); s.bind((sys.argv[1],0)); s.listen(64)\n"
                "print(s.getsockname()[1], flush=True)\n"
                "while True: s.accept()[0].close()\n")
        argv = [sys.executable, "-c", code, addr]
        if ns:
            argv = ["ip", "netns", "exec", ns, *argv]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)

    # ---- lifecycle
    def _leftovers(self):
        found = [ns for ns in netns_list() if re.fullmatch(rf"tf{self.tag}h\d+", ns)]
        found += self._our_links()
        return found

    def _our_links(self):
        out = _ip("-o", "link", "show", check=False)
        names = [m.group(1) for m in re.finditer(r"^\d+:\s+([^:@\s]+)", out, re.M)]
        return [n for n in names if n == self.bridge or re.fullmatch(rf"tf{self.tag}v\d+", n)]

    def _setup(self):
        nf = bridge_netfilter_report()
        if nf["bridge_nf_call_iptables"] == "1" and nf["ip_tables"]:
            # Bridged IPv4 goes through iptables here (a machine-wide setting this harness does
            # not change): rules there could drop traffic between the hosts.
            print(f"netns_cluster: warning: net.bridge.bridge-nf-call-iptables=1 and iptables "
                  f"tables {nf['ip_tables']} are loaded; check_connectivity() tells whether "
                  f"they block the cluster", file=sys.stderr)
        # Refuse a subnet that is already routed here (another cluster, a VPN, ...).
        routes = _ip("-4", "route", "show", "table", "all", check=False)
        if re.search(rf"(^|\s){re.escape(self.prefix)}\.\d+", routes):
            raise NetnsError(f"subnet {self.subnet} is already in use on this machine")
        br = self.bridge
        _ip("link", "add", br, "type", "bridge", "stp_state", "0", "forward_delay", "0")
        self._contain(br)
        _ip("addr", "add", f"{self.supervisor_addr}/24", "dev", br)
        _ip("link", "set", br, "up")
        for k, h in enumerate(self.hosts, 1):
            ns, veth = self._ns[h], self._veth[h]
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._contain(veth)
            _ip("link", "set", veth, "master", br)
            _ip("link", "set", veth, "up")
            # IPv6 off inside (no link-local chatter), then the rest in one `ip` process.
            _ip("netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1")
            _ip("-n", ns, "-batch", "-", input=(
                "link set lo up\n"
                f"addr add {h}/24 dev eth0\n"
                "link set eth0 up\n"
                f"route add default via {self.supervisor_addr} dev eth0\n"))
        os.makedirs(HINT_DIR, exist_ok=True)
        for h in self.hosts:
            with open(os.path.join(HINT_DIR, h), "w") as f:
                f.write(self._ns[h] + "\n")

    @staticmethod
    def _contain(dev):
        """No IPv6 and no IPv4 forwarding for packets arriving on `dev` (root namespace)."""
        _write_sysctl(f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6", "1")
        _write_sysctl(f"/proc/sys/net/ipv4/conf/{dev}/forwarding", "0")

    def teardown(self):
        """Kills every process left in the namespaces, then deletes namespaces, veths, bridge,
        the netns_rsh.sh hints and the Open MPI session directories netns_rsh.sh gave them. Idempotent. Returns {namespace: [killed pids]}."""
        killed = {}
        errors = []
        spaces = [n for n in netns_list() if re.fullmatch(rf"tf{self.tag}h\d+", n)]
        for ns in spaces:
            try:
                killed[ns] = kill_netns_processes(ns)
            except NetnsError as e:
                errors.append(str(e))
        if any(killed.values()):
            # Let the FINs/RSTs of the killed processes' sockets cross the bridge before the
            # links go: a peer outside (mpirun in the root namespace) that misses them keeps a
            # dead connection open until TCP keepalive notices (minutes).
            time.sleep(0.3)
        for ns in spaces:
            _ip("netns", "del", ns, check=False)
            shutil.rmtree(rsh_tmpdir(ns), ignore_errors=True)
        for name in sorted(self._our_links(), key=lambda n: n == self.bridge):
            _ip("link", "del", name, check=False)
        for h in self.hosts:
            try:
                with open(os.path.join(HINT_DIR, h)) as f:
                    mine = f.read().strip() == self._ns[h]
                if mine:
                    os.unlink(os.path.join(HINT_DIR, h))
            except OSError:
                pass
        left = self._leftovers()
        if errors or left:
            raise NetnsError("teardown incomplete: " + "; ".join(errors + left))
        return killed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.teardown()
        return False


def bridge_netfilter_report():
    """Whether bridged IPv4 goes through iptables, and whether any iptables table exists."""
    call = _read_sysctl("/proc/sys/net/bridge/bridge-nf-call-iptables")
    tables = _read_sysctl("/proc/net/ip_tables_names")
    return {"bridge_nf_call_iptables": call, "ip_tables": (tables or "").split(),
            "ip_forward": _read_sysctl("/proc/sys/net/ipv4/ip_forward")}


def _teardown_tag(tag):
    """Tears down whatever exists of cluster `tag` (any host count), without creating it."""
    c = NetnsCluster.__new__(NetnsCluster)
    c._names(99, tag)
    return c.teardown()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="create a cluster and leave it up; prints JSON")
    up.add_argument("--hosts", type=int, required=True)
    up.add_argument("--tag", required=True)
    up.add_argument("--reclaim", action="store_true", help="tear down leftovers of this tag first")
    down = sub.add_parser("down", help="tear a cluster down (kills processes inside it)")
    down.add_argument("--tag", required=True)
    chk = sub.add_parser("check", help="up, TCP connectivity test, down")
    chk.add_argument("--hosts", type=int, default=3)
    chk.add_argument("--tag", required=True)
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("netns_cluster: needs root", file=sys.stderr)
        return 2
    try:
        if a.cmd == "up":
            c = NetnsCluster(a.hosts, a.tag, reclaim=a.reclaim)
            print(json.dumps(c.describe()))
        elif a.cmd == "down":
            killed = _teardown_tag(a.tag)
            print(json.dumps({"killed": killed}))
        else:
            t0 = time.monotonic()
            with NetnsCluster(a.hosts, a.tag) as c:
                t_up = time.monotonic() - t0
                c.check_connectivity()
                print(json.dumps({**c.describe(), "setup_s": round(t_up, 3), "connectivity": "ok",
                                  **bridge_netfilter_report()}))
    except (NetnsError, ValueError) as e:
        print(f"netns_cluster: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
