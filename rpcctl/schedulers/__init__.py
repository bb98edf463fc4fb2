"""Cluster schedulers: a SLURM step's environment and batch script, a Kubernetes pod's
environment and the manifests ``rpcctl k8s`` writes.
"""
