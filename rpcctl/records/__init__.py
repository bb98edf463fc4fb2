"""The records of a run: its directory, ``run.json`` (``RunRecord``, ``RankState``,
``Failure``), and the events the supervisor tells its listeners.
"""
