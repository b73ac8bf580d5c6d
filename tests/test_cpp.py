"""Runs the C++ unit-test executable built and installed with the package."""

import subprocess
from pathlib import Path

import revolta


def test_cpp_unit_tests():
    exe = Path(revolta.__file__).parent / "bin" / "revolta_unit_tests"
    assert exe.is_file()
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 failed" in proc.stdout
