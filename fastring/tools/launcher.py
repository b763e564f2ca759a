"""`fastring-run`: start N ranks of a command through the mpiexec installed beside this Python.

Example:
    fastring-run -np 2 python -c "import fastring; fastring.init(); print(fastring.rank())"
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys


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
    p.add_argument("--timeline", help="write a Chrome-trace timeline to this path (FASTRING_TIMELINE)")
    p.add_argument("--fusion-threshold-mb", type=float, help="fusion buffer size in MiB")
    p.add_argument("--cycle-time-ms", type=float, help="ms between negotiation cycles")
    p.add_argument("--stall-check-time", type=float, help="seconds before a stall warning")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return p


def build_command(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """The mpiexec command line and environment for fastring-run's arguments.

    Example:
        >>> cmd, env = build_command(["-np", "2", "--cycle-time-ms", "5", "python", "x.py"])
        >>> cmd[1:], env["FASTRING_CYCLE_TIME"]
        (['-n', '2', 'python', 'x.py'], '5.0')
    """
    args = _parser().parse_args(argv)
    if args.np < 1:
        raise SystemExit(f"fastring-run: -np must be at least 1, got {args.np}")
    if not args.command:
        raise SystemExit("fastring-run: no command given")
    if args.hosts and args.hostfile:
        raise SystemExit("fastring-run: give either -H or --hostfile, not both")
    env = dict(os.environ)
    # Console scripts of this environment (fastring-bench, ...) must resolve on every rank.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    for value, key in ((args.timeline, "FASTRING_TIMELINE"),
                       (args.cycle_time_ms, "FASTRING_CYCLE_TIME"),
                       (args.stall_check_time, "FASTRING_STALL_CHECK_TIME")):
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
    return cmd + command, env


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the job's exit code."""
    cmd, env = build_command(sys.argv[1:] if argv is None else argv)
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
