"""Two ranks whose all_reduce disagree (issue 38): gloo aborts the rank that receives more than its
tensor holds (SIGABRT, "Received data size doesn't match expected size"). argv[1]: ``size`` (4
float32 against 8) or ``dtype`` (4 float32 against 4 float64)."""

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
if sys.argv[1] == "size":
    t = torch.ones(4 if rank == 0 else 8)
else:
    t = torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64)
dist.all_reduce(t)
print("done", rank, flush=True)
dist.destroy_process_group()
