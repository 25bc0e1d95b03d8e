"""MoE training parity: a tiny DeepSeek-V3 (MLA, first layer dense, a shared expert, the
sequence-wise balance loss and the aux-loss-free expert-bias update on) trained 8 steps under FSDP2
gives the per-step losses (balance loss included), gradient norms, balance losses, expert-load
imbalance and final weights of one process on the same global batch, within 1e-5 relative, and the
same `expert_bias` (the loads are summed over the ranks before the sign update, so the two runs
take the same bias steps). Cases `moe_reference` (one process, with the llama reference) and
`moe_fsdp2` (in the shared 2-rank launch) of _trainer_worker.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _case_results import case_result as _result
from _case_results import case_weights as _weights
from _case_results import check_param_norms
from _case_results import rel_err as _rel
from _trainer_worker import STEPS

RTOL = 1e-5




@pytest.fixture(scope="module")
def runs(reference, world2):
    return reference


def test_fsdp2_moe_training_matches_one_process(runs):
    ref, got = _result(runs, "moe_reference"), _result(runs, "moe_fsdp2")
    assert len(ref["losses"]) == len(got["losses"]) == STEPS and ref["losses"][-1] < ref["losses"][0]
    for key, a, b in (("loss", got["losses"], ref["losses"]), ("grad_norm", got["grad_norms"], ref["grad_norms"]),
                      *((k, got["moe"][k], ref["moe"][k]) for k in ("moe/aux_loss", "moe/max_imbalance"))):
        assert _rel(a, b) <= RTOL, f"{key}: {a} vs {b} (rel err {_rel(a, b):.2e})"
    check_param_norms(ref, got, RTOL)
    assert min(ref["moe"]["moe/aux_loss"]) > 0
    want, have = _weights(runs, "moe_reference"), _weights(runs, "moe_fsdp2")
    assert set(have) == set(want)
    bias = "layers.1.moe.router.expert_bias"
    assert np.abs(want[bias]).max() > 0          # the bias moved ...
    np.testing.assert_array_equal(have[bias], want[bias])     # ... by the same sign steps
    for name in want:
        np.testing.assert_allclose(have[name], want[name], rtol=RTOL, atol=1e-6, err_msg=name)
