"""`fastring-run`: start N ranks of a command through the mpiexec installed beside this Python.

Example:
    fastring-run -np 2 python -c "import fastring; fastring.init(); print(fastring.rank())"

With --sim-hosts H the job runs on H simulated hosts of this machine (root only; see
fastring/tools/simcluster.py), which are removed afterwards whatever happens.

Failure behaviour (the README's "Failure behaviour" section says the same for users):

* A rank that ends with a non-zero exit code or an uncaught exception ends the job with that
  code. MPICH's hydra alone does not: a Python rank finalizes MPI at exit, and MPI_Finalize
  waits for every other rank, so a `sys.exit(3)` on one rank while the others waited in a
  barrier hung the job. fastring-run runs Python ranks under a small guard (`run_rank`, this
  file run as a script) that stops the job with MPI_Abort(code) `--exit-grace` seconds after
  the failure.
* A rank killed by signal N ends the job with exit code N and hydra's "BAD TERMINATION" banner.
* SIGINT (Ctrl-C) or SIGTERM to fastring-run stops every rank within a second and exits 130
  (143 for SIGTERM).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time

# First argument of this file run as a script to become the guard of one rank (see run_rank).
RANK_FLAG = "--as-rank"
GRACE_ENV = "FASTRING_EXIT_GRACE"
JOB_ENV = "FASTRING_RUN_JOB"  # names the job in its ranks' environment (remove_unmapped_segments)
# The processes of MPICH's process manager: its proxy (the ranks' parent) and mpiexec, both of
# which write a job's topology file (remove_topology_files).
HYDRA_PROXY = "hydra_pmi_proxy"
HYDRA_PROCESSES = (HYDRA_PROXY, "mpiexec", "mpiexec.hydra")
DEFAULT_GRACE = 2.0
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)*)?$")
# One-letter interpreter options without an argument; -h -i -V -? run no program, so a command
# using them is left as it is.
_PYTHON_FLAGS = set("bBdEIOPqRsSuvx")


def mpiexec_path() -> str:
    """The mpiexec of the MPI that fastring was installed with (next to sys.executable).

    Example:
        >>> mpiexec_path().endswith("mpiexec")
        True
    """
    for directory in (os.path.dirname(sys.executable), os.path.join(sys.prefix, "bin")):
        candidate = os.path.join(directory, "mpiexec")
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError("no mpiexec beside this Python or on PATH; install the `mpich` package")
    return found


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fastring-run",
        description="Run COMMAND on N ranks through the installed MPI's mpiexec.")
    p.add_argument("-np", "--num-proc", dest="np", type=int, required=True, help="number of ranks")
    p.add_argument("-H", "--hosts", help="comma-separated host:slots list, e.g. a:2,b:2")
    p.add_argument("--hostfile", help="file with one 'host[:slots]' per line")
    p.add_argument("--sim-hosts", type=int, metavar="H",
                   help="simulate H hosts on this machine (root; network namespaces joined by "
                        "shaped veth links, MPI over TCP), -np / H ranks on each")
    p.add_argument("--link-rate", help="with --sim-hosts: each host's outbound rate, e.g. 10gbit")
    p.add_argument("--link-delay", help="with --sim-hosts: each host's outbound delay, e.g. 50us")
    p.add_argument("--link-stats", action="store_true",
                   help="with --sim-hosts: print the bytes each host sent over its link")
    p.add_argument("--timeline", help="write a Chrome-trace timeline to this path (FASTRING_TIMELINE)")
    p.add_argument("--fusion-threshold-mb", type=float, help="fusion buffer size in MiB")
    p.add_argument("--cycle-time-ms", type=float, help="ms between negotiation cycles")
    p.add_argument("--stall-check-time", type=float, help="seconds before a stall warning")
    p.add_argument("--exit-grace", type=float,
                   help=f"seconds from a Python rank's failure to its stopping the job, for the "
                        f"others to write their last output (default {DEFAULT_GRACE:g}; {GRACE_ENV})")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return p


def build_command(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """The mpiexec command line and environment for fastring-run's arguments.

    Example:
        >>> cmd, env = build_command(["-np", "2", "--cycle-time-ms", "5", "sh", "x.sh"])
        >>> cmd[1:], env["FASTRING_CYCLE_TIME"]
        (['-n', '2', 'sh', 'x.sh'], '5.0')
        >>> build_command(["-np", "2", "python", "x.py"])[0][5:]   # [4] is this file: the rank guard
        ['--as-rank', 'x.py']
    """
    args = _parser().parse_args(argv)
    if args.np < 1:
        raise SystemExit(f"fastring-run: -np must be at least 1, got {args.np}")
    if not args.command:
        raise SystemExit("fastring-run: no command given")
    if args.hosts and args.hostfile:
        raise SystemExit("fastring-run: give either -H or --hostfile, not both")
    if args.sim_hosts is not None:
        if args.hosts or args.hostfile:
            raise SystemExit("fastring-run: --sim-hosts places the ranks itself; drop -H/--hostfile")
        if args.sim_hosts < 1 or args.np % args.sim_hosts:
            raise SystemExit(f"fastring-run: -np {args.np} must be a positive multiple of --sim-hosts {args.sim_hosts}")
    elif args.link_rate or args.link_delay or args.link_stats:
        raise SystemExit("fastring-run: --link-rate, --link-delay and --link-stats need --sim-hosts")
    if args.exit_grace is not None and args.exit_grace < 0:
        raise SystemExit(f"fastring-run: --exit-grace must not be negative, got {args.exit_grace}")
    env = dict(os.environ)
    # Console scripts of this environment (fastring-bench, ...) must resolve on every rank.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    for value, key in ((args.timeline, "FASTRING_TIMELINE"),
                       (args.cycle_time_ms, "FASTRING_CYCLE_TIME"),
                       (args.stall_check_time, "FASTRING_STALL_CHECK_TIME"),
                       (args.exit_grace, GRACE_ENV)):
        if value is not None:
            env[key] = str(value)
    if args.fusion_threshold_mb is not None:
        env["FASTRING_FUSION_THRESHOLD"] = str(int(args.fusion_threshold_mb * 1024 * 1024))
    cmd = [mpiexec_path(), "-n", str(args.np)]
    if args.hosts:
        cmd += ["-hosts", args.hosts]
    if args.hostfile:
        if not os.path.isfile(args.hostfile):
            raise SystemExit(f"fastring-run: hostfile {args.hostfile!r} does not exist")
        cmd += ["-f", args.hostfile]
    command = args.command[1:] if args.command[0] == "--" else args.command
    if not command:
        raise SystemExit("fastring-run: no command given")
    return cmd + guard_command(command, path=env["PATH"]), env


# ---------------------------------------------------------------------------- the rank guard

def guard_command(command: list[str], path: str | None = None) -> list[str]:
    """`command` run under the rank guard (`run_rank`) when it runs a Python program: a
    `python`/`python3.X` command or a script whose `#!` line names one (console scripts such as
    fastring-bench), looked up on `path`. Any other command is returned unchanged.

    Example:
        >>> g = guard_command(["python", "-u", "train.py", "--lr", "0.1"])
        >>> g[0], g[1], g[2].endswith("launcher.py"), g[3:]
        ('python', '-u', True, ['--as-rank', 'train.py', '--lr', '0.1'])
        >>> guard_command(["hostname"])
        ['hostname']
        >>> guard_command(["python", "-i"])   # interactive: no program to guard
        ['python', '-i']
    """
    command = list(command)
    if not _PYTHON_NAME.match(os.path.basename(command[0])):
        script = shutil.which(command[0], path=path)
        interpreter = _python_of_script(script) if script else None
        if interpreter is None:
            return command
        command = [*interpreter, script, *command[1:]]
        if len(interpreter) > 1:  # '#!/usr/bin/env python3': env's argument is the interpreter
            command = command[1:]
    split = _split_python_args(command[1:])
    if split is None:
        return command
    options, program = split
    return [command[0], *options, os.path.abspath(__file__), RANK_FLAG, *program]


def _python_of_script(path: str) -> list[str] | None:
    """The interpreter words of `path`'s `#!` line when they name Python, else None."""
    try:
        with open(path, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if words and _PYTHON_NAME.match(os.path.basename(words[0])):
        return words[:1]
    if len(words) == 2 and os.path.basename(words[0]) == "env" and _PYTHON_NAME.match(words[1]):
        return words
    return None


def _split_python_args(args: list[str]) -> tuple[list[str], list[str]] | None:
    """(interpreter options, program and its arguments) of the words after `python`, where the
    program is `-c CODE`, `-m MODULE`, `-` or a script; None when there is no program.

    Example:
        >>> _split_python_args(["-u", "-X", "dev", "-Wignore", "x.py", "-v"])
        (['-u', '-X', 'dev', '-Wignore'], ['x.py', '-v'])
        >>> _split_python_args(["-uc", "print(1)"])
        (['-u'], ['-c', 'print(1)'])
    """
    i = 0
    while i < len(args):
        word = args[i]
        if word == "-" or not word.startswith("-"):
            return args[:i], args[i:]
        if word.startswith("--"):
            if word != "--check-hash-based-pycs":
                return None  # --help, --version, ...
            i += 2
            continue
        for j, letter in enumerate(word[1:], start=1):
            if letter in "cm":  # the program: split it from the options before it, e.g. -uc
                options = args[:i] + ([word[:j]] if j > 1 else [])
                return options, [f"-{letter}", *([word[j + 1:]] if word[j + 1:] else []), *args[i + 1:]]
            if letter in "WX":
                i += j == len(word) - 1  # '-W arg': the next word is the option's argument
                break
            if letter not in _PYTHON_FLAGS:
                return None
        i += 1
    return None


def run_rank(program: list[str]) -> None:
    """Run `program` (`-c CODE`, `-m MODULE`, `-` or a script, with its arguments) as
    `python PROGRAM` would, and make sure a failure ends the whole job instead of hanging it.

    When the program ends with a non-zero exit code or an uncaught exception (traceback
    printed as Python prints it) in a job of several ranks, the rank runs its atexit handlers
    (fastring's shutdown among them) and, FASTRING_EXIT_GRACE seconds (2 by default) after the
    failure, stops the job with MPI_Abort and that exit code, which fastring-run returns. The
    grace lets ranks that fail at the same time write their last output. A rank that fails
    before starting MPI starts it first: the others wait for it in MPI_Init, and hydra ignores
    ranks that never started MPI. fastring-run starts Python ranks this way:

    Example:
        fastring-run -np 2 python -c "import sys; from mpi4py import MPI; MPI.COMM_WORLD.rank or MPI.COMM_WORLD.Barrier(); sys.exit(3)"
        # stderr: fastring-run: rank 1 exited with code 3; stopping the job
        # exit code 3, about 2 s after rank 1 ended
    """
    try:
        # Only mpi4py's runner, not mpi4py.MPI: the program decides when (and whether) MPI starts.
        from mpi4py.run import run_command_line
    except ImportError:
        # An interpreter without mpi4py: its program cannot hang in mpi4py's MPI_Finalize, so
        # it runs unguarded, with the interpreter options it was given.
        argv = getattr(sys, "orig_argv", [sys.executable, RANK_FLAG, *program])
        flag = argv.index(RANK_FLAG)
        os.execv(sys.executable, [*argv[:max(flag - 1, 1)], *argv[flag + 1:]])
    # This file's directory must not shadow the program's imports; the runner sets a script's
    # own directory, and Python puts the working directory first for -c, -m and -.
    sys.path[0] = os.getcwd()
    try:
        run_command_line(program)
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException as e:  # noqa: BLE001 - print it as Python would, then leave with 1 (130 on ^C)
        e = e.with_traceback(_user_frames(e.__traceback__))
        sys.excepthook(type(e), e, e.__traceback__)
        code = 130 if isinstance(e, KeyboardInterrupt) else 1
    else:
        code = 0
    if code and int(os.environ.get("PMI_SIZE", "1")) > 1:
        _leave_job(code, int(os.environ.get("PMI_RANK", "0")))
    sys.exit(code)


def _exit_code(code: object) -> int:
    """The exit status of `SystemExit(code)`, printing a message code as Python does."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _user_frames(tb):
    """`tb` without the guard's and runpy's frames above the program's first one."""
    import runpy

    from mpi4py import run as runner
    ours = {os.path.abspath(__file__), runpy.__file__, runner.__file__, "<frozen runpy>"}
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    return tb


def _leave_job(code: int, rank: int) -> None:
    """The failure path of `run_rank` in a job of several ranks (PMI_SIZE, set by hydra): end
    the job with MPI_Abort(`code`) after the grace, never through MPI_Finalize.

    Why not finalize and let hydra notice: MPI_Finalize waits for every rank, so a rank that
    ends while the others wait for it in a collective hangs the job; and when a rank leaves
    without finalizing (os._exit), hydra does stop the job, but with three ranks or more it
    often reports a killed rank's 9 as the job's exit code. MPI_Abort's code is the job's, and
    MPI_Abort must come before MPI_Finalize, so the grace is a wait, not a rendezvous."""
    import atexit
    import ctypes
    import threading

    import mpi4py
    grace = float(os.environ.get(GRACE_ENV, DEFAULT_GRACE))
    started = "mpi4py.MPI" in sys.modules and sys.modules["mpi4py.MPI"].Is_initialized()
    if not started:
        mpi4py.rc.initialize = False  # loaded only to reach libmpi; started through ctypes below
    from mpi4py import MPI
    if MPI.Is_finalized():
        return  # the program finalized MPI itself: hydra sees an ordinary exit

    # Said now, not when aborting: on MPI_Abort hydra stops forwarding the rank's output, and
    # what it printed last (this line, MPICH's own "Abort(...)") was lost in one run of six.
    print(f"fastring-run: rank {rank} exited with code {code}; stopping the job", file=sys.stderr)
    _flush_stdio()

    def stop_job() -> None:
        _flush_stdio()
        if MPI.Is_initialized():
            MPI.COMM_WORLD.Abort(code)
        os._exit(code)  # MPI_Init never returned: the others never started MPI either

    watchdog = threading.Timer(grace, stop_job)
    watchdog.daemon = True
    watchdog.start()
    if not started:
        # The others wait for this rank in MPI_Init, and hydra ignores a rank that never
        # started MPI: start it (through ctypes, which releases the GIL for the watchdog,
        # as mpi4py's MPI_Init would not), then stop the job at once.
        ctypes.CDLL(MPI.__file__).MPI_Init(None, None)
        stop_job()
    # Meanwhile, the program's atexit handlers (fastring's shutdown among them, which other
    # ranks' shutdown may wait for) run here, once, instead of at interpreter exit; then the
    # rest of the grace lets ranks that are exiting too write their last output.
    atexit._run_exitfuncs()
    atexit._clear()
    _flush_stdio()
    watchdog.join()


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


# ---------------------------------------------------------------------------- starting and stopping

def start_job(cmd: list[str], **popen_kwargs) -> subprocess.Popen:
    """Start an mpiexec command line in its own session, so that a Ctrl-C in the terminal
    reaches only the caller, which decides how to stop the job (`stop_job`); and (on Linux)
    so that mpiexec gets SIGTERM, and hydra stops the ranks, if the caller dies.

    Example:
        >>> p = start_job([mpiexec_path(), "-n", "1", "true"])
        >>> p.wait()
        0
    """
    def in_child() -> None:
        # Popen copies the caller's signal mask: main blocks SIGINT/SIGTERM around the start.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        if prctl is not None:
            prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    prctl = None
    if sys.platform.startswith("linux"):
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=in_child, **popen_kwargs)


