"""The policy of a launch: the supervisor's loop (root cause, teardown, restarts, deadlines,
signals), the hang watchdog (evidence, diagnosis, collectives), the node rendezvous, the
terminal live view and the other listeners of a launch.
"""
