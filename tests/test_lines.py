"""A rank's output split as a terminal shows it (rpcctl.base.lines) and the log pump that uses it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import tracemalloc

from rpcctl.base.lines import LineSplitter, Piece, final_lines
from rpcctl.processes.procs import LogPump


def pieces(*chunks: bytes, max_bytes: int = 8192) -> list[tuple[str, bool, bool]]:
    splitter = LineSplitter(max_bytes)
    out: list[Piece] = []
    for chunk in chunks:
        out += splitter.feed(chunk)
    out += splitter.close()
    return [(p.text, p.new, p.final) for p in out]


def test_plain_lines_are_one_piece_each_new_and_final():
    assert pieces(b"a\nb\n\nc") == [("a", True, True), ("b", True, True), ("", True, True), ("c", True, True)]


def test_a_bar_redrawn_with_cr_yields_every_state_once_and_one_final_line():
    bar = b"\rstep 1 loss=0.9\rstep 2 loss=0.8\rstep 3 loss=0.7\n"
    assert pieces(bar) == [
        ("step 1 loss=0.9", True, False),
        ("step 2 loss=0.8", True, False),
        ("step 3 loss=0.7", True, True),
    ]


def test_a_trailing_cr_keeps_the_last_state_without_delivering_it_twice():
    assert pieces(b"epoch 1 loss=0.7\r\n") == [("epoch 1 loss=0.7", True, False), ("epoch 1 loss=0.7", False, True)]


def test_chunk_boundaries_do_not_matter():
    data = b"\rA 1\rA 2\r\nline two\r\rB 1\rB 2\n"
    whole = pieces(data)
    assert pieces(*(data[i : i + 1] for i in range(len(data)))) == whole
    assert pieces(data[:5], data[5:11], data[11:]) == whole


def test_a_cleared_bar_then_a_message_is_the_message():
    # tqdm.write (Hugging Face's dict lines): clear the bar with spaces, print, redraw the bar.
    data = b"\r 12%|#         | 1/8\r                    \r{'loss': '1.9'}\n\r 25%|##        | 2/8"
    assert pieces(data) == [
        (" 12%|#         | 1/8", True, False),
        ("{'loss': '1.9'}", True, True),
        (" 25%|##        | 2/8", True, True),
    ]


def test_terminal_control_sequences_are_removed():
    # Keras 3 into a pipe: bold/colour codes, a bar, backspaces, then \r and the next state.
    data = (
        b"\r\x1b[1m1/4\x1b[0m \x1b[32m\xe2\x94\x81\x1b[0m - loss: 16.6\x08\x08\x08"
        b"\r\x1b[1m4/4\x1b[0m - loss: 6.1 \n\x1b]0;title\x07ok\n"
    )
    assert pieces(data) == [("1/4 ━ - loss: 16.6", True, False), ("4/4 - loss: 6.1 ", True, True), ("ok", True, True)]


def test_a_long_line_is_cut_for_the_console_and_says_how_much_the_log_file_has():
    assert pieces(b"x" * 100 + b"\nshort\n", max_bytes=10) == [
        ("x" * 10 + " … [90 more bytes in the log file]", True, True),
        ("short", True, True),
    ]
    # Every \r state is cut on its own: a cut never swallows the separators.
    assert [t for t, _, _ in pieces(b"a" * 30 + b"\r" + b"b" * 5 + b"\n", max_bytes=10)] == [
        "a" * 10 + " … [20 more bytes in the log file]",
        "b" * 5,
    ]


def test_final_lines_are_what_rpcctl_logs_prints(tmp_path):
    from rpcctl.base.log_times import RankLogReader, lines_of

    data = b"start\n" + b"".join(b"\rtrain %d/100 loss=%d" % (i, i) for i in range(100)) + b"\n" + b"end\n"
    assert final_lines(data) == ["start", "train 99/100 loss=99", "end"]
    log = tmp_path / "rank-0.log"
    log.write_bytes(data[:1000])  # a bar half drawn: only its finished lines, then the rest
    reader = RankLogReader(0, log)
    assert [line.text for line in reader.new_lines()] == ["start"]
    log.write_bytes(data)
    assert [line.text for line in lines_of(reader, final=True)] == ["train 99/100 loss=99", "end"]


def test_the_pump_keeps_every_byte_in_the_file_and_bounded_memory_on_a_line_without_newline(tmp_path):
    """12 MB of tqdm-like ``\\r`` states and then 12 MB with no separator at all, through a real
    pipe and the real pump: the log file gets every byte; the pump's own memory stays bounded
    (it once kept the whole unfinished line, and split it again on every read)."""
    total = 12_000_000
    writer = (
        "import os\n"
        "state = b'\\rtrain:  42%|####2     | 420/1000 [00:01<00:02, 300.00it/s, loss=0.123]'\n"
        f"block = state * (65536 // len(state))\n"
        f"n = 0\nwhile n < {total}: os.write(1, block); n += len(block)\n"
        "os.write(1, b'\\n')\n"
        f"blob = b'x' * 65536\n"
        f"n = 0\nwhile n < {total}: os.write(1, blob); n += len(blob)\n"
        "os.write(1, b'\\nbye\\n')\n"
    )
    got: list[Piece] = []
    states = 0
    done = threading.Event()

    def on_piece(_rank: int, piece: Piece) -> None:
        nonlocal states
        if piece.final:
            got.append(piece)
        else:
            states += 1
        if piece.text == "bye":
            done.set()

    pump = LogPump(on_piece)
    log_path = tmp_path / "rank-0.log"
    tracemalloc.start()
    try:
        pump.start()
        write_fd = pump.add(0, log_path)
        child = subprocess.Popen([sys.executable, "-c", writer], stdout=write_fd)
        os.close(write_fd)
        assert child.wait(timeout=300) == 0
        pump.drain(timeout=300)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert done.is_set()
    size = log_path.stat().st_size
    assert size > 2 * total  # every byte, in the file
    assert peak < 4_000_000, f"the pump held {peak} bytes for a line without a newline"
    assert states > 150_000  # each \r state delivered (for the loss parser)
    assert [p.text for p in got][-1] == "bye"
    long_line = got[-2].text
    assert long_line.startswith("x" * 100) and "more bytes in the log file]" in long_line and len(long_line) < 10_000