def stop_job(proc: subprocess.Popen, grace: float = 0.5) -> int:
    """Stop the mpiexec `proc` and every process it started on this host; returns how many
    ranks (children of a hydra proxy) were running. Hydra stops all ranks, remote ones too,
    on SIGTERM; whatever is left here after `grace` seconds gets SIGKILL. Ranks sit in
    sessions of their own (hydra's proxy calls setsid), so a process-group kill would miss them.

    Example:
        >>> p = start_job([mpiexec_path(), "-n", "2", "sleep", "60"])
        >>> stop_job(p) in (0, 1, 2), p.poll() is not None   # 0-1 if asked while starting
        (True, True)
    """
    if proc.poll() is not None:
        return 0  # reaped: its pid may belong to another process by now; hydra cleaned up
    # Unreaped, so the pid is still mpiexec's; its tree must be read before it exits, after
    # which its orphans no longer descend from it.
    tree = _descendants(proc.pid)
    ranks = sum(1 for p in tree if p[2])
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if not _wait_gone(tree, grace):
        for p in tree:
            if _alive(p):
                try:
                    os.kill(p[0], signal.SIGKILL)
                except ProcessLookupError:
                    pass
        _wait_gone(tree, grace)
    return ranks


def _wait_gone(processes: list[tuple[int, str, bool]], timeout: float) -> bool:
    """Whether all `processes` ended within `timeout` seconds. They are not our children, so
    there is nothing to wait on but /proc, polled every 10 ms up to the deadline."""
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in processes):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields from the state on ([0] state, [1] ppid, [19] start time), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _descendants(root: int) -> list[tuple[int, str, bool]]:
    """(pid, start time, is a rank) of every process below `root`, from /proc (empty without it)."""
    children: dict[int, list[tuple[int, str]]] = {}
    for pid in _pids():
        fields = _stat(pid)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append((pid, fields[19]))
    found, todo = [], [root]
    while todo:
        parent = todo.pop()
        is_rank = _comm(parent) == HYDRA_PROXY
        for pid, start in children.get(parent, ()):
            found.append((pid, start, is_rank))
            todo.append(pid)
    return found


