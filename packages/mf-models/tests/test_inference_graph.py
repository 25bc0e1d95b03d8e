"""The engine compiled (GRAPH_MODE): HF greedy parity beside a sampling request in the other slot
(one prefill and one decode graph serve both kinds of rows), one graph per bucket reused across
calls, and the compiled result equal to the eager one. Compiles cost seconds each: two here; the
greedy-only graphs are compiled by the mf-cli and integration tests."""

from __future__ import annotations

import mindspore as ms
import numpy as np

from mf_models.inference import InferenceEngine, SamplingParams, load_pretrained


def test_compiled_engine_matches_hf_and_reuses_its_graphs(hf_fixtures, graph_mode):
    ref = np.load(hf_fixtures / "llama_ref.npz")
    model = load_pretrained(hf_fixtures / "llama").model
    prompt = ref["prompt"][0].tolist()
    new = ref["greedy"].shape[1] - len(prompt)
    engine = InferenceEngine(model, max_slots=2, max_len=40, eos_token_ids=[])
    other = list(range(200, 211))
    sampled = SamplingParams(max_new_tokens=new, do_sample=True, temperature=1.3, top_k=50, top_p=0.95, seed=5)
    greedy = SamplingParams(max_new_tokens=new)
    first = engine.generate([other, prompt], [sampled, greedy])
    assert first[1].output_ids == ref["greedy"][0, len(prompt):].tolist()
    # prefill bucket 16 with sampling rows (both requests in one call: 2 rows) and decode bucket
    # 40 with sampling rows
    assert engine.stats.graphs_built == 2
    again = engine.generate([prompt, other], [greedy, sampled])
    assert [r.output_ids for r in again] == [first[1].output_ids, first[0].output_ids]
    assert engine.stats.graphs_built == 2
    ms.set_context(mode=ms.PYNATIVE_MODE)
    eager = engine.generate([other, prompt], [sampled, greedy])
    assert [r.output_ids for r in eager] == [r.output_ids for r in first]
