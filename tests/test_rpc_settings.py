"""``rpc.tuning: auto`` in real ranks: what its settings do to the process, not just its environment."""

from __future__ import annotations

import textwrap

import pytest
from conftest import rpcctl, write_config

pytestmark = pytest.mark.timeout(120)

# How many blocks glibc maps on its own (mmap) for an 8 MiB buffer: 1 with its defaults, 0 once
# MALLOC_MMAP_THRESHOLD_ is above 8 MiB (the buffer then comes from the heap, and is reused).
MAPPED_BLOCKS = textwrap.dedent(
    """
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    before = libc.mallinfo2().hblks
    buffer = bytearray(8 << 20)
    print("mapped blocks:", libc.mallinfo2().hblks - before)
    """
)


@pytest.mark.parametrize(("tuning", "mapped"), [("off", 1), ("auto", 0)])
def test_auto_malloc_settings_take_effect_in_a_forked_rank(tmp_path, tuning, mapped):
    # Ranks are forked from rpcctl's fork server, which started before the rank's environment
    # existed: glibc never saw MALLOC_MMAP_THRESHOLD_ there, so the rank applies it itself.
    script = tmp_path / "mapped.py"
    script.write_text(MAPPED_BLOCKS)
    config = write_config(tmp_path, script=str(script), nproc_per_node=1, rpc={"tuning": tuning})
    result = rpcctl("launch", str(config), "--no-live", "--runs-dir", str(tmp_path / "runs"))
    assert result.returncode == 0, result.stderr
    assert f"[rank0]: mapped blocks: {mapped}" in result.stdout
