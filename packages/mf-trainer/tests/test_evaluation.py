"""`mf_trainer.evaluate` (what `mf eval` runs) against a numpy computation of the same metrics
from the model's logits on the same batches, read independently with mf-data."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

import mf_ckpt
import mf_config
import mf_data
import mf_models
from mf_trainer import TrainerConfigError, evaluate


def numpy_metrics(logits: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
    """Token-weighted mean cross entropy and argmax accuracy over the loss-mask tokens (float64)."""
    z = logits.astype(np.float64).reshape(-1, logits.shape[-1])
    z = z - z.max(axis=-1, keepdims=True)
    nll = np.log(np.exp(z).sum(axis=-1)) - z[np.arange(len(z)), labels.reshape(-1)]
    m = mask.reshape(-1).astype(np.float64)
    correct = (z.argmax(axis=-1) == labels.reshape(-1)).astype(np.float64)
    return float((nll * m).sum() / m.sum()), float((correct * m).sum() / m.sum())


@pytest.fixture(scope="module")
def weights(tmp_path_factory, tiny_config):
    section = tiny_config("x", "y")["model"]
    state = mf_models.model_state(mf_models.build_model(section, seed=5))
    path = tmp_path_factory.mktemp("ckpt") / "ckpt"
    mf_ckpt.save(str(path), 3, state, None, common={"hf_config": section})
    return str(path), section, state


def _config(tmp_path, tiny_corpus, tiny_config, weights, **changes):
    raw = tiny_config(tmp_path, tiny_corpus, checkpoint={"load_path": weights[0]})
    dl = raw["train_dataset"]["dataloader"]
    dl["sizes"] = [20, 6, 0]
    dl["config"]["split"] = "80,20,0"
    raw.update(changes)
    return raw


def test_evaluate_matches_numpy_on_the_valid_split(tmp_path, tiny_corpus, tiny_config, weights):
    raw = _config(tmp_path, tiny_corpus, tiny_config, weights)
    result = evaluate(mf_config.load_config(raw))  # GRAPH_MODE (context.mode 0)
    assert result.batches == 3 and result.samples == 6  # fewer than eval_iters' 10: the whole split, said so
    assert result.data == "train_dataset (valid split)"

    dl = raw["train_dataset"]["dataloader"]
    loader = mf_data.BlendedMegatronDatasetDataLoader(
        datasets_type="GPTDataset", sizes=dl["sizes"], config=dl["config"], column_names=dl["column_names"],
        micro_batch_size=2, phase="valid", num_parallel_workers=0)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = mf_models.build_model(weights[1], init=False)
    mf_models.load_state(model, weights[2])
    logits, labels, mask = [], [], []
    for batch in loader:
        ids = ms.Tensor(batch["input_ids"].astype(np.int32))
        pos = ms.Tensor(batch["position_ids"].astype(np.int32))
        logits.append(model(ids, pos).asnumpy())
        labels.append(batch["labels"])
        mask.append(batch["loss_mask"])
    loss, accuracy = numpy_metrics(np.concatenate(logits), np.concatenate(labels), np.concatenate(mask))
    assert result.loss == pytest.approx(loss, rel=1e-5, abs=1e-6)
    assert result.accuracy == pytest.approx(accuracy, abs=1e-9)
    assert result.ppl == pytest.approx(np.exp(loss), rel=1e-5)
    assert result.tokens == int(np.concatenate(mask).sum())


@pytest.mark.parametrize("change, message", [
    ({"eval_dataset": "both"}, "eval_dataset.dataloader.sizes: name the split to evaluate by giving exactly one split"),
    ({"valid": 0}, "train_dataset.dataloader.sizes: evaluating the valid split needs sizes[1] > 0"),
    ({"checkpoint": {"load_path": ""}}, "checkpoint.load_path: empty, and checkpoint.save_path "),
    ({"checkpoint": {"load_path": "/nonexistent"}}, "checkpoint.load_path: /nonexistent: checkpoint directory does not"),
])
def test_evaluation_refusals(tmp_path, tiny_corpus, tiny_config, weights, change, message):
    raw = _config(tmp_path, tiny_corpus, tiny_config, weights)
    if change.get("eval_dataset") == "both":
        dl = {**raw["train_dataset"]["dataloader"], "sizes": [6, 6, 0]}
        raw["eval_dataset"] = {"dataloader": dl}
    elif "valid" in change:
        raw["train_dataset"]["dataloader"]["sizes"] = [20, 0, 0]
    else:
        raw.update(change)
    with pytest.raises(TrainerConfigError) as err:
        evaluate(mf_config.load_config(raw))
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
