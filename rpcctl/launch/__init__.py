"""The facade the CLI and the bench call: plan a job, make its run directory, subscribe the
listeners, supervise it; follow a run from outside, stop it, end a lost one.
"""
