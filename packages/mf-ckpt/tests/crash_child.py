"""Helper process of test_crash_safety.py: forks savers that run until they are SIGKILLed.

It imports numpy and mf_ckpt once, then serves commands on stdin, one per line:

    run SAVE_DIR FIRST_ITERATION MODE LOG     (MODE: sync1 | sync2 | async2)

For each it forks a child that saves iteration after iteration, prints `pid N`, waits for the
child to die and prints `exited STATUS`. Forking from a warm process makes each round cost
milliseconds instead of a fresh interpreter start, so the test can afford many kills.

Tensor values (and the bytes of a carried file) encode the iteration, so the parent can tell a
consistent checkpoint from a torn one. After each commit the child appends `committed N` to LOG (flushed to the OS, which a
SIGKILL does not lose): the parent checks the marker is never behind what was reported.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from mf_ckpt import SaveOptions, Saver, replicated, run_threaded, shard_array

SHAPES = {"w": (256, 128), "v": (64, 96), "b": (128,)}


def state(it: int, rank: int, world: int):
    model = {
        "w": shard_array(np.full(SHAPES["w"], it, np.float32), 0, rank, world),
        "v": shard_array(np.full(SHAPES["v"], it, np.float32), 1, rank, world, padded=True),
        "b": replicated(np.full(SHAPES["b"], it, np.float32), replica_id=rank),
    }
    optim = {"m." + k: v for k, v in state_copy(model).items()}
    return model, optim


def state_copy(model):
    return {k: type(v)(v.data * 2, v.global_shape, v.global_offset, v.replica_id) for k, v in model.items()}


def run(root: str, first: int, mode: str, log_path: str) -> None:
    log = open(log_path, "a", buffering=1)
    world = 1 if mode == "sync1" else 2
    asynchronous = mode.startswith("async")

    def body(comm):
        opts = SaveOptions(save_path=root, save_max=2, async_save=asynchronous, remove_redundancy=world > 1)
        saver = Saver(opts, comm)
        it = first
        while True:
            model, optim = state(it, comm.rank, world)
            # a carried file (like a tokenizer) whose bytes name the iteration too
            result = saver.save(it, model, optim, common={"step": it},
                                assets={"tokenizer/tokenizer.json": f'{{"iteration": {it}}}'.encode() * 4096})
            if asynchronous:
                while not saver.poll():
                    time.sleep(0.002)
            elif not result.committed:
                raise AssertionError("synchronous save returned uncommitted")
            if comm.rank == 0:
                log.write(f"committed {it}\n")
                log.flush()
            it += 1

    run_threaded(world, body)


def serve() -> None:
    for line in sys.stdin:
        _, root, first, mode, log_path = line.split()
        pid = os.fork()
        if pid == 0:
            try:
                run(root, int(first), mode, log_path)
            finally:
                os._exit(1)  # only reached if the saver stops by itself, which is a failure
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exited {status}", flush=True)


if __name__ == "__main__":
    serve()
