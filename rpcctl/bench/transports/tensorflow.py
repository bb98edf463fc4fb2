"""TensorFlow: ``tf.distribute.experimental.rpc`` (gRPC) echo, and ``MultiWorkerMirroredStrategy``
all-reduce. Optional: ``pip install 'rpcctl[tensorflow]'`` (the CPU wheel, tensorflow-cpu).

- ``tf-rpc``: rank 1 runs an RPC server with one registered ``tf.function`` that returns its
  input; rank 0 is a client calling it (``Client.call`` is asynchronous, so calls can be kept in
  flight). gRPC refuses a message over 4 MiB by default and this API has no option to raise
  it: a 4 MiB payload makes a 4194331-byte message, so rows from 4 MiB up are "not supported".
- ``tf-allreduce``: every rank is a worker of a ``MultiWorkerMirroredStrategy`` (ring
  collectives over gRPC); one call is ``strategy.run`` of a replica-context ``all_reduce`` (SUM)
  inside a ``tf.function``.

TensorFlow picks its own ports: each rank takes a free loopback port and the ranks share them
through the side channel on MASTER_PORT (``_store``). Payloads become TensorFlow tensors once per
case, untimed (``native``); results come back to torch without a copy (``.numpy()``).
"""

from __future__ import annotations

import importlib.util
import json
import os
from datetime import timedelta
from typing import Any

from rpcctl.bench.transports import RankContext, Transport, register

GRPC_MAX_MESSAGE = 4 * 1024 * 1024  # gRPC's default cap on a received message
# What one call adds to its payload on the wire (protobuf framing): measured, a 4 MiB payload
# arrives as a 4194331-byte message; a margin over those 27 bytes.
CALL_FRAMING = 1024
INSTALL_HINT = "pip install 'rpcctl[tensorflow]'"
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2"}  # TensorFlow's start-up banners would fill the rank logs


def _to_torch(value: Any) -> Any:
    import torch

    return torch.from_numpy(value.numpy())


class _TensorFlow(Transport):
    """What both TensorFlow adapters share: the package, its quiet logs, its tensors."""

    modules = ("tensorflow",)
    install_hint = INSTALL_HINT

    @classmethod
    def unavailable(cls) -> str | None:
        if importlib.util.find_spec("tensorflow") is None:
            return f"tensorflow is not installed ({INSTALL_HINT})"
        return None

    @classmethod
    def env_for(cls, settings: dict[str, Any]) -> dict[str, str]:
        return dict(QUIET)

    def native(self, tensor: Any) -> Any:
        import tensorflow as tf

        return tf.constant(tensor.numpy())


class TfRpcTransport(_TensorFlow):
    kind = "tf-rpc"
    summary = "TensorFlow tf.distribute.experimental.rpc (gRPC) echo"
    ops = {"latency": ("call",), "payload": ("call",), "throughput": ("call",)}

    @classmethod
    def unsupported(cls, case: Any) -> str | None:
        if case.payload_bytes and case.payload_bytes + CALL_FRAMING > GRPC_MAX_MESSAGE:
            return (
                "not supported: gRPC caps a message at 4 MiB by default and tf.distribute.experimental.rpc "
                "has no option to raise it"
            )
        return None

    def setup(self, ctx: RankContext) -> None:
        import tensorflow as tf

        from rpcctl.bench.transports._store import SideChannel, free_port

        self.ctx = ctx
        self.side = SideChannel(ctx)
        ports = self.side.share("tf-rpc-port", str(free_port(ctx.master_addr) if ctx.rank == 1 else 0))
        address = f"{ctx.master_addr}:{ports[1]}"
        self.spec = tf.TensorSpec([None], tf.uint8)
        if ctx.rank == 1:
            self.server = tf.distribute.experimental.rpc.Server.create("grpc", address)

            @tf.function(input_signature=[self.spec])
            def echo(x):
                return x

            self.server.register("echo", echo)
            self.server.start()
        self.side.barrier("tf-rpc-up")  # the client lists the server's methods when it connects
        if ctx.rank == 0:
            self.client = tf.distribute.experimental.rpc.Client.create("grpc", address, name="rpcctl-bench")

    def as_torch(self, value: Any) -> Any:
        return _to_torch(value)

    def issue(self, op: str, payload: Any) -> Any:
        return self.client.call("echo", [payload], output_specs=self.spec)

    def wait(self, op: str, handle: Any) -> Any:
        if not handle.is_ok():
            code, message = handle.get_error()
            raise RuntimeError(f"tf-rpc call failed ({int(code.numpy())}): {message.numpy().decode(errors='replace')}")
        return _to_torch(handle.get_value())

    def serve(self) -> None:
        if self.ctx.rank == 1:
            self.side.store.wait(["tf-rpc-stop"], timedelta(hours=6))

    def stop(self) -> None:
        self.side.store.set("tf-rpc-stop", "1")

    def teardown(self) -> None:
        self.side.barrier("tf-rpc-down")  # the server outlives the client's last call
        self.side.close()


class TfAllReduceTransport(_TensorFlow):
    kind = "tf-allreduce"
    summary = "TensorFlow MultiWorkerMirroredStrategy all-reduce (ring, gRPC)"
    ops = {"collective": ("all_reduce",)}

    def setup(self, ctx: RankContext) -> None:
        from rpcctl.bench.transports._store import SideChannel, free_port

        self.ctx = ctx
        self.side = SideChannel(ctx)
        ports = self.side.share("tf-worker-port", str(free_port(ctx.master_addr)))
        os.environ["TF_CONFIG"] = json.dumps(
            {
                "cluster": {"worker": [f"{ctx.master_addr}:{port}" for port in ports]},
                "task": {"type": "worker", "index": ctx.rank},
            }
        )
        import tensorflow as tf

        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING
        )
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        strategy = self.strategy
        device = strategy.extended.worker_devices[0]

        def replica_sum(t):
            # An all-reduce needs a placed value (a graph input has no device: "destinations can
            # not be empty"); identity on the same device does not copy.
            with tf.device(device):
                t = tf.identity(t)
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, t)

        @tf.function
        def all_reduce(x):
            return strategy.run(replica_sum, args=(x,))

        self._all_reduce = all_reduce

    def collective(self, op: str, tensor: Any) -> Any:
        if op != "all_reduce":
            raise ValueError(f"tf-allreduce has no collective {op!r}")
        result = self._all_reduce(tensor)
        return _to_torch(self.strategy.experimental_local_results(result)[0])

    def agree(self, value: int) -> int:
        return self.side.agree(value)

    def issue(self, op: str, payload: Any) -> Any:
        raise NotImplementedError("tf-allreduce has no point-to-point op")

    def teardown(self) -> None:
        self.side.close()


register(TfRpcTransport)
register(TfAllReduceTransport)
