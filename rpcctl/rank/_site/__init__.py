"""Not imported: this folder goes on spawned processes' PYTHONPATH for its sitecustomize.
(A package only so that setuptools ships sitecustomize.py with rpcctl.)"""
