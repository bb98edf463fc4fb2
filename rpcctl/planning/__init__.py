"""A ``JobSpec`` and this node's facts become a ``LaunchPlan`` (pure), and the checks that
would otherwise fail in every rank run before anything is spawned.
"""
