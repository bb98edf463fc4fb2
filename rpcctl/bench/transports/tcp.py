"""A raw TCP socket echo with preallocated buffers: the floor for a socket transport.

Rank 1 listens on MASTER_ADDR:MASTER_PORT (loopback for a single node) and rank 0 connects;
``TCP_NODELAY`` on both ends. Before each batch rank 0 sends a header (bytes, calls) and rank 1
then echoes exactly that many messages: ``recv_into`` a buffer allocated once per batch,
``sendall`` it back. No framing, no serialisation, no allocation per message: whatever any
socket-based transport adds on top of this is its own overhead.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from rpcctl.bench.transports import RankContext, Transport, register

HEADER = struct.Struct("!QQ")  # bytes per message, calls (0 calls: stop)
CONNECT_TIMEOUT_S = 60.0
# Rank 0 writes every in-flight request before it reads a reply; past this many bytes the two
# sides could both block in send (nobody reading), so larger pipelines are refused.
MAX_PIPELINED_BYTES = 256 * 1024


def recv_exactly(sock: socket.socket, view: memoryview) -> None:
    while view:
        n = sock.recv_into(view)
        if n == 0:
            raise ConnectionError("peer closed the connection")
        view = view[n:]


class TcpTransport(Transport):
    kind = "tcp"
    summary = "raw socket echo, preallocated (the floor)"
    ops = {"latency": ("echo",), "payload": ("echo",), "throughput": ("echo",)}

    def setup(self, ctx: RankContext) -> None:
        self.ctx = ctx
        if ctx.rank == 1:
            with socket.create_server((ctx.master_addr, ctx.master_port), reuse_port=False) as server:
                server.settimeout(CONNECT_TIMEOUT_S)
                self.sock, _ = server.accept()
            self.sock.settimeout(None)
        elif ctx.rank == 0:
            deadline = time.monotonic() + CONNECT_TIMEOUT_S
            while True:
                try:
                    self.sock = socket.create_connection((ctx.master_addr, ctx.master_port), timeout=5)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            self.sock.settimeout(None)
        else:
            self.sock = None
            return
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def prepare(self, op: str, payload: Any, calls: int, in_flight: int) -> None:
        import torch

        nbytes = payload.numel() * payload.element_size()
        if min(in_flight, calls) > 1 and min(in_flight, calls) * nbytes > MAX_PIPELINED_BYTES:
            raise ValueError(
                f"tcp: {in_flight} in flight × {nbytes} bytes is too much to pipeline without a reader thread"
            )
        self.sock.sendall(HEADER.pack(nbytes, calls))
        self._reply = torch.empty_like(payload)
        self._reply_view = memoryview(self._reply.numpy()).cast("B")

    def issue(self, op: str, payload: Any) -> Any:
        self.sock.sendall(memoryview(payload.numpy()).cast("B"))
        return None

    def wait(self, op: str, handle: Any) -> Any:
        recv_exactly(self.sock, self._reply_view)
        return self._reply

    def serve(self) -> None:
        if self.sock is None:
            return
        header = bytearray(HEADER.size)
        while True:
            recv_exactly(self.sock, memoryview(header))
            nbytes, calls = HEADER.unpack(header)
            if calls == 0:
                return
            buffer = memoryview(bytearray(nbytes))
            for _ in range(calls):
                recv_exactly(self.sock, buffer)
                self.sock.sendall(buffer)

    def stop(self) -> None:
        self.sock.sendall(HEADER.pack(0, 0))

    def teardown(self) -> None:
        if self.sock is not None:
            self.sock.close()


register(TcpTransport)
