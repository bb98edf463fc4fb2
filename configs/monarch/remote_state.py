"""Remote state, in Monarch: several processes update one object that a single process owns.
The torch RPC version is configs/scripts/remote_state.py; docs/monarch.md compares them.

The store is an actor in a mesh of one process; a second mesh of two ``Updater`` actors gets
the store's reference as an endpoint argument (an ActorMesh pickles to a reference, as an
RRef does) and each sends it 20 increments. An actor handles one message at a time, so the
store needs no lock (torch RPC runs requests on the owner's thread pool: the RPC version locks).

Run it with:
    rpcctl launch configs/monarch/remote_state.yaml
    python configs/monarch/remote_state.py
"""

from monarch.actor import Actor, current_rank, endpoint, this_host

UPDATES_PER_UPDATER = 20


class KVStore(Actor):
    def __init__(self) -> None:
        self.counter = 0
        self.data: dict[str, int] = {}

    @endpoint
    def increment(self, key: str, by: int = 1) -> int:
        self.counter += by
        self.data[key] = self.data.get(key, 0) + by
        return self.counter

    @endpoint
    def snapshot(self) -> tuple[int, dict[str, int]]:
        return self.counter, dict(self.data)


class Updater(Actor):
    @endpoint
    def run_updates(self, store, n: int) -> str:
        me = f"updater{current_rank()['procs']}"
        for _ in range(n):
            store.increment.call_one(me).get()
        return me


def main() -> None:
    store_procs = this_host().spawn_procs(per_host={"procs": 1})
    store = store_procs.spawn("store", KVStore)
    updater_procs = this_host().spawn_procs(per_host={"procs": 2})
    updaters = updater_procs.spawn("updaters", Updater)
    # One call to the whole mesh: both updaters run at once; get() gathers their answers.
    done = sorted(name for _, name in updaters.run_updates.call(store, UPDATES_PER_UPDATER).get().items())
    print(f"updates finished on {done}", flush=True)
    counter, data = store.snapshot.call_one().get()
    print(f"final counter = {counter}", flush=True)
    for key in sorted(data):
        print(f"  {key}: {data[key]}", flush=True)
    assert counter == 2 * UPDATES_PER_UPDATER, f"lost updates: {counter}"
    assert data == {f"updater{r}": UPDATES_PER_UPDATER for r in range(2)}
    updater_procs.stop().get()
    store_procs.stop().get()
    print("remote_state OK", flush=True)


if __name__ == "__main__":
    main()
