"""The `fastring-run` command: fastring's launcher (`fastring.tools.launcher.main`) in a
process that does not start MPI.

Importing the `fastring` package imports `mpi4py.MPI`, which calls MPI_Init; the launcher only
starts mpiexec and is not a rank. Started anyway, MPI cost the command 30-50 ms and made
MPICH create its shared-memory segment for this process, which a SIGKILL of the launcher left
in /dev/shm. So this module, outside the package, tells mpi4py not to start (or finalize) MPI
before anything imports the package.

Example:
    fastring-run -np 2 python train.py
"""
import sys

import mpi4py

mpi4py.rc.initialize = False
mpi4py.rc.finalize = False

from fastring.tools.launcher import main  # noqa: E402  (after mpi4py.rc is set)

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
