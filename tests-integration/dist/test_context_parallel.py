"""Context parallelism on 2 and 4 CPU ranks (one launch each, `_cp_worker.py`).

- The attention Cells (ring / Ulysses / hybrid, async ring) forward and backward against full
  attention in float64 numpy on random inputs: GQA, fully masked rows (CoreAttention's uniform
  softmax) and packed documents; Ulysses also compiled (GRAPH_MODE) on 2 ranks.
- qwen3 (q/k norms) and deepseek_v3 (MLA) forward and backward under CP2 colossal / ulysses /
  packed documents (dense reset_attention_mask and the compressed actual_seq_len, async ring),
  CP4 hybrid 2 x 2 (packed) and CP2 Ulysses x TP2: the loss summed over the ranks and every rank's
  gradient shards equal one process on the full sequence, 1e-5 relative. The tiny llama's layouts
  (and the compiled ring step) are proven through the Trainer (test_trainer_parity.py).
"""

from __future__ import annotations

import pytest
from _launches import CP_WORLD2_CASES, CP_WORLD4_CASES


def _check(run, world: int, prefix: str) -> list[dict]:
    found = [r for r in run.results if r["name"].startswith(prefix)]
    assert found, f"no results named {prefix}*"
    bad = [f"rank {r['rank']} {r['name']}: {r['detail']}" for r in found if not r["ok"]]
    assert not bad, "\n".join(bad)
    assert {r["rank"] for r in found} == set(range(world)), f"{prefix}: results from some ranks only"
    return found


@pytest.mark.parametrize("world", [2, 4])
def test_attention_cells_match_float64_full_attention(request, world):
    run = request.getfixturevalue(f"cp_world{world}")
    found = _check(run, world, "cp_attention[")
    names = {r["name"] for r in found}
    assert any("packed" in n for n in names) and any("ulysses" in n for n in names)
    if world == 2:
        assert "cp_attention[ulysses,graph,packed]" in names
    else:
        assert any("hybrid" in n for n in names)


@pytest.mark.parametrize("world", [2, 4])
def test_async_said_once_and_dense_masks_refused(request, world):
    run = request.getfixturevalue(f"cp_world{world}")
    _check(run, world, "cp_async_said_once")
    _check(run, world, "cp_dense_mask_refused")


@pytest.mark.parametrize("case", CP_WORLD2_CASES)
def test_model_parity_two_ranks(cp_world2, case):
    _check(cp_world2, 2, f"cp_model[{case}]")


@pytest.mark.parametrize("case", CP_WORLD4_CASES)
def test_model_parity_four_ranks(cp_world4, case):
    _check(cp_world4, 4, f"cp_model[{case}]")