def _alive(process: tuple[int, str, bool]) -> bool:
    """Whether this very process (same pid and start time) still runs; a zombie has ended."""
    fields = _stat(process[0])
    return fields is not None and fields[19] == process[1] and fields[0] != "Z"


class _Stop(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_stop(signum, frame):
    raise _Stop(signum)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the job's exit code, 128 + N after signal N
    (SIGINT, SIGTERM) stopped it. With --sim-hosts the job runs in a simulated cluster
    (fastring/tools/simcluster.py) that is removed whatever happens, Ctrl-C included.

    Example:
        >>> main(["-np", "2", "python", "-c", "import sys; sys.exit(3)"])
        3
    """
    argv = sys.argv[1:] if argv is None else argv
    cmd, env = build_command(argv)
    args = _parser().parse_args(argv)
    if args.sim_hosts is None:
        return _run(cmd, env)
    from .simcluster import SimCluster, SimClusterError
    previous = {s: signal.signal(s, _raise_stop) for s in _STOP_SIGNALS}
    cluster = None
    try:
        cluster = SimCluster(args.sim_hosts, rate=args.link_rate, delay=args.link_delay)
        cluster.create()
        cmd[1:1] = cluster.mpiexec_options(args.np // args.sim_hosts)
        env.update(cluster.environment())
        code = _run(cmd, env)
        if args.link_stats:
            for i, sent in enumerate(cluster.link_bytes()):
                print(f"fastring-run: host {i} ({cluster.addresses[i]}) sent {sent} bytes", file=sys.stderr)
        return code
    except SimClusterError as e:
        print(f"fastring-run: {e}", file=sys.stderr)
        return 2
    except _Stop as stop:  # while the hosts were made, before the job started
        what = "interrupted" if stop.signum == signal.SIGINT else "terminated"
        print(f"fastring-run: {what} while making the simulated hosts", file=sys.stderr, flush=True)
        return 128 + stop.signum
    finally:
        for s in _STOP_SIGNALS:  # a Ctrl-C must not cut the cleanup short
            signal.signal(s, signal.SIG_IGN)
        problems = cluster.remove() if cluster is not None else []
        for line in problems:
            print(f"fastring-run: {line}", file=sys.stderr)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _prefix(prefix: str | None, default: str) -> str:
    """`prefix`, or else the value of fastring/_core/config.py's `default`."""
    if prefix is not None:
        return prefix
    # imported here: this file also runs as each rank's guard, alone, outside the package
    from fastring._core import config
    return getattr(config, default)


def _named(prefix: str) -> set[str]:
    """The paths of the files whose names start with `prefix` (a folder, then a name's start)."""
    folder, stem = os.path.split(prefix)
    try:
        return {os.path.join(folder, f) for f in os.listdir(folder) if f.startswith(stem)}
    except OSError:
        return set()


def mpi_segments(prefix: str | None = None) -> set[str]:
    """The paths of MPI's shared-memory segments (their names start with `prefix`, by default
    MPICH's: fastring/_core/config.py)."""
    return _named(_prefix(prefix, "MPI_SEGMENT_PREFIX"))


def topology_files(prefix: str | None = None) -> set[str]:
    """The paths of the topology files MPICH's process manager wrote for its jobs (their names
    start with `prefix`, by default HYDRA_TOPOLOGY_PREFIX: fastring/_core/config.py)."""
    return _named(_prefix(prefix, "HYDRA_TOPOLOGY_PREFIX"))


def another_job_runs(job: str | None = None) -> bool:
    """Whether a process of MPICH's process manager (HYDRA_PROCESSES) runs on this host for
    another job than `job` (JOB_ENV; None: for any job). One that is exiting, its environment
    gone with its memory, does not count; one whose environment this process may not read
    does.

    Example:
        >>> another_job_runs("no such job") in (True, False)
        True
    """
    for pid in _pids():
        if _comm(pid) in HYDRA_PROCESSES:
            try:
                environment = _environment(pid)
            except PermissionError:
                return True
            if environment and (job is None or _job_entry(job) not in environment):
                return True
    return False


def remove_topology_files(before: set[str], prefix: str | None = None, job: str | None = None) -> list[str]:
    """Unlink the topology files that appeared since `before` (`topology_files`) and return
    their paths: a job's process manager removes its own as the job ends, but not when it is
    killed, as it is when a failing rank stops the job. Removes nothing while another job
    runs (`another_job_runs`), whose ranks may still be reading theirs.

    Example:
        >>> remove_topology_files(set(), prefix="/nonexistent/hydra_hwloc_xmlfile_")
        []
    """
    from fastring._core.shm_files import unlink_each  # here: see _prefix

    new = topology_files(prefix) - before
    if not new or another_job_runs(job):
        return []
    return unlink_each(new)


def remove_unmapped_segments(before: set[str], prefix: str | None = None,
                             job: str | None = None) -> list[str]:
    """Unlink the MPI segments that appeared since `before` and that no process maps, and
    return their paths: what a job's ranks leave when they die before fastring's `init`
    (which unlinks the name) or never start fastring. A segment some process still maps (a
    job beside this one) stays; the processes whose environment holds JOB_ENV=`job` (the
    finished job's ranks, some perhaps not yet gone) do not count.

    Example:
        >>> remove_unmapped_segments(set(), prefix="/nonexistent/mpich_shm_")
        []
    """
    from fastring._core.shm_files import mapped_under, unlink_each  # here: see _prefix

    prefix = _prefix(prefix, "MPI_SEGMENT_PREFIX")
    new = mpi_segments(prefix) - before
    if not new:
        return []
    mapped = set()
    for pid in _pids():
        maps = f"/proc/{pid}/maps"
        found = mapped_under(prefix, maps) & new
        if found and job is not None:
            if _in_job(pid, job):
                continue
            # A rank of the job that was exiting has an empty environment once its memory
            # is gone, and then its maps are empty too: read them again after it.
            found = mapped_under(prefix, maps) & new
        mapped |= found
    return unlink_each(new - mapped)


def _pids() -> list[int]:
    """Every process's pid, from /proc (none without it)."""
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _environment(pid: int) -> list[bytes]:
    """Process `pid`'s environment as NAME=value entries (none once it is gone or exiting);
    PermissionError where this process may not read it."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return [entry for entry in f.read().split(b"\0") if entry]
    except PermissionError:
        raise
    except OSError:
        return []


def _job_entry(job: str) -> bytes:
    return f"{JOB_ENV}={job}".encode()


def _in_job(pid: int, job: str) -> bool:
    try:
        return _job_entry(job) in _environment(pid)
    except PermissionError:
        return False


def _run(cmd: list[str], env: dict[str, str]) -> int:
    """Run the job; on SIGINT/SIGTERM stop every rank and return 128 + the signal. MPI
    segments and topology files the job left behind are removed after it
    (`remove_unmapped_segments`, `remove_topology_files`)."""
    segments, topology, job = mpi_segments(), topology_files(), f"{os.getpid()}-{time.monotonic_ns()}"
    env = {**env, JOB_ENV: job}
    # Blocked until the handlers are set, so a Ctrl-C while the job starts is handled like
    # any other: it arrives at the unblocking below, inside the try.
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        proc = start_job(cmd, env=env)
    except BaseException:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        raise
    previous = {s: signal.signal(s, _raise_stop) for s in _STOP_SIGNALS}
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        return proc.wait()
    except _Stop as stop:
        for s in _STOP_SIGNALS:  # a second Ctrl-C must not cut the cleanup short
            signal.signal(s, signal.SIG_IGN)
        stopped = stop_job(proc)
        what = "interrupted" if stop.signum == signal.SIGINT else "terminated"
        print(f"fastring-run: {what}; stopped {stopped} ranks", file=sys.stderr, flush=True)
        return 128 + stop.signum
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        remove_unmapped_segments(segments, job=job)
        remove_topology_files(topology, job=job)


if __name__ == "__main__":
    if sys.argv[1:2] == [RANK_FLAG]:
        run_rank(sys.argv[2:])
    else:
        sys.exit(main())
