"""MoE layer speed: mf-models' dropless block dispatch against the dense-masked path it replaced.

    python benchmarks/moe_bench.py                      # two shapes, forward + backward, GRAPH_MODE
    python benchmarks/moe_bench.py --tokens 4096 --rounds 5

One MoE layer (router + routed SwiGLU experts, no shared expert), hidden 256, expert size 512,
float32, on T tokens: forward and backward (gradients of every weight and of the input) of
sum(out * probe), compiled as one graph each.
  ours        `LocalDispatcher` + `GroupedExperts`: each (token, expert) pair in an expert-ordered
              block of b = T*k/4E rows (--block to change), one batched matmul over the blocks
              (about T*k + E*b rows)
  reference   the dense-masked formula of mf-models <= 0.4 (`experts_dense_reference`): every
              expert on every token (E*T rows), combined with a [T, E] weight matrix that is zero
              outside each token's top-k
Both give the same output (checked to 1e-4). Shapes: mixtral-like 8 experts top-2 (the dense path
does 4x the routed work) and fine-grained 32 experts top-4 (8x). Each figure is the best of
--rounds, ours and the reference alternating, after a compiling warm-up. The machine is shared:
compare the ratios.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402

from mf_models.common.dispatch import LocalDispatcher  # noqa: E402
from mf_models.common.moe import GroupedExperts, experts_dense_reference  # noqa: E402
from mf_models.common.router import RouterSpec, TopKRouter  # noqa: E402

HIDDEN, INNER = 256, 512


class Layer(nn.Cell):
    def __init__(self, experts: int, top_k: int, dense: bool, block: int | None):
        super().__init__()
        self.router = TopKRouter(HIDDEN, RouterSpec(experts, top_k, "softmax", norm_topk_prob=True))
        self.dispatcher = LocalDispatcher(experts, top_k, block)
        self.experts = GroupedExperts(HIDDEN, INNER, experts, top_k)
        self.dense = dense

    def construct(self, x, probe):
        idx, weights, _, _ = self.router(x)
        e = self.experts
        if self.dense:
            out = experts_dense_reference(e.w1, e.w2, e.w3, x, idx, weights)
        else:
            rows, block_expert, dest, _, _ = self.dispatcher.dispatch(x, idx)
            out = self.dispatcher.combine(e(rows, block_expert), dest, weights)
        return (out * probe).sum(), out


class FwdBwd(nn.Cell):
    def __init__(self, layer: Layer):
        super().__init__(auto_prefix=False)
        self.layer = layer
        self.grad = ms.value_and_grad(layer, 0, layer.trainable_params(), has_aux=True)

    def construct(self, x, probe):
        (loss, out), grads = self.grad(x, probe)
        return loss, out, grads


def build(experts, top_k, dense, block, seed=0):
    layer = Layer(experts, top_k, dense, block)
    rng = np.random.default_rng(seed)
    for p in layer.trainable_params():
        p.set_data(Tensor(rng.normal(0, 0.05, p.shape).astype(np.float32)))
    return FwdBwd(layer)


def timed(fn, *args) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn(*args)
    out[0].asnumpy()
    return time.perf_counter() - start, out


def bench(tokens: int, experts: int, top_k: int, rounds: int, block: int | None) -> None:
    rng = np.random.default_rng(1)
    x = Tensor(rng.normal(size=(tokens, HIDDEN)).astype(np.float32))
    probe = Tensor(rng.normal(size=(tokens, HIDDEN)).astype(np.float32))
    ours, ref = build(experts, top_k, False, block), build(experts, top_k, True, block)
    _, (_, out_ours, _) = timed(ours, x, probe)           # compile
    _, (_, out_ref, _) = timed(ref, x, probe)
    np.testing.assert_allclose(out_ours.asnumpy(), out_ref.asnumpy(), rtol=1e-4, atol=1e-4)
    best_ours = best_ref = float("inf")
    for _ in range(rounds):
        best_ours = min(best_ours, timed(ours, x, probe)[0])
        best_ref = min(best_ref, timed(ref, x, probe)[0])
    b, blocks = ours.layer.dispatcher.layout_sizes(tokens)
    rows = blocks * b
    print(f"moe fwd+bwd {experts} experts top-{top_k}, {tokens} tokens (rows {rows} vs dense {experts * tokens}, "
          f"ideal {tokens * top_k}): ours {best_ours * 1e3:.1f} ms, reference {best_ref * 1e3:.1f} ms, "
          f"ratio {best_ref / best_ours:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--block", type=int, default=None, help="rows per block (default: mean load)")
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    for experts, top_k in ((8, 2), (32, 4)):
        bench(args.tokens, experts, top_k, args.rounds, args.block)


if __name__ == "__main__":
    main()
