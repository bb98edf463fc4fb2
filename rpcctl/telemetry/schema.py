"""The telemetry store's schema: its tables (``DDL``) and their versions (``SCHEMA_VERSION``).
``store.py`` writes them (``StoreWriter``, the one writer); ``reader.py`` reads them.

Tables (times are epoch seconds; ids of RRefs are torch's ``GloballyUniqueId`` as
``"created_on:local_id"``, scoped by the restart and the RPC world they belong to):

==========  ==================================================================
table       one row per
==========  ==================================================================
meta        key/value facts of the run (run_id, world_size, opened_at, closed_at)
ranks       launcher rank and restart, as the launcher saw it (pid, state, exit)
procs       process that connected (a rank, or a process it spawned): probes; a
            spawned one's exit status as its parent reaped it (-N: signal N)
rpc_workers RPC worker (rank → name) of each restart and world, as init_rpc reported it
rrefs       RRef (not per fork): owner, creator, call site, value, lifecycle
handles     Python reference to an RRef held by a process (creator's or a fork)
churn       (process, owner, callee, call site): RRefs too short-lived to list
losses      loss record (printed and parsed, reported with rpcctl.report, or by a library's
            trainer: ``source``, ``protocol.LOSS_SOURCES``)
calls       RPC call that ran for at least calls.LONG_S (caller side): callee, site, end
call_stats  (process, callee, function, kind): every ended call, counted, with a histogram
serving     function a process ran for at least calls.LONG_S for an incoming call
log_lines   (rank, restart): lines the loss parser read, and how many yielded a loss
==========  ==================================================================

An RPC *world* is one group of processes that called ``init_rpc`` together (one rendezvous):
world 0 is a restart's first. A script that ``mp.spawn``s its workers twice makes two worlds
with the same worker names and RRef ids, told apart here (``StoreWriter._world_of``): a process
joins the open world of its rendezvous (address and world size) unless its RPC rank is taken
there, which opens the next one.

A c10d *world* is the same for collectives (one ``init_process_group`` rendezvous: address and
world size), numbered apart from RPC's: the collectives tables' ``rank`` is the process's rank in
it (``dist.get_rank()``; the launcher rank for a process that has none), and their ``pg`` is what
names the group on every rank (``rank.collectives``: its c10d name, ``rpc`` for RPC's own gloo
group; the recorder's per-process id in stores before version 9), ``wN:NAME`` from a restart's
second world on (``pg_label``), so that a script that ``mp.spawn``s a DDP job twice keeps its
rounds apart in every view. ``coll_groups.ranks`` is the group's members (global ranks, JSON), as
c10d gave them to the process. A process that calls
``init_process_group`` again (after ``destroy_process_group``) with the same rank and rendezvous
stays in its world.

A loss's ``step`` and ``epoch`` are as printed or reported (NULL when absent); ``seq`` is its
arrival index among the records of its (rank, restart, source), which orders and keys them
where steps repeat (epoch-local steps, no step at all). Stores before version 4 have no
``seq``, ``rule`` or ``log_lines`` and filled a missing step with the epoch or the arrival
index: readers take ``seq`` from the row order there (``rpcctl.inspect``).
"""

# 2: procs.cpu_s, procs.telemetry_cpu_s; meta server_cpu_s. 3: calls, call_stats, serving, procs.rpc_join_at
SCHEMA_VERSION = 9
# 4: losses.seq, losses.rule, log_lines. 5: rrefs.value_watched (1: the owner watches the value, so
#    value_freed_at NULL means still alive)
# 6: handles.last_used_at (the holder's last use of a reference it still held at rpc.shutdown()),
#    call_stats.request_bytes, calls.nbytes (bytes of the tensor arguments)
# 7: procs.exit_code (a process a rank spawned: its exit status, as its parent reaped it); world (the RPC
#    world of a restart) in procs, rpc_workers, rrefs, handles, churn; rrefs.storages; procs.rpc_shutdown_done_at
#    (when rpc.shutdown() returned), procs.autograd_contexts (open then); coll_groups, coll_stats, collectives
#    (issue 27: collectives from torch's Flight Recorder), procs.pg_join_at
# 8: procs.dist_rank, procs.pg_world (the process's rank in its c10d world, and which world: a process
#    a rank spawned, issue 27); world in coll_groups, coll_stats, collectives (their rank: the dist rank)
# 9: pg in coll_groups, coll_stats, collectives is the group's cross-rank name (was the recorder's per-process
#    id, which RPC's own group shifts: issue 38); coll_groups.ranks (the group's members)

DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS ranks (
    rank INTEGER NOT NULL, restart INTEGER NOT NULL, pid INTEGER, local_rank INTEGER, device TEXT,
    state TEXT NOT NULL, exit_code INTEGER, started_at REAL, ended_at REAL,
    PRIMARY KEY (rank, restart));
CREATE TABLE IF NOT EXISTS procs (
    proc_id INTEGER PRIMARY KEY, host TEXT, pid INTEGER, ppid INTEGER, rank INTEGER, restart INTEGER,
    kind TEXT, name TEXT, rpc_rank INTEGER, world_size INTEGER,
    connected_at REAL, last_seen REAL, ended_at REAL, stopped_at REAL, rpc_shutdown_at REAL,
    cpu_percent REAL, rss_bytes INTEGER, threads INTEGER, device TEXT, cuda_visible_devices TEXT,
    gpu_memory_bytes INTEGER, gpus TEXT, device_maps TEXT, devices TEXT, dropped INTEGER DEFAULT 0,
    cpu_s REAL, telemetry_cpu_s REAL, rpc_join_at REAL, exit_code INTEGER, world INTEGER, rpc_shutdown_done_at REAL,
    autograd_contexts INTEGER, pg_join_at REAL, dist_rank INTEGER, pg_world INTEGER);
CREATE TABLE IF NOT EXISTS rpc_workers (
    restart INTEGER NOT NULL, world INTEGER NOT NULL DEFAULT 0, rpc_rank INTEGER NOT NULL, name TEXT,
    PRIMARY KEY (restart, world, rpc_rank));
CREATE TABLE IF NOT EXISTS rrefs (
    restart INTEGER NOT NULL, world INTEGER NOT NULL DEFAULT 0, rref_id TEXT NOT NULL, kind TEXT,
    owner_rank INTEGER, owner TEXT, creator_rank INTEGER, creator TEXT, creator_proc INTEGER,
    callee TEXT, call_site TEXT,
    type TEXT, shape TEXT, dtype TEXT, device TEXT, nbytes INTEGER,
    created_at REAL, confirmed_at REAL, value_freed_at REAL, value_watched INTEGER, storages TEXT,
    PRIMARY KEY (restart, world, rref_id));
CREATE TABLE IF NOT EXISTS handles (
    restart INTEGER NOT NULL, world INTEGER NOT NULL DEFAULT 0, rref_id TEXT NOT NULL, fork_id TEXT NOT NULL,
    proc_id INTEGER NOT NULL, holder TEXT, role TEXT, acquired_at REAL, released_at REAL, last_used_at REAL,
    PRIMARY KEY (restart, world, rref_id, fork_id, proc_id));
CREATE TABLE IF NOT EXISTS churn (
    restart INTEGER NOT NULL, world INTEGER NOT NULL DEFAULT 0, proc_id INTEGER NOT NULL, owner TEXT NOT NULL,
    callee TEXT NOT NULL, call_site TEXT NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (restart, world, proc_id, owner, callee, call_site));
CREATE TABLE IF NOT EXISTS probes (
    proc_id INTEGER NOT NULL, t REAL NOT NULL, cpu_percent REAL, rss_bytes INTEGER);
