"""One node of an elastic job without ranks: rpcctl's ElasticRendezvous alone, as a launcher
drives it. It prints one JSON line per thing it sees (a round, a node waiting, a member lost, an
error) and runs until SIGTERM (it then says it is done) or a rendezvous error (exit 3).

    python elastic_node.py ENDPOINT PORT MIN MAX NPROC [last_call] [lost_after]
"""

import json
import os
import signal
import sys
import time

from rpcctl.planning.plan import free_port
from rpcctl.supervise.cluster import RendezvousError
from rpcctl.supervise.elastic import ElasticRendezvous, ElasticSettings


def say(**what):
    print(json.dumps(what), flush=True)


def main() -> int:
    endpoint, port, low, high, nproc = (
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
        int(sys.argv[5]),
    )
    last_call = float(sys.argv[6]) if len(sys.argv) > 6 else 1.0
    lost_after = float(sys.argv[7]) if len(sys.argv) > 7 else 3.0
    settings = ElasticSettings(
        endpoint,
        port,
        "test-job",
        low,
        high,
        nproc,
        join_timeout=15,
        last_call=last_call,
        keep_alive=1,
        keep_alive_attempts=5,
        lost_after=lost_after,
    )
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    node = ElasticRendezvous(settings, os.environ["RPCCTL_SECRET"].encode())
    try:
        node.reach()
        shared = node.open(run_id=f"run-{os.getpid()}", extra={"telemetry_port": 1})
        say(opened=True, host=node.is_host, run_id=shared["run_id"], node_index=node.node_index)
        while not stop:
            r = node.next_round(free_port)
            say(
                round=r.number,
                group_rank=r.group_rank,
                nnodes=r.nnodes,
                world_size=r.world_size,
                first_rank=r.first_rank,
                pids=[m.pid for m in r.members],
                master=[r.master_addr, r.master_port],
            )
            while not stop:
                if node.waiting():
                    say(waiting=True)
                    break
                gone = node.lost()
                if gone is not None:
                    say(lost=gone.pid)
                    break
                time.sleep(0.2)
    except RendezvousError as exc:
        say(error=str(exc))
        return 3
    node.finish("succeeded", wait=2)
    say(done=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
