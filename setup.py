"""Builds the native core in ext/ into ``lookupdec._native``.

Hand-written C lives in ext/csrc/; Cython sources (.pyx) in ext/. The .c files
that Cython generates next to the .pyx are build outputs and are not tracked.
"""
import glob

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension(
        "lookupdec._native",
        sources=["ext/_native.pyx", *sorted(glob.glob("ext/csrc/*.c"))],
        # Rebuild when a header or an included .pxi changes, not only a .c file.
        depends=[*sorted(glob.glob("ext/csrc/*.h")), *sorted(glob.glob("ext/*.pxi"))],
        include_dirs=["ext/csrc", np.get_include()],
        extra_compile_args=["-O3", "-std=c11", "-pthread"],
        extra_link_args=["-pthread", "-ldl"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False, "cdivision": True},
    )
)
