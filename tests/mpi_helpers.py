"""Shared pieces of the tests that start `mpiexec`: finding the launcher,
and the environment its processes get."""
import os
import pathlib
import shutil
import sys

import cynorm


def find_mpiexec():
    """The mpiexec next to this Python (the mpi extra's mpich), else on PATH, or None."""
    bin_dir = os.path.dirname(sys.executable)
    return shutil.which("mpiexec", path=bin_dir + os.pathsep + os.environ.get("PATH", ""))


def launch_env():
    """os.environ for an mpiexec run: one OpenMP thread per process, the
    cynorm these tests import on PYTHONPATH, and, as root, Open MPI's
    documented override of its refusal to run as root (containers and
    the lent GPU machines run tests as root; MPICH ignores the variables)."""
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(pathlib.Path(cynorm.__file__).parents[1]),
                                           os.environ.get("PYTHONPATH", "")]))
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env
