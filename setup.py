"""Build the Cython units of ``cortex/_fast``.

Switches (environment variables):
  CORTEX_CYTHON_ANNOTATE=1  write an HTML annotation next to every .pyx (``cython -a``)
  CORTEX_CYTHON_DEBUG=1     bounds/wraparound checks on, line tracing, -O0 -g: the debug build
"""
import os
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = Path(__file__).parent
FAST = HERE / "cortex" / "_fast"
DEBUG = os.environ.get("CORTEX_CYTHON_DEBUG") == "1"
ANNOTATE = os.environ.get("CORTEX_CYTHON_ANNOTATE") == "1"

directives = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": not DEBUG,
    "embedsignature": True,
}
macros = [("XXH_INLINE_ALL", None)]
cflags = ["-O3"] if not DEBUG else ["-O0", "-g"]
if DEBUG:
    directives["linetrace"] = True
    macros.append(("CYTHON_TRACE_NOGIL", "1"))

extensions = [
    Extension(
        f"cortex._fast.{pyx.stem}",
        [str(pyx.relative_to(HERE))],
        include_dirs=[str((FAST / "vendor" / "xxhash").relative_to(HERE))],
        define_macros=macros,
        extra_compile_args=cflags,
    )
    for pyx in sorted(FAST.glob("*.pyx"))
]

# Generated C carries the build mode (line tracing, checks): re-cythonize whenever it changes,
# so a release build never compiles C left behind by a debug build, or the other way round.
MODE_STAMP = FAST / ".build-mode"
MODE = "debug" if DEBUG else "release"
mode_changed = not MODE_STAMP.exists() or MODE_STAMP.read_text() != MODE
MODE_STAMP.write_text(MODE)

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives=directives,
        annotate=ANNOTATE,
        force=mode_changed,
    )
)
