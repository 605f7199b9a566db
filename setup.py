"""Build the Cython units of ``cortex/_fast``.

Switches (environment variables):
  CORTEX_CYTHON_ANNOTATE=1  write an HTML annotation next to every .pyx (``cython -a``)
  CORTEX_CYTHON_DEBUG=1     bounds/wraparound checks on, line tracing, -O0 -g: the debug build
  CORTEX_CYTHON_SKIP=1      no extensions at all: the Makefile's editable install, after which
                            `make build` compiles them in place (once, not a second time)

Every compiler builds with the C errors GCC 14 turned on by default (``STRICT_C_ERRORS``), so
code that GCC 14 or clang would refuse fails on older compilers too instead of warning.
"""
import os
import subprocess
import tempfile
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
FAST = HERE / "cortex" / "_fast"
DEBUG = os.environ.get("CORTEX_CYTHON_DEBUG") == "1"
SKIP = os.environ.get("CORTEX_CYTHON_SKIP") == "1"
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
if not SKIP:
    MODE_STAMP.write_text(MODE)

# Diagnostics GCC 14 made errors by default (its "Porting to GCC 14" list), as errors for every
# compiler. Each entry lists alternatives, first accepted wins: GCC < 14 and clang have no
# -Wreturn-mismatch, whose cases (a value returned from a void function, none from a non-void
# one) they report under -Wreturn-type; -Wdeclaration-missing-parameter-type is GCC 14's alone.
STRICT_C_ERRORS = (
    ("-Werror=incompatible-pointer-types",),
    ("-Werror=implicit-function-declaration",),
    ("-Werror=int-conversion",),
    ("-Werror=implicit-int",),
    ("-Werror=return-mismatch", "-Werror=return-type"),
    ("-Werror=declaration-missing-parameter-type",),
)


def accepts_flag(compiler_argv, flag):
    """Whether the compiler (``compiler_argv``: its command line without sources) knows
    ``flag``: GCC refuses an unknown -Werror=... (non-zero exit), clang warns about it, naming
    it; anything else it says about a trivial unit (e.g. Python's own flags) does not count."""
    with tempfile.TemporaryDirectory(prefix="cortex-cflag-") as tmp:
        source, obj = Path(tmp) / "probe.c", Path(tmp) / "probe.o"
        source.write_text("int cortex_probe(void) { return 0; }\n")
        try:
            done = subprocess.run([*compiler_argv, flag, "-c", str(source), "-o", str(obj)],
                                  capture_output=True, text=True)
        except OSError:
            return False
        return done.returncode == 0 and flag.removeprefix("-Werror=") not in done.stderr


class StrictBuildExt(build_ext):
    """``build_ext`` adding the accepted ``STRICT_C_ERRORS`` to every extension."""

    def build_extensions(self):
        argv = getattr(self.compiler, "compiler_so", None)  # Unix compilers (gcc, clang)
        strict = []
        for alternatives in STRICT_C_ERRORS if argv else ():
            strict.extend(next(([f] for f in alternatives if accepts_flag(argv, f)), []))
        for ext in self.extensions:
            ext.extra_compile_args = [*ext.extra_compile_args, *strict]
        super().build_extensions()


setup(
    ext_modules=[] if SKIP else cythonize(
        extensions,
        compiler_directives=directives,
        annotate=ANNOTATE,
        force=mode_changed,
    ),
    cmdclass={"build_ext": StrictBuildExt},
)
