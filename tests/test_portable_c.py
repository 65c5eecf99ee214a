"""The hand-written C builds as for a CPU without the x86 vector routes (ext/csrc with LK_NO_X86)."""
from __future__ import annotations

import shlex
import subprocess
import sysconfig
from pathlib import Path

CSRC = Path(__file__).resolve().parents[1] / "ext" / "csrc"


def test_the_native_sources_compile_without_the_x86_routes(tmp_path):
    """On ARM and other CPUs only the plain-C routes exist: anything the x86 sections alone define
    (a setting, a helper, a header an intrinsics include brought in) breaks that build, and no test
    on an x86 machine runs it otherwise. Each file is compiled to an object with LK_NO_X86 set."""
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    sources = sorted(CSRC.glob("*.c"))
    assert sources
    for src in sources:
        out = subprocess.run([*cc, "-std=c11", "-pthread", "-DLK_NO_X86", "-Werror=implicit-function-declaration",
                              "-I", str(CSRC), "-c", str(src), "-o", str(tmp_path / (src.stem + ".o"))],
                             capture_output=True, text=True)
        assert out.returncode == 0, f"{src.name}:\n{out.stderr}"
