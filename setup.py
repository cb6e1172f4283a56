"""Build script for the optional compiled part: deinsum's streaming GEMMs (``deinsum/runtime/_stream.c``),
a plain shared library that ``deinsum.runtime.libraries`` loads through ctypes, threaded with OpenMP.
Without a C compiler (or OpenMP) the build skips it (``optional=True``) and every GEMM runs on BLAS.
The rest is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("deinsum.runtime._stream", ["deinsum/runtime/_stream.c"],
                             extra_compile_args=["-O3", "-fopenmp"], extra_link_args=["-fopenmp"], optional=True)])
