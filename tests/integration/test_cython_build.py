"""setup.py builds the Cython units with the C errors GCC 14 turned on by default.

GCC 14 (Debian 13's default) refuses incompatible pointer types, implicit function
declarations, int/pointer conversions, implicit int and mismatched returns; older compilers
only warn, so setup.py makes them errors everywhere (``STRICT_C_ERRORS``). The first test
builds a unit committing each of them with the default compiler and expects every one refused;
the second builds Cortex's own units with each newer compiler installed here (clang: Debian
package ``clang``; ``gcc-14`` where the distribution has it) and expects no such diagnostic.
Both build in a copy of setup.py and ``cortex/_fast`` under ``tmp_path``, never in the checkout.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAST = REPO / "cortex" / "_fast"
STRICT_CLASSES = {
    "incompatible-pointer-types",
    "implicit-function-declaration",
    "int-conversion",
    "implicit-int",
    "return-mismatch",
    "return-type",  # GCC < 14 and clang report GCC 14's return-mismatch cases under this name
    "declaration-missing-parameter-type",
}

# One C function per class, embedded verbatim in a .pyx (Cython passes it through untouched).
OFFENDING_PYX = '''
cdef extern from *:
    """
    int cortex_bad_pointer(void) { int i = 0; long long *p = &i; return (int)*p; }
    int cortex_bad_call(void) { return cortex_never_declared(1); }
    int cortex_bad_conversion(void) { char *p = 42; return p != 0; }
    cortex_bad_implicit_int(void) { return 0; }
    int cortex_bad_return(void) { return; }
    """
    int cortex_bad_pointer()

def probe():
    return cortex_bad_pointer()
'''


def diagnostics(output: str) -> dict[str, set[str]]:
    """``{"error" | "warning": {diagnostic class, ...}}`` from gcc's or clang's output, a class
    being the name in ``[-Werror=NAME]`` (gcc), ``[-Werror,-WNAME]`` (clang) or ``[-WNAME]``."""
    found: dict[str, set[str]] = {"error": set(), "warning": set()}
    for line in output.splitlines():
        head = re.search(r"\b(error|warning):", line)
        tail = re.search(r"\[-W(?:error[=,](?:-W)?)?([\w-]+)\]\s*$", line)
        if head and tail:
            found[head.group(1)].add(tail.group(1))
    return found


def build_copy(root: Path, sources: dict[str, str] | None, compiler: str | None) -> str:
    """Copy setup.py and the build inputs of ``cortex/_fast`` under ``root`` (``sources``, if
    given, replace the .pyx units), build in place there; return the combined output."""
    fast = root / "cortex" / "_fast"
    fast.mkdir(parents=True)
    shutil.copy2(REPO / "setup.py", root / "setup.py")
    shutil.copytree(FAST / "vendor", fast / "vendor")
    if sources is None:
        # Generated C and the mode stamp keep their times, so only a stale unit is re-cythonized.
        for path in FAST.iterdir():
            if path.suffix in {".pyx", ".pxd", ".pxi", ".c"} or path.name == ".build-mode":
                shutil.copy2(path, fast / path.name)
    else:
        for name, text in sources.items():
            (fast / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORTEX_CYTHON_")}
    if compiler is not None:
        env["CC"] = compiler
    done = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace", "--force"],
        cwd=root, env=env, capture_output=True, text=True, timeout=900,
    )
    return f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"


def test_the_build_refuses_what_gcc_14_refuses(tmp_path):
    output = build_copy(tmp_path, {"offending.pyx": OFFENDING_PYX}, None)
    assert not output.startswith("exit 0"), output
    refused = diagnostics(output)["error"]
    assert {"incompatible-pointer-types", "implicit-function-declaration", "int-conversion",
            "implicit-int"} <= refused, output
    assert refused & {"return-mismatch", "return-type"}, output


NEWER_COMPILERS = [
    pytest.param(name, marks=pytest.mark.skipif(shutil.which(name) is None,
                                                 reason=f"{name} not installed"))
    for name in ("clang", "gcc-14")
]


@pytest.mark.slow
@pytest.mark.parametrize("compiler", NEWER_COMPILERS)
def test_cortex_units_build_cleanly_with_a_newer_compiler(tmp_path, compiler):
    output = build_copy(tmp_path, None, compiler)
    assert output.startswith("exit 0"), output
    assert f"\n{compiler} " in output, "the build did not use the compiler asked for"
    found = diagnostics(output)
    assert not (found["error"] | found["warning"]) & STRICT_CLASSES, output
