"""bench/kernels_ab.py builds both kernels and compares them (no timing is asserted): against HEAD
the outputs of an unchanged type agree, and bad arguments get one line."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nexttok.cpu import cpu_flags

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "kernels_ab.py"


needs = pytest.mark.skipif(
    "avx2" not in cpu_flags() or not shutil.which("g++") or not (ROOT / ".git").exists(),
    reason="needs an AVX2 CPU, g++ and this repository's git history")


def run(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *arguments], capture_output=True, text=True, timeout=300)


@needs
def test_compares_this_tree_with_a_commit():
    done = run("--against", "HEAD", "--types", "Q8_0,Q4_K", "--rows", "1,3", "--shape", "16,512", "--rounds", "2",
               "--isa", "avx2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("B = this tree (avx2), A = HEAD (avx2); 16x512 weights, 1 thread(s), 2 rounds")
    assert [line.split()[:2] for line in lines[1:]] == [["Q8_0", "1"], ["Q8_0", "3"], ["Q4_K", "1"], ["Q4_K", "3"]]
    for line in lines[1:]:
        assert "x A (" in line, line
        diff, largest = line.split("differ by ")[1].split(" of ")
        assert float(diff) <= 1e-5 * float(largest), line  # the same kernels but for summation order


@needs
@pytest.mark.skipif(not {"avx512_vnni", "amx_int8"} <= cpu_flags(), reason="needs AVX-512 VNNI and AMX-INT8")
def test_compares_amx_with_vnni():
    """B's AMX steps (16 rows) against A's vpdpbusd ones: the same integers, so the same bits."""
    done = run("--against", "HEAD", "--isa", "amx", "--against-isa", "avx512-vnni", "--types", "Q4_0,Q6_K",
               "--rows", "16", "--shape", "16,512", "--rounds", "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("B = this tree (amx), A = HEAD (avx512-vnni); 16x512 weights")
    assert len(lines) == 3 and all("outputs differ by 0 of" in line for line in lines[1:]), lines


@needs
@pytest.mark.parametrize(("arguments", "message"), [
    (("--against", "HEAD", "--types", "Q4_K,Q9_9"), "unknown type 'Q9_9'"),
    (("--against", "HEAD", "--shape", "512"), "--shape takes N,K"),
    (("--against", "HEAD", "--shape", "12,512"), "N must be a multiple of 8"),
    (("--against", "HEAD", "--rows", "0"), "rows, --threads and --rounds at least 1"),
    (("--against", "no-such-commit",), "git cannot show qkern.h at no-such-commit"),
])
def test_bad_arguments_get_one_line(arguments, message):
    done = run(*arguments)
    assert done.returncode != 0
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
