"""Rank 1 fails mid-run (raises, or is killed by SIGKILL) while rank 0 keeps calling collectives
that can never complete: the launcher must end the job promptly with rank 1's error."""

import os
import signal
import sys
import time

import numpy as np
from mindspore import Tensor

import mf_parallel as mp

how = sys.argv[1]
mesh = mp.init_mesh(mp.ParallelDims(2))
world = mesh["world"]
for step in range(1, 10_000):
    print(f"rank {mesh.rank} step {step}", flush=True)
    mp.all_reduce(Tensor(np.ones(4, np.float32)), world).asnumpy()
    if mesh.rank == 1 and step == 3:
        if how == "raise":
            raise RuntimeError("rank 1 exploded at step 3")
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.05)
