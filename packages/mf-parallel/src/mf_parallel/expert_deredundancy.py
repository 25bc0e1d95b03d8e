"""The `alltoall_deredundancy` token dispatcher: expert parallelism in two levels.

The P ranks of the ep group form M = P / G *device groups* of G = `npu_nums_per_device`
consecutive ep ranks (on Ascend: the NPUs of one machine, joined by the fast intra-node links).
Ep rank q = (device group q // G, local index q % G) holds experts [q * E/P, (q + 1) * E/P), as
under `AllToAllTokenDispatcher`. A token whose k experts sit on several ranks of one remote device
group crosses the slow inter-group link once, not once per expert:

    level 1 (across, over the M ranks with this rank's local index, one per device group):
        token t goes to device group g' once if any of its experts lives there: a [M, T, H] buffer
        whose slot [g', t] is the token row or zeros; the expert ids travel once by an all-gather.
    level 2 (within, over the G ranks of the receiving device group):
        each received token is fanned out to the ranks of the group holding its experts, one row
        per (token, expert) assignment: a [G, M T k, H] buffer, slot [l, a] = the row of
        assignment a if local rank l owns its expert. The ids travel on by an all-gather; the
        model's one-rank dispatcher (`local`) lays the received rows out for the local experts,
        every empty slot going to one extra "null" expert, as in the one-level dispatcher.
    combine, the reverse path: each assignment's output back within the group (reverse level 2),
        weighted there by the router weights of the assignments of that group (a [M, T, k]
        exchange beside the level-1 tokens, so the weights keep their gradient) and summed per
        token, then one row per (token, device group) back across (reverse level 1), summed over
        the groups at the source.

PyNative (training on CPU): every exchange is counts first, then variable sizes, as in
`AllToAllTokenDispatcher` (expert_exchange.py). Level 1 sends only the rows of (token, other device
group holding any of its experts) - the own group's rows stay on this rank, its level-1 receiver -
with the token's k expert ids (int32, -1 for experts of other groups) beside them, and the router
weights in combine; level 2 is `ExpertRoute` over the G ranks of the group (each received row's
assignments of this group to the local rank owning the expert, the receiver's own kept local). The
bytes sent to other ranks per MoE layer call, forward and backward (`comm_stats`): across
`deredundancy_across` rows x (4 H + 3 k) x 4 (tokens out and back and both gradients, the ids
once, the weights and their gradient), within `deredundancy_within` rows x 4 H x 4, and the counts
((M - 1) + (G - 1) E/P int32), against `alltoall_remote` x 4 H x 4 and (P - 1) E/P int32 for the
one-level dispatcher (`routed_rows` counts the rows from a routing).

GRAPH_MODE: static worst-case buffers (every shape known when the step compiles; said once in the
log): the level-1 tokens [M, T, H], the router weights [M, T, k] beside them, the level-2 rows
[G, M T k, H], the ids by all-gathers, every empty slot going to the null expert of `local`.
What the two-level layout saves is the traffic *across* device groups: level 1 sends one row per
(token, remote device group holding any of its experts) where `alltoall` sends one per (token,
expert on a remote group). benchmarks/moe_dispatch_bench.py compares the measured rows and bytes
with `routed_rows` and the analytic expectation for DeepSeek-V3's routing.

Backward: every exchange is an `ExpertExchange` or a `VariableExchange` (each its own adjoint), so
gradients return along the same routes; the ids need none.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from mf_parallel.collectives import AllGather, AllToAllV
from mf_parallel.errors import ParallelConfigError
from mf_parallel.expert_exchange import ExpertRoute, VariableExchange, size_tensor
from mf_parallel.expert_parallel import ExpertExchange, TwoPathDispatcher, variable_exchange
from mf_parallel.layout import deredundancy_problem
from mf_parallel.mesh import DeviceMesh, Group, make_group

KEY = "parallelism.npu_nums_per_device"


def device_group_ranks(ep_ranks, group_size: int, ep_rank: int) -> tuple[list[int], list[int]]:
    """(within, across) world ranks of ep rank `ep_rank`: the G ranks of its device group, and the
    M ranks with its local index (one per device group), each in group-rank order."""
    start = ep_rank - ep_rank % group_size
    return list(ep_ranks[start:start + group_size]), list(ep_ranks[ep_rank % group_size::group_size])


def two_level_groups(mesh: DeviceMesh, group_size: int) -> tuple[Group, Group]:
    """(within, across) groups of this rank for device groups of `group_size` ep ranks, created on
    first use, within first on every rank (group creation is collective)."""
    ep = mesh["ep"]
    problem = deredundancy_problem(ep.size, group_size)
    if problem:
        raise ParallelConfigError(f"{KEY}: {problem}")
    within, across = device_group_ranks(ep.ranks, group_size, ep.rank)
    # Names say the role, not the ranks: every rank's compiled graph then carries the same names.
    layout = mesh._layout
    return (make_group("ep_within", within, f"mf_ep_within{group_size}_{layout}"),
            make_group("ep_across", across, f"mf_ep_across{group_size}_{layout}"))


def routed_rows(topk_idx: np.ndarray, num_experts: int, ep: int, group_size: int, source_rank: int) -> dict:
    """Rows a variable-size exchange moves for one source rank's routing `topk_idx` [T, k]:
    `alltoall` one per assignment whose expert is on another rank ("alltoall_remote") / another
    device group ("alltoall_across"); deredundancy one per (token, other device group holding any
    of its experts) across ("deredundancy_across"), then one per assignment within the receiving
    group to a rank other than the level-1 receiver ("deredundancy_within")."""
    owner = np.asarray(topk_idx) // (num_experts // ep)
    group, me = owner // group_size, source_rank // group_size
    receiver = group * group_size + source_rank % group_size       # the level-1 receiver of each assignment
    groups_hit = [set(g[g != me].tolist()) for g in group]
    return {"alltoall_remote": int((owner != source_rank).sum()), "alltoall_across": int((group != me).sum()),
            "deredundancy_across": sum(len(s) for s in groups_hit),
            "deredundancy_within": int((owner != receiver).sum())}


class DeredundancyTokenDispatcher(TwoPathDispatcher):
    """`dispatch` / `combine` of a MoE layer whose `num_experts` experts are split over the ep
    ranks of the `within` x `across` groups (`two_level_groups`; see the module docstring). `local`
    is a one-rank dispatcher for `num_experts / P + 1` experts and top-1 (the last one is the null
    expert of empty slots); no parameters."""

    def __init__(self, within: Group, across: Group, num_experts: int, top_k: int, local: nn.Cell) -> None:
        super().__init__()
        self.g, self.m = within.size, across.size
        ep = self.g * self.m
        if num_experts % ep:
            raise ParallelConfigError(f"parallelism.expert_parallel: {ep} does not divide the {num_experts} routed "
                                      f"experts; use a divisor of {num_experts}")
        self.num_experts = num_experts
        self.local_experts = num_experts // ep
        self.top_k = top_k
        self.local = local
        self.across_tokens = ExpertExchange(across)
        self.across_weights = ExpertExchange(across)
        self.within_tokens = ExpertExchange(within)
        self.within_back = ExpertExchange(within)
        self.across_back = ExpertExchange(across)
        self.ids_across = AllGather(across, 0)
        self.ids_within = AllGather(within, 0)
        self.my_group = ms.Tensor(across.rank, ms.int32)
        self.first = ms.Tensor((across.rank * self.g + within.rank) * self.local_experts, ms.int32)
        self.groups = ops.arange(0, self.m, dtype=ms.int32).reshape(self.m, 1, 1)
        self.locals = ops.arange(0, self.g, dtype=ms.int32).reshape(self.g, 1)
        self.one = ms.Tensor(1, ms.int32)
        self.zero = ms.Tensor(0, ms.int32)
        self.variable = variable_exchange("alltoall_deredundancy")
        self.group_index = across.rank
        self.across_counts = AllToAllV(across)
        self.across_ids = AllToAllV(across)
        self.v_across_tokens = VariableExchange(across)
        self.v_across_weights = VariableExchange(across)
        self.v_across_back = VariableExchange(across)
        self.route = ExpertRoute(within, self.local_experts, local)

    def _variable_dispatch(self, x, topk_idx):
        tokens, k = topk_idx.shape
        m, g, le = self.m, self.g, self.local_experts
        load = ops.one_hot(topk_idx.reshape(tokens * k), self.num_experts, self.one, self.zero).sum(0)
        idx = topk_idx.asnumpy().astype(np.int64)                  # the host sync the variable sizes need
        device_group = idx // (le * g)                                                          # [T, k]
        # level 1: one row per (token, device group holding any of its experts), by group, by token
        hit = device_group[None, :, :] == np.arange(m)[:, None, None]                          # [M, T, k]
        to_group, token = np.nonzero(hit.any(2))
        send1 = np.bincount(to_group, minlength=m)
        recv1, pad1 = self.across_counts.exchange_counts(send1.reshape(m, 1))
        recv1 = recv1.reshape(m)
        sizes1 = size_tensor(send1, recv1, pad1)
        received = self.v_across_tokens(ops.gather(x, ms.Tensor(token.astype(np.int32)), 0), sizes1)   # [R1, H]
        ids = np.where(hit[to_group, token], idx[token], -1).astype(np.int32)                  # [rows, k]
        ids = self.across_ids(ms.Tensor(ids), send1.tolist(), recv1.tolist(), pad1).asnumpy()  # [R1, k]
        # level 2: each received row's assignments of this group, to the local rank owning the expert
        row, slot = np.nonzero(ids >= 0)
        expert = ids[row, slot].astype(np.int64)
        rows, block_expert, handle2, received2 = self.route.dispatch(received, row, (expert // le) % g, expert % le)
        counts = ops.stack((ops.zeros((), ms.float32), ms.Tensor(rows.shape[0] - received2, ms.float32)))
        handle = (handle2, sizes1, size_tensor(recv1, send1, pad1), ms.Tensor(token.astype(np.int32)),
                  ms.Tensor((row * k + slot).astype(np.int32)), ms.Tensor(row.astype(np.int32)), int(recv1.sum()))
        return rows, block_expert, handle, ops.stop_gradient(load.astype(ms.float32)), ops.stop_gradient(counts)

    def _variable_combine(self, expert_rows, handle, topk_weights):
        handle2, sizes1, back1, token, assignment, row, received1 = handle
        tokens, k = topk_weights.shape
        outputs = self.route.combine(expert_rows, handle2)                                   # [A2, H] float32
        weights = self.v_across_weights(ops.gather(topk_weights, token, 0), sizes1)          # [R1, k]
        weighted = outputs * ops.gather(weights.reshape(-1), assignment, 0).reshape(-1, 1)
        # [R1, H] (one segment at least: a rank may receive no level-1 row at all)
        partial = ops.unsorted_segment_sum(weighted, row, max(received1, 1))[:received1]
        back = self.v_across_back(partial, back1)                                            # [rows sent, H]
        return ops.unsorted_segment_sum(back, token, tokens).astype(expert_rows.dtype)

    def _static_dispatch(self, x, topk_idx):
        tokens, hidden = x.shape
        k, m, g, le = self.top_k, self.m, self.g, self.local_experts
        n = tokens * k
        flat = topk_idx.reshape(n)
        load = ops.one_hot(flat, self.num_experts, self.one, self.zero).sum(0).astype(ms.float32)
        # level 1: one row per (token, device group holding any of its experts)
        hit = (topk_idx.reshape(1, tokens, k) // (le * g) == self.groups).astype(x.dtype)       # [M, T, k]
        token_hit = ops.ReduceMax()(hit, 2)                                                                  # [M, T]
        received = self.across_tokens(x.reshape(1, tokens, hidden) * token_hit.reshape(m, tokens, 1))  # [M, T, H]
        ids = self.ids_across(ops.stop_gradient(flat.astype(ms.float32)).reshape(1, n))         # [M, T k]
        ids = ids.astype(ms.int32).reshape(m * n)
        # level 2: one row per assignment of this device group, to the local rank owning its expert
        owner = ids // le
        ours = owner // g == self.my_group
        to_rank = ops.logical_and(ours.reshape(1, m * n), (owner % g).reshape(1, m * n) == self.locals)
        fan = to_rank.astype(x.dtype)                                                           # [G, M T k]
        assigned = ops.gather(received.reshape(m * tokens, hidden), ops.arange(0, m * n, dtype=ms.int32) // k, 0)
        arrived = self.within_tokens(assigned.reshape(1, m * n, hidden) * fan.reshape(g, m * n, 1))
        ids2 = self.ids_within(ids.astype(ms.float32).reshape(1, m * n)).astype(ms.int32).reshape(g * m * n)
        local_id = ids2 - self.first
        mine = ops.logical_and(local_id >= 0, local_id < le)
        local_id = ops.where(mine, local_id, ops.full_like(local_id, le))                       # the null expert
        rows, block_expert, dest, _, _ = self.local.dispatch(arrived.reshape(g * m * n, hidden),
                                                             local_id.reshape(g * m * n, 1))
        block_expert = ops.minimum(block_expert, le - 1)       # null blocks: zero rows, any expert
        real = mine.astype(ms.float32).sum()
        counts = ops.stack((ops.zeros((), ms.float32), rows.shape[0] - real))   # dropless: nothing dropped
        handle = (dest, ops.stop_gradient(fan), ops.stop_gradient(hit))
        return rows, block_expert, handle, ops.stop_gradient(load), ops.stop_gradient(counts)

    def _static_combine(self, expert_rows, handle, topk_weights):
        dest, fan, hit = handle
        tokens, k = topk_weights.shape
        m, g, n = self.m, self.g, tokens * k
        out = ops.gather(expert_rows, dest, 0).astype(ms.float32)                          # [G*M*N, H]
        back = self.within_back(out.reshape(g, m * n, -1))                                 # owner l's rows
        picked = (back * fan.astype(ms.float32).reshape(g, m * n, 1)).sum(0)               # [M*N, H]
        # the router weights of the assignments each device group computes, beside its tokens
        weights = self.across_weights(topk_weights.reshape(1, tokens, k) * hit.astype(ms.float32))  # [M, T, k]
        partial = (picked.reshape(m, tokens, k, -1) * weights.reshape(m, tokens, k, 1)).sum(2)      # [M, T, H]
        return self.across_back(partial).sum(0).astype(expert_rows.dtype)                 # over device groups
