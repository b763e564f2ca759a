"""A simulated cluster on one Linux machine: H hosts as network namespaces, each joined to a
bridge by a veth pair whose outbound traffic `tc` shapes to a link rate and delay.

`fastring-run --sim-hosts H` (fastring/tools/launcher.py) uses it to run a multi-host job on
one machine. MPICH's hydra starts one proxy per "host" through `-launcher ssh
-launcher-exec <script>`, where the script runs the proxy inside the host's namespace with
`ip netns exec`, so MPI sees H nodes (COMM_TYPE_SHARED groups the ranks of one namespace)
and every byte between hosts crosses a shaped veth link. MPI must be told to move those bytes
over TCP (`environment()`): otherwise UCX, seeing one machine, would use shared memory and
the shaping would do nothing.

What it creates, all named after the launching process's pid so that parallel runs do not
collide, is all it touches: namespaces `fastring-<pid>-<i>`, a bridge `fr<pid>b`, host-side
veth ends `fr<pid>h<i>` (the other end is `eth0` inside its namespace), their qdiscs, a
private /24 that exists only on the bridge and in the namespaces (chosen among 10.213.0.0/16
where no route or address of this machine overlaps it), and a temporary directory holding
the launcher script. `remove()` deletes all of it; the launcher calls it in a `finally`.

Example (as root):
    with SimCluster(2, rate="2gbit") as cluster:
        subprocess.run([mpiexec, *cluster.mpiexec_options(1), "-n", "2", "hostname"],
                       env={**os.environ, **cluster.environment()})
"""
from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import re
import shutil
import subprocess
import tempfile

# Where new /24s are taken from: private space, skipped where anything here already routes.
SUBNET_POOL = ipaddress.ip_network("10.213.0.0/16")
NAMESPACE_IFNAME = "eth0"
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$", re.IGNORECASE)
_DELAY = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$", re.IGNORECASE)
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
# The token bucket holds this long at the link rate (at least one 64 KiB GSO packet, which
# tbf would otherwise split or drop) and queues up to TBF_LATENCY before dropping.
TBF_BURST_SECONDS = 0.0005
TBF_MIN_BURST = 1 << 17
TBF_LATENCY = "50ms"
NETEM_LIMIT = 100000  # packets netem may hold while delaying them (its default, 1000, drops)
_TOOL_DIRS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")


class SimClusterError(RuntimeError):
    """A simulated cluster cannot be made (no root, no ip/tc, a name taken, bad option); the
    message is one line for the user."""


def rate_bits(rate: str) -> float:
    """Bits per second of a tc rate such as '10gbit'; SimClusterError if it is not one.

    Example:
        >>> rate_bits("2.5gbit")
        2500000000.0
    """
    m = _RATE.match(rate)
    if not m:
        raise SimClusterError(f"--link-rate {rate!r} is not a rate such as 10gbit, 500mbit")
    value = float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]
    if value <= 0:
        raise SimClusterError(f"--link-rate must be positive, got {rate!r}")
    return value


def check_delay(delay: str) -> str:
    """`delay` if it is a tc time such as '50us' or '1ms'; SimClusterError otherwise.

    Example:
        >>> check_delay("50us")
        '50us'
    """
    if not _DELAY.match(delay):
        raise SimClusterError(f"--link-delay {delay!r} is not a time such as 50us, 1ms")
    return delay


def tool(name: str) -> str:
    """The path of `ip` or `tc` (often in /usr/sbin, outside a user's PATH); SimClusterError
    if there is none.

    Example:
        >>> tool("ip").endswith("/ip")
        True
    """
    found = shutil.which(name) or shutil.which(name, path=os.pathsep.join(_TOOL_DIRS))
    if found is None:
        raise SimClusterError(f"--sim-hosts needs the `{name}` command (package iproute2), and it is not installed")
    return found