CREATE TABLE IF NOT EXISTS losses (
    id INTEGER PRIMARY KEY, rank INTEGER, restart INTEGER, step INTEGER, epoch INTEGER, loss REAL,
    metrics TEXT, time REAL, source TEXT, seq INTEGER, rule TEXT);
CREATE TABLE IF NOT EXISTS calls (
    restart INTEGER NOT NULL, proc_id INTEGER NOT NULL, call_id INTEGER NOT NULL, kind TEXT,
    caller TEXT, caller_rank INTEGER, callee TEXT, func TEXT, call_site TEXT, thread INTEGER,
    started_at REAL, ended_at REAL, status TEXT, nbytes INTEGER,
    PRIMARY KEY (proc_id, call_id));
CREATE TABLE IF NOT EXISTS call_stats (
    restart INTEGER NOT NULL, proc_id INTEGER NOT NULL, caller TEXT, caller_rank INTEGER,
    callee TEXT NOT NULL, func TEXT NOT NULL, kind TEXT NOT NULL, count INTEGER NOT NULL,
    errors INTEGER NOT NULL, timeouts INTEGER NOT NULL, total_s REAL, max_s REAL, hist TEXT, updated_at REAL,
    request_bytes INTEGER,
    PRIMARY KEY (proc_id, callee, func, kind));
CREATE TABLE IF NOT EXISTS serving (
    restart INTEGER NOT NULL, proc_id INTEGER NOT NULL, serve_id INTEGER NOT NULL, worker TEXT,
    worker_rank INTEGER, thread INTEGER, func TEXT, nbytes INTEGER, started_at REAL, ended_at REAL,
    PRIMARY KEY (proc_id, serve_id));
CREATE TABLE IF NOT EXISTS coll_groups (
    restart INTEGER NOT NULL, proc_id INTEGER NOT NULL, rank INTEGER, world INTEGER NOT NULL DEFAULT 0,
    pg TEXT NOT NULL, name TEXT, size INTEGER,
    entered INTEGER, completed INTEGER, completed_at REAL, cur_seq INTEGER, cur_op TEXT, cur_sizes TEXT,
    cur_dtypes TEXT,
    cur_bytes INTEGER, cur_since REAL, updated_at REAL, ranks TEXT,
    PRIMARY KEY (proc_id, pg));
CREATE TABLE IF NOT EXISTS coll_stats (
    restart INTEGER NOT NULL, proc_id INTEGER NOT NULL, rank INTEGER, world INTEGER NOT NULL DEFAULT 0,
    pg TEXT NOT NULL, op TEXT NOT NULL,
    count INTEGER NOT NULL, bytes INTEGER, total_s REAL, max_s REAL, hist TEXT, updated_at REAL,
    PRIMARY KEY (proc_id, pg, op));
CREATE TABLE IF NOT EXISTS collectives (
    restart INTEGER NOT NULL, proc_id INTEGER NOT NULL, rank INTEGER, world INTEGER NOT NULL DEFAULT 0,
    pg TEXT NOT NULL, seq INTEGER NOT NULL, op TEXT,
    sizes TEXT, dtypes TEXT, bytes INTEGER, entered_at REAL, completed_at REAL,
    PRIMARY KEY (proc_id, pg, seq));
CREATE TABLE IF NOT EXISTS log_lines (
    rank INTEGER NOT NULL, restart INTEGER NOT NULL, lines INTEGER NOT NULL, matched INTEGER NOT NULL,
    PRIMARY KEY (rank, restart));
"""


def pg_label(pg: str, world: int | None) -> str:
    """A process group as the views name it: its name (``rank.collectives``), in c10d world ``world``."""
    return str(pg) if not world else f"w{world}:{pg}"


def pg_id(label: str) -> str:
    """The group's name in a ``pg_label`` (``w1:0`` → ``0``)."""
    return label.split(":", 1)[1] if label.startswith("w") and ":" in label else label
