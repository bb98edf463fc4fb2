"""The processes of a job from the launcher's side: the rank server (fork or spawn, subreaper)
and the launcher's handles on it (signals, process trees, the log pump).
"""
