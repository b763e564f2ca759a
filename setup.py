"""Build the Cython transport package (one extension per fastring/_transport/*.pyx) against
the MPI of the `mpich` wheel.

mpi.h and libmpi are found through the installed `mpich` distribution's own file list, so
no compiler wrapper (mpicc), system MPI or flag is needed. libmpi is linked without an rpath:
the build environment is temporary, and at run time `import mpi4py.MPI` (done first by
fastring/__init__.py) has already loaded the same libmpi.so.12.
"""
import glob
import importlib.metadata
import os

import mpi4py
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup


def mpich_paths():
    dist = importlib.metadata.distribution("mpich")
    for f in dist.files or ():
        if str(f).replace("\\", "/").endswith("include/mpi.h"):
            header = os.path.realpath(dist.locate_file(f))
            prefix = os.path.dirname(os.path.dirname(header))
            return os.path.dirname(header), os.path.join(prefix, "lib")
    raise RuntimeError("the installed `mpich` distribution ships no include/mpi.h")


include_dir, lib_dir = mpich_paths()
extensions = [
    Extension(
        "fastring._transport." + os.path.splitext(os.path.basename(source))[0],
        [source],
        include_dirs=[include_dir, mpi4py.get_include(), numpy.get_include()],
        library_dirs=[lib_dir],
        libraries=["mpi"],
        extra_compile_args=["-O2"],
    )
    for source in sorted(glob.glob("fastring/_transport/*.pyx"))
]
# the api's queued plain allreduce in C (no MPI)
extensions.append(Extension("fastring.api._lean", ["fastring/api/_lean.pyx"], include_dirs=[numpy.get_include()],
                            extra_compile_args=["-O2"]))
# fastring.jax's XLA FFI handler: C API structs declared in fastring/jax/xla_ffi.h, no jaxlib.
extensions.append(Extension("fastring.jax._xla_ffi", ["fastring/jax/_xla_ffi.pyx"],
                            include_dirs=["fastring/jax", numpy.get_include()], extra_compile_args=["-O2"]))
setup(ext_modules=cythonize(extensions, compiler_directives={"language_level": 3}))