class SimCluster:
    """H simulated hosts; `create()` builds them, `remove()` deletes everything created
    (also what a failed `create()` left), and the context manager does both."""

    def __init__(self, hosts: int, rate: str | None = None, delay: str | None = None, tag: int | None = None):
        if hosts < 1:
            raise SimClusterError(f"--sim-hosts must be at least 1, got {hosts}")
        self.hosts = hosts
        self.rate = rate
        self.rate_bits = rate_bits(rate) if rate is not None else None
        self.delay = check_delay(delay) if delay is not None else None
        tag = os.getpid() if tag is None else tag
        self.namespaces = [f"fastring-{tag}-{i}" for i in range(hosts)]
        self.bridge = f"fr{tag}b"
        self.links = [f"fr{tag}h{i}" for i in range(hosts)]
        if max(map(len, [self.bridge, *self.links])) > 15:  # IFNAMSIZ - 1
            raise SimClusterError(f"interface names for tag {tag} are longer than Linux allows")
        self.addresses: list[str] = []
        self.bridge_address = ""
        self._made: list[tuple[str, str]] = []  # ("netns" | "link", name), in creation order
        self._dir: str | None = None
        self._ip = self._tc = ""

    # ------------------------------------------------------------------ building

    def create(self) -> None:
        """Build the namespaces, links, addresses and qdiscs; SimClusterError (one line) if
        this process is not root, ip/tc are missing, or a name is taken. What was built
        before a failure stays recorded for `remove()`."""
        if os.geteuid() != 0:
            raise SimClusterError("--sim-hosts needs root (it creates network namespaces); run it as root")
        self._ip, self._tc = tool("ip"), tool("tc")
        taken = set(self._run(self._ip, "netns", "list").split())
        for ns in self.namespaces:
            if ns in taken:
                raise SimClusterError(f"network namespace {ns} already exists; remove it with `ip netns del {ns}`")
        for name in (self.bridge, *self.links):
            if self._exists(name):
                raise SimClusterError(f"network interface {name} already exists; remove it with `ip link del {name}`")
        # Held while a free /24 is chosen and the bridge takes it, so that two launches never
        # pick the same: a lock on the temporary directory, which needs no file of its own.
        lock = os.open(tempfile.gettempdir(), os.O_RDONLY)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            subnet = self._free_subnet()
            hosts = subnet.hosts()
            self.bridge_address = str(next(hosts))
            self.addresses = [str(next(hosts)) for _ in range(self.hosts)]
            self._ip_do("link", "add", self.bridge, "type", "bridge", made=("link", self.bridge))
            self._ip_do("addr", "add", f"{self.bridge_address}/{subnet.prefixlen}", "dev", self.bridge)
        finally:
            os.close(lock)
        self._ip_do("link", "set", self.bridge, "up")
        for ns, link, address in zip(self.namespaces, self.links, self.addresses):
            self._ip_do("netns", "add", ns, made=("netns", ns))
            self._ip_do("link", "add", link, "type", "veth", "peer", "name", NAMESPACE_IFNAME,
                        "netns", ns, made=("link", link))
            self._ip_do("link", "set", link, "master", self.bridge, "up")
            self._ip_do("-n", ns, "addr", "add", f"{address}/{subnet.prefixlen}", "dev", NAMESPACE_IFNAME)
            self._ip_do("-n", ns, "link", "set", NAMESPACE_IFNAME, "up")
            self._ip_do("-n", ns, "link", "set", "lo", "up")
            self._shape(ns)
        self._dir = tempfile.mkdtemp(prefix="fastring-sim-")
        self._write_launcher()

    def _free_subnet(self) -> ipaddress.IPv4Network:
        """The first /24 of SUBNET_POOL, from a pid-dependent start, that overlaps no route
        or address of this machine (all routing tables), with room for the hosts."""
        if self.hosts + 1 > 253:
            raise SimClusterError(f"--sim-hosts {self.hosts}: at most 252 hosts fit in one /24")
        used = []
        for args in (("-4", "route", "show", "table", "all"), ("-4", "addr", "show")):
            for word in self._run(self._ip, *args).split():
                try:
                    used.append(ipaddress.ip_network(word.replace("default", "0.0.0.0/0"), strict=False))
                except ValueError:
                    pass
        used = [n for n in used if n.prefixlen > 0]  # a default route overlaps everything
        subnets = list(SUBNET_POOL.subnets(new_prefix=24))
        start = os.getpid() % len(subnets)
        for subnet in subnets[start:] + subnets[:start]:
            if not any(subnet.overlaps(n) for n in used):
                return subnet
        raise SimClusterError(f"no free /24 left in {SUBNET_POOL} for --sim-hosts")

    def _shape(self, ns: str) -> None:
        """The host's outbound link: netem for the delay, tbf for the rate (under netem when
        both), on the namespace's end, so each direction of each link is shaped once."""
        dev = ("dev", NAMESPACE_IFNAME)
        tc = ("netns", "exec", ns, self._tc, "qdisc", "add", *dev)
        if self.delay is not None:
            try:
                self._ip_do(*tc, "root", "handle", "1:", "netem", "delay", self.delay, "limit", str(NETEM_LIMIT))
            except SimClusterError as e:
                if "qdisc kind is unknown" in str(e):
                    raise SimClusterError("--link-delay needs the netem qdisc (kernel module sch_netem), "
                                          "which this kernel lacks") from None
                raise
        if self.rate_bits is not None:
            burst = max(TBF_MIN_BURST, int(self.rate_bits / 8 * TBF_BURST_SECONDS))
            parent = ("parent", "1:1") if self.delay is not None else ("root",)
            self._ip_do(*tc, *parent, "handle", "10:", "tbf", "rate", self.rate, "burst", str(burst),
                        "latency", TBF_LATENCY)

    def _write_launcher(self) -> None:
        """The script hydra runs instead of ssh: `script [-opts] HOST COMMAND...` runs COMMAND
        (hydra's proxy) in HOST's namespace through a shell, as ssh would."""
        cases = "\n".join(f"  {a}) ns={ns} ;;" for a, ns in zip(self.addresses, self.namespaces))
        text = f"""#!/bin/sh
# fastring-run --sim-hosts: hydra's ssh launcher, into a network namespace instead of a host.
while [ "${{1#-}}" != "$1" ]; do shift; done
host=$1; shift
case $host in
{cases}
  *) echo "fastring-run: unknown simulated host $host" >&2; exit 255 ;;
esac
exec {self._ip} netns exec "$ns" /bin/sh -c "$*"
"""
        path = self.launcher_script
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o700)

    @property
    def launcher_script(self) -> str:
        return os.path.join(self._dir or "", "launch-in-namespace")

    # ------------------------------------------------------------------ using

    def mpiexec_options(self, ranks_per_host: int) -> list[str]:
        """hydra options that place `ranks_per_host` ranks on each simulated host.

        Example:
            >>> c = SimCluster(2, tag=7); c.addresses, c.bridge_address = ["10.0.0.2", "10.0.0.3"], "10.0.0.1"
            >>> c.mpiexec_options(2)[-2:]
            ['-hosts', '10.0.0.2:2,10.0.0.3:2']
        """
        return ["-launcher", "ssh", "-launcher-exec", self.launcher_script, "-localhost", self.bridge_address,
                "-hosts", ",".join(f"{a}:{ranks_per_host}" for a in self.addresses)]

    @staticmethod
    def environment() -> dict[str, str]:
        """What makes MPICH move bytes between namespaces over TCP through eth0 (UCX is the
        wheel's default netmod; FI_PROVIDER covers MPIR_CVAR_CH4_NETMOD=ofi).

        Example:
            >>> SimCluster.environment()["UCX_TLS"]
            'tcp,self'
        """
        return {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": NAMESPACE_IFNAME, "FI_PROVIDER": "tcp"}

    def link_bytes(self) -> list[int]:
        """Bytes each host has sent through its link so far (its interface's counter)."""
        sent = []
        for ns in self.namespaces:
            stats = json.loads(self._run(self._ip, "-n", ns, "-s", "-j", "link", "show", "dev", NAMESPACE_IFNAME))
            sent.append(int(stats[0]["stats64"]["tx"]["bytes"]))
        return sent

    # ------------------------------------------------------------------ removing

    def remove(self) -> list[str]:
        """Delete everything `create` made, newest first (a namespace takes its veth end, and
        with it the host end and the qdiscs); returns one line per thing that could not be
        removed (empty when all is gone)."""
        problems = []
        for kind, name in reversed(self._made):
            if kind == "netns":
                result = subprocess.run([self._ip, "netns", "del", name], capture_output=True, text=True)
            else:
                if not self._exists(name):
                    continue  # went with its namespace
                result = subprocess.run([self._ip, "link", "del", name], capture_output=True, text=True)
            if result.returncode != 0 and (kind == "netns" or self._exists(name)):
                problems.append(f"could not remove {kind} {name}: {result.stderr.strip()}")
        self._made.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        return problems

    def __enter__(self) -> SimCluster:
        try:
            self.create()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    # ------------------------------------------------------------------ helpers

    def _exists(self, ifname: str) -> bool:
        return subprocess.run([self._ip or tool("ip"), "link", "show", "dev", ifname],
                              capture_output=True).returncode == 0

    def _ip_do(self, *args: str, made: tuple[str, str] | None = None) -> None:
        result = subprocess.run([self._ip, *args], capture_output=True, text=True)
        if result.returncode != 0:
            raise SimClusterError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")
        if made is not None:
            self._made.append(made)

    @staticmethod
    def _run(*cmd: str) -> str:
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise SimClusterError(f"`{' '.join(cmd)}` failed: {result.stderr.strip()}")
        return result.stdout
