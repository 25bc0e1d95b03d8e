"""A Hugging Face directory is a load source: sharded destinations, no offline conversion."""

from __future__ import annotations

import numpy as np
import pytest

from mf_ckpt import CheckpointError, LoadOptions, load, load_hf_state, run_threaded, shard_array, split_evenly


@pytest.mark.parametrize("arch, balanced, axis", [("llama", False, 0), ("llama", True, 0),
                                                   ("gpt2", False, 0), ("gpt2", True, 1), ("glm4", False, 1)])
def test_load_sharded_from_hf(hf_fixtures, arch, balanced, axis):
    """Matrices split over two ranks along `axis`: GPT-2's come out of transposed Conv1D tensors
    (c_attn packed), GLM-4's w1 / w3 out of the packed gate_up_proj."""
    _, ref = load_hf_state(hf_fixtures / arch)

    def body(comm):
        dest = {name: shard_array(np.zeros_like(a), axis, comm.rank, comm.world_size) if a.ndim == 2
                else np.zeros_like(a) for name, a in ref.items()}
        r = load(LoadOptions(load_path=str(hf_fixtures / arch), load_balanced=balanced), dest, comm=comm)
        return dest, r

    results = run_threaded(2, body)
    assert results[0][1].kind == "hf" and results[0][1].common["hf_config"]["model_type"] == arch
    for name, arr in ref.items():
        if arr.ndim == 2:
            got = np.concatenate([r[0][name].data for r in results], axis=axis)
        else:
            got = results[1][0][name]
        assert got.tobytes() == arr.tobytes(), name


def test_expert_parallel_load_reads_only_local_experts(hf_fixtures):
    _, ref = load_hf_state(hf_fixtures / "deepseek_v3")
    names = [n for n in ref if ".moe.experts." in n]

    def body(comm):
        # 8 experts over 3 ranks (3, 3, 2): each rank only reads its own experts' HF tensors.
        dest = {}
        for n in names:
            sizes = [3, 3, 2]
            local = np.zeros((sizes[comm.rank],) + ref[n].shape[1:], np.float32)
            dest[n] = split_evenly(local, ref[n].shape, 0, comm.rank, 3)
        r = load(str(hf_fixtures / "deepseek_v3"), dest, comm=comm)
        return dest, r

    results = run_threaded(3, body)
    assert [r[1].regions_read for r in results] == [3 * len(names), 3 * len(names), 2 * len(names)]
    for n in names:
        assert np.concatenate([r[0][n].data for r in results]).tobytes() == ref[n].tobytes()


def test_hf_source_errors_name_the_tensor(hf_fixtures):
    with pytest.raises(CheckpointError, match=r"'layers.0.attention.wq.weight' has shape \[96, 96\], destination global shape \[96, 95\]"):
        load(str(hf_fixtures / "llama"), {"layers.0.attention.wq.weight": np.zeros((96, 95), np.float32)})
    with pytest.raises(CheckpointError, match="iteration=3 given, but this is not an mf save directory"):
        load(str(hf_fixtures / "llama"), {}, iteration=3)
