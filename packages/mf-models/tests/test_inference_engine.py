"""The continuous-batching engine (PyNative here; GRAPH_MODE in test_inference_graph.py): HF greedy
parity, batches of different lengths joining and leaving, stop tokens, cancellation, seeded sampling
independent of the batch, request validation, loading checkpoints without a YAML."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mf_ckpt
import mf_models
from mf_models.inference import InferenceEngine, RequestError, SamplingParams, load_pretrained


@pytest.fixture(scope="module")
def tiny():
    return mf_models.build_model(mf_models.tiny_model_section("qwen3"), seed=1)


PROMPTS = [[5, 9, 33, 2, 41], list(range(3, 23)), [7], [60, 61, 62, 8, 9, 10, 11, 12, 13], [17, 4, 40]]
NEW = [6, 9, 4, 12, 7]


def reference(model, prompt, new):
    """HF-style greedy from the recompute-everything path (no KV cache at all)."""
    return mf_models.generate(model, prompt, new, eos_token_id=[], use_cache=False)[len(prompt):].tolist()


def test_greedy_matches_hf_fixtures(hf_fixtures, hf_name):
    ref = np.load(hf_fixtures / f"{hf_name}_ref.npz")
    loaded = load_pretrained(hf_fixtures / hf_name)
    prompt = ref["prompt"][0].tolist()
    new = ref["greedy"].shape[1] - len(prompt)
    engine = InferenceEngine(loaded.model, max_slots=2, max_len=32, eos_token_ids=[])
    # the fixture prompt twice, once alone and once beside a longer unrelated prompt
    done = engine.generate([prompt, list(range(100, 120)), prompt], SamplingParams(max_new_tokens=new))
    assert done[0].output_ids == ref["greedy"][0, len(prompt):].tolist()
    assert done[2].output_ids == done[0].output_ids
    assert done[0].finish_reason == "length" and done[0].completion_tokens == new
    eos = json.loads((hf_fixtures / hf_name / "config.json").read_text())["eos_token_id"]
    assert loaded.kind == "hf" and loaded.eos_token_ids == ([] if eos is None else [eos])


def test_requests_join_and_leave_between_steps(tiny):
    engine = InferenceEngine(tiny, max_slots=2, max_len=40, eos_token_ids=[])
    joined = []
    done = engine.generate(PROMPTS, [SamplingParams(max_new_tokens=n) for n in NEW],
                           on_update=lambda r, ids: joined.append((r.id, r.slot, engine.stats.decode_steps)))
    for prompt, new, request in zip(PROMPTS, NEW, done):
        assert request.output_ids == reference(tiny, prompt, new), prompt
        assert request.finish_reason == "length"
    stats = engine.stats
    assert stats.prefilled == len(PROMPTS) and stats.generated_tokens == sum(NEW)
    # two slots shared: fewer decode steps than tokens, more than the longest request alone
    assert max(NEW) <= stats.decode_steps < sum(NEW) - len(PROMPTS)
    first_step = {}
    for rid, slot, step in joined:
        first_step.setdefault(rid, (slot, step))
    later = [first_step[r.id] for r in done[2:]]
    assert all(step > 0 for _, step in later)  # the last three joined while others were decoding
    assert {slot for slot, _ in first_step.values()} == {0, 1}
    assert engine.scheduler.active() == [] and not engine.has_work()


def test_a_decode_call_covers_the_occupied_slots_not_every_slot(tiny):
    engine = InferenceEngine(tiny, max_slots=5, max_len=40, eos_token_ids=[])
    calls = []   # rows each decode call covered
    build = engine._decode_step
    engine._decode_step = lambda rows, *rest: calls.append(rows) or build(rows, *rest)
    alone = engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=4))
    assert calls == [1, 1, 1] and alone[0].output_ids == reference(tiny, PROMPTS[0], 4)
    calls.clear()
    # slots 0..2 taken: 4 rows (the next power of two); once slot 2's request is done (1 decode
    # step) slots 0 and 1 remain: 2 rows; once slot 1's is (5 steps), slot 0 alone: 1 row
    crowd = engine.generate(PROMPTS[1:4], [SamplingParams(max_new_tokens=n) for n in (9, 6, 2)])
    assert calls == [4, 2, 2, 2, 2, 1, 1, 1]
    for prompt, new, request in zip(PROMPTS[1:4], (9, 6, 2), crowd):
        assert request.output_ids == reference(tiny, prompt, new)
    # all five slots: the last bucket is max_slots itself
    engine.generate(PROMPTS, SamplingParams(max_new_tokens=2))
    assert calls[-1] == 5 and sorted({key[0] for key in engine._decode}) == [1, 2, 4, 5]


def test_requests_seated_together_share_one_prefill_call(tiny):
    engine = InferenceEngine(tiny, max_slots=4, max_len=40, eos_token_ids=[])
    short = [PROMPTS[0], PROMPTS[2], PROMPTS[3]]          # one prompt bucket (16): one call of 4 rows
    done = engine.generate(short + [PROMPTS[1]], [SamplingParams(max_new_tokens=n) for n in (3, 5, 2, 4)])
    assert engine.stats.prefill_calls == 2 and engine.stats.prefilled == 4   # bucket 16 (3 + a repeat), 32
    assert sorted(key[3] for key in engine._prefill) == [1, 4]
    for prompt, new, request in zip(short + [PROMPTS[1]], (3, 5, 2, 4), done):
        assert request.output_ids == reference(tiny, prompt, new)


def test_stop_tokens_end_a_request_and_free_its_slot(tiny):
    prompt = PROMPTS[3]
    greedy = reference(tiny, prompt, 8)
    stop = greedy[3]
    cut = greedy.index(stop)
    engine = InferenceEngine(tiny, max_slots=1, max_len=32, eos_token_ids=[])
    stopped, after = engine.generate([prompt, PROMPTS[0]],
                                     [SamplingParams(max_new_tokens=8, stop_token_ids=(stop,)), SamplingParams(max_new_tokens=3)])
    assert stopped.output_ids == greedy[:cut] and stopped.finish_reason == "stop" and stopped.stop_token == stop
    assert stopped.completion_tokens == cut + 1
    assert after.output_ids == reference(tiny, PROMPTS[0], 3)  # the freed slot served the next request
    # the engine's EOS ids apply unless ignore_eos
    engine = InferenceEngine(tiny, max_slots=1, max_len=32, eos_token_ids=[stop])
    assert engine.generate([prompt], SamplingParams(max_new_tokens=8))[0].finish_reason == "stop"
    assert engine.generate([prompt], SamplingParams(max_new_tokens=8, ignore_eos=True))[0].output_ids == greedy


def test_cancel_ends_a_request_at_the_next_step(tiny):
    engine = InferenceEngine(tiny, max_slots=2, max_len=40, eos_token_ids=[])

    def cancel_after_two(request, new_ids):
        if len(request.output_ids) == 2:
            request.cancel()

    long = engine.submit(PROMPTS[1], SamplingParams(max_new_tokens=15), on_update=cancel_after_two)
    other = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=5))
    while engine.has_work():
        engine.step()
    assert long.finish_reason == "cancelled" and len(long.output_ids) == 2 and long.done.is_set()
    assert other.output_ids == reference(tiny, PROMPTS[0], 5)
    waiting = engine.submit(PROMPTS[2], SamplingParams(max_new_tokens=5))
    waiting.cancel("gone")
    engine.step()
    assert waiting.finish_reason == "gone" and waiting.output_ids == [] and engine.stats.prefilled == 2


def test_seeded_sampling_does_not_depend_on_the_batch(tiny):
    engine = InferenceEngine(tiny, max_slots=3, max_len=40, eos_token_ids=[])
    params = SamplingParams(max_new_tokens=8, do_sample=True, temperature=1.5, top_k=20, top_p=0.9, seed=11)
    alone = engine.generate([PROMPTS[0]], params)[0].output_ids
    crowd = engine.generate([PROMPTS[3], PROMPTS[1], PROMPTS[0]],
                            [SamplingParams(max_new_tokens=6, do_sample=True, seed=1), SamplingParams(max_new_tokens=9),
                             params])
    assert crowd[2].output_ids == alone  # another slot, other neighbours, greedy and sampling rows mixed
    assert crowd[1].output_ids == reference(tiny, PROMPTS[1], 9)
    other_seed = engine.generate([PROMPTS[0]], SamplingParams(**{**params.__dict__, "seed": 12}))[0].output_ids
    assert other_seed != alone
    greedy = reference(tiny, PROMPTS[0], 8)
    assert engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=8, do_sample=True, top_k=1, seed=3))[0].output_ids == greedy
    assert engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=8, do_sample=True, top_p=1e-6, seed=4))[0].output_ids == greedy


def test_bad_requests_and_settings_are_one_line_errors(tiny):
    engine = InferenceEngine(tiny, max_slots=1, max_len=16)
    for prompt, message in (([], "empty"), ([64], "outside the vocabulary"), ([1] * 14, "exceeds the engine's max length"),
                            (["a"], "integers")):
        with pytest.raises(RequestError, match=message):
            engine.generate([[1, 2], prompt], SamplingParams(max_new_tokens=3))
    assert engine.stats.prefill_calls == 0  # nothing ran: every prompt is checked first
    for kwargs, message in (({"max_new_tokens": 0}, "max_new_tokens"), ({"temperature": 0.0}, "temperature"),
                            ({"top_p": 1.5}, "top_p"), ({"top_k": -1}, "top_k"), ({"seed": -2}, "seed"),
                            ({"stop_token_ids": (-1,)}, "stop_token_ids")):
        with pytest.raises(ValueError, match=message):
            SamplingParams(**kwargs)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        InferenceEngine(tiny, max_len=65)
    with pytest.raises(ValueError, match="max_slots"):
        InferenceEngine(tiny, max_slots=0)


def test_load_pretrained_reads_an_mf_checkpoint_without_yaml(tmp_path, tiny):
    section = mf_models.tiny_model_section("qwen3")
    (tmp_path / "tok.model").write_bytes(b"placeholder")  # only its path is looked up here
    common = {"step": 3, "hf_config": section, "train_config": {"tokenizer": {"path": str(tmp_path / "tok.model")}}}
    mf_ckpt.save(str(tmp_path / "tiny-qwen"), 3, mf_models.model_state(tiny), common=common)
    loaded = load_pretrained(tmp_path / "tiny-qwen")
    assert (loaded.kind, loaded.iteration, loaded.name) == ("mf", 3, "tiny-qwen")
    assert loaded.tokenizer_path == str(tmp_path / "tok.model") and loaded.eos_token_ids == []
    engine = InferenceEngine(loaded.model, max_slots=1, max_len=16)
    assert engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=4))[0].output_ids == reference(tiny, PROMPTS[0], 4)
    # a relative tokenizer.path (as a training YAML says it) is found from the training directory
    # too: the checkpoint directory ends with the recorded save_path
    (tmp_path / "run" / "data").mkdir(parents=True)
    (tmp_path / "run" / "data" / "spm.model").write_bytes(b"placeholder")
    relative = {"tokenizer": {"path": "data/spm.model"}, "output_dir": "out", "checkpoint": {"save_path": ""}}
    mf_ckpt.save(str(tmp_path / "run" / "out" / "checkpoint"), 2, mf_models.model_state(tiny),
                 common={"hf_config": section, "train_config": relative})
    found = load_pretrained(tmp_path / "run" / "out" / "checkpoint" / "iteration_00000002")
    assert found.tokenizer_path == str(tmp_path / "run" / "data" / "spm.model") and found.name == "out"  # the run's name, not "checkpoint"
    relative["tokenizer"]["path"] = "data/missing.model"
    mf_ckpt.save(str(tmp_path / "run" / "out" / "checkpoint"), 3, mf_models.model_state(tiny),
                 common={"hf_config": section, "train_config": relative})
    missing = load_pretrained(tmp_path / "run" / "out" / "checkpoint")
    assert missing.tokenizer_path is None and "data/missing.model does not exist" in missing.notes[0]
    mf_ckpt.save(str(tmp_path / "bare"), 1, mf_models.model_state(tiny), common={"step": 1})
    with pytest.raises(mf_ckpt.CheckpointError, match="does not record its model"):
        load_pretrained(tmp_path / "bare")


def test_a_recorded_tokenizer_path_with_a_nul_byte_is_one_line(tmp_path, tiny):
    section = mf_models.tiny_model_section("qwen3")
    mf_ckpt.save(str(tmp_path / "nul"), 1, mf_models.model_state(tiny),
                 common={"hf_config": section, "train_config": {"tokenizer": {"path": "data/a\x00b.model"}}})
    with pytest.raises(mf_ckpt.CheckpointError) as info:
        load_pretrained(tmp_path / "nul")
    assert "tokenizer.path holds a NUL byte" in str(info.value) and "--tokenizer" in str(info.value)


def test_model_name_is_the_run_not_a_generic_directory(tmp_path):
    from mf_models.inference import model_name

    assert model_name(tmp_path / "llama-7b-sft", {}) == "llama-7b-sft"
    assert model_name(tmp_path / "llama-7b-sft" / "iteration_00000010", {}) == "llama-7b-sft"
    run = {"train_config": {"output_dir": "output/tiny"}}
    assert model_name(tmp_path / "output" / "tiny" / "checkpoint", run) == "tiny"
    assert model_name(tmp_path / "exp3" / "checkpoint" / "iteration_00000002", run) == "tiny"
    # no recorded run (or a NUL in it): the parent directory's name
    assert model_name(tmp_path / "exp3" / "merged", {"train_config": {"output_dir": "a\x00b"}}) == "exp3"


def test_weights_are_checked_against_the_config_before_building(tmp_path, tiny):
    section = mf_models.tiny_model_section("qwen3")
    mf_ckpt.save(str(tmp_path / "ckpt"), 1, mf_models.model_state(tiny), common={"hf_config": section})
    assert mf_models.check_weights_fit(section, tmp_path / "ckpt") is True
    # a crafted hidden_size must be refused from the headers alone, before the model is allocated
    with pytest.raises(mf_ckpt.CheckpointError) as info:
        mf_models.check_weights_fit({**section, "hidden_size": 196608}, tmp_path / "ckpt")
    assert "has shape" in str(info.value) and "implies" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(mf_ckpt.CheckpointError, match="num_hidden_layers 40"):
        mf_models.check_weights_fit({**section, "num_hidden_layers": 40}, tmp_path / "ckpt")
    mf_ckpt.save(str(tmp_path / "bad"), 1, mf_models.model_state(tiny),
                 common={"hf_config": {**section, "intermediate_size": 4096}})
    with pytest.raises(mf_ckpt.CheckpointError, match="the hf_config in common.json implies"):
        load_pretrained(tmp_path / "bad")
