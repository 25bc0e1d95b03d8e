"""The vocabulary of pipeline schedules: what one rank does, step by step.

A schedule is, per pipeline rank, a list of actions executed in order:

- `Compute(op, mb, chunk, stage)`: `F` forward of micro-batch `mb` through local chunk `chunk`
  (virtual stage `stage`); `B` its backward — the whole backward, or only the input gradient (dx)
  when the schedule splits the backward; `W` the deferred weight gradient (dw) of an earlier `B`.
- `Combined(forward, backward, backward_first)`: a forward and a backward of different micro-batches
  run as one action (`pipeline_parallel_overlap_b_f`), so the communication of one can overlap the
  computation of the other. `backward_first` says which part is issued first: the backward (the
  1F1B steady-state pair B_i + F_j, HyperParallel's OVERLAP_B_F) or the forward (Megatron's pair
  of two chunks in interleaved 1F1B).
- `Comm(peer, sends, recvs)`: one rendezvous with another pipeline rank that moves one or more
  `Message`s each way (activations downstream, gradients upstream). Both ranks hold the mirror
  image of the same Comm at the same position among their Comms with each other.

Messages cross *boundaries*: boundary b lies between virtual stages b and b + 1; an `act` message
carries the output of stage b to stage b + 1, a `grad` message the gradient of that output back.
"""

from __future__ import annotations

from dataclasses import dataclass

OPS = ("F", "B", "W")


@dataclass(frozen=True, order=True)
class Message:
    kind: str        # "act" | "grad"
    mb: int
    boundary: int    # between virtual stages boundary and boundary + 1
    src: int         # sending pipeline rank
    dst: int         # receiving pipeline rank

    def label(self) -> str:
        return f"{'a' if self.kind == 'act' else 'g'}{self.mb}.{self.boundary}"


@dataclass(frozen=True)
class Compute:
    op: str          # "F" | "B" | "W"
    mb: int
    chunk: int       # local chunk index
    stage: int       # virtual stage

    def label(self) -> str:
        return f"{self.op}{self.mb}" + (f".{self.chunk}" if self.chunk else "")


@dataclass(frozen=True)
class Combined:
    forward: Compute
    backward: Compute
    backward_first: bool = False

    @property
    def parts(self) -> tuple[Compute, Compute]:
        """The two computations in the order they are issued."""
        return (self.backward, self.forward) if self.backward_first else (self.forward, self.backward)

    def label(self) -> str:
        return "+".join(c.label() for c in self.parts)


@dataclass(frozen=True)
class Comm:
    peer: int
    sends: tuple[Message, ...] = ()
    recvs: tuple[Message, ...] = ()

    def label(self) -> str:
        parts = [">" + m.label() for m in self.sends] + ["<" + m.label() for m in self.recvs]
        return f"r{self.peer}[{' '.join(parts)}]"

    def mirror(self, me: int) -> Comm:
        """The same rendezvous as the peer sees it."""
        return Comm(peer=me, sends=self.recvs, recvs=self.sends)


Action = Compute | Combined | Comm


def computes(action: Action) -> tuple[Compute, ...]:
    """The Compute parts of an action (none for a Comm)."""
    if isinstance(action, Compute):
        return (action,)
    if isinstance(action, Combined):
        return action.parts
    return ()


@dataclass(frozen=True)
class Schedule:
    """Every pipeline rank's action list for one optimizer step of `microbatches` micro-batches."""

    name: str                       # gpipe | 1f1b | interleaved_1f1b | zbv
    pp: int
    microbatches: int
    chunks: int
    style: str                      # "loop" | "v" (see stages.Placement)
    split_backward: bool            # B is dx only and a W follows
    combined: bool                  # overlap_b_f: Combined actions in the steady state
    ranks: tuple[tuple[Action, ...], ...]
    overlap_b_f: bool = False       # requested; `combined` says whether it found pairs to run together

    def actions(self, rank: int) -> tuple[Action, ...]:
        return self.ranks[rank]

    def compute_order(self, rank: int) -> list[Compute]:
        return [c for a in self.ranks[rank] for c in computes(a)]

    def describe(self) -> str:
        extra = [label for label, on in (("dx/dw split", self.split_backward), ("combined F+B", self.combined)) if on]
        return (f"{self.name}: pp {self.pp}, {self.microbatches} micro-batches, {self.chunks} chunk"
                f"{'s' if self.chunks > 1 else ''} per rank" + (f" ({', '.join(extra)})" if extra else ""))
