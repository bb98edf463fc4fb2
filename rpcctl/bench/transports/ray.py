"""Ray actor calls (optional: only when ``ray`` is installed, ``pip install 'rpcctl[ray]'``).

One process starts a local Ray instance and one actor with an ``echo`` method; the driver calls
it with the same payloads as every other transport. Ray's own worker processes do the serving,
so this adapter runs as a single rank.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from rpcctl.bench.transports import RankContext, Transport, register


class _Echo:
    def echo(self, x):
        return x


class RayTransport(Transport):
    kind = "ray"
    summary = "Ray actor calls (local instance)"
    ops = {"latency": ("actor_call",), "payload": ("actor_call",), "throughput": ("actor_call",)}
    processes = 1
    install_hint = "pip install 'rpcctl[ray]'"
    modules = ("ray",)

    @classmethod
    def unavailable(cls) -> str | None:
        if importlib.util.find_spec("ray") is None:
            return f"ray is not installed ({cls.install_hint})"
        return None

    def setup(self, ctx: RankContext) -> None:
        import ray

        self.ctx = ctx
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        self.actor = ray.remote(_Echo).remote()
        ray.get(self.actor.echo.remote(0))  # wait for the actor to start

    def issue(self, op: str, payload: Any) -> Any:
        return self.actor.echo.remote(payload)

    def wait(self, op: str, handle: Any) -> Any:
        import ray

        return ray.get(handle)

    def teardown(self) -> None:
        import ray

        ray.shutdown()


register(RayTransport)
