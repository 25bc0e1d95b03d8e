"""data_bench.py's reference side: Megatron-Core's index builders, run in the reference venv.

Imports nothing from mf (that venv holds torch and megatron-core only). Serves JSON-line requests
on stdin, one JSON line per reply on stdout: {"op": "sample_index" | "index_build" | "blend" |
"exhaustive", ...} -> {"seconds": t} (time measured here, around Megatron's calls only), writing
the arrays to `save` (.npz) when asked so the caller can check them against its own.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def main() -> None:
    out, sys.stdout = sys.stdout, sys.stderr  # library chatter must not corrupt the protocol
    try:
        import megatron.core  # noqa: F401  (its import pulls torch: seconds)
        from megatron.core.datasets import helpers as mh
        from megatron.core.datasets.gpt_dataset import _build_document_index, _build_shuffle_index

        info = {"ready": True, "version": megatron.core.__version__}
    except Exception as exc:
        info = {"ready": False, "error": f"{type(exc).__name__}: {exc}"}
    out.write(json.dumps(info) + "\n")
    out.flush()
    if not info["ready"]:
        return
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] in ("sample_index", "index_build"):
                inp = np.load(req["inputs"])
                sizes, documents, doc = inp["sizes"], inp["documents"], inp["document_index"]
                seq, epochs, tokens, separate, first = (int(req[k]) for k in ("seq", "epochs", "tokens", "separate", "first"))
                t = time.perf_counter()
                if req["op"] == "index_build":  # GPTDataset._build_document_sample_shuffle_indices
                    rs = np.random.RandomState(int(req["seed"]))
                    doc = _build_document_index(documents, epochs, rs, bool(separate))
                sample = mh.build_sample_idx(sizes, doc, seq, epochs, tokens, True, True)
                arrays = {"sample_index": sample}
                if req["op"] == "index_build":
                    n = sample.shape[0] - 1
                    arrays.update(document_index=doc, shuffle_index=_build_shuffle_index(first if separate else n, n, rs))
                seconds = time.perf_counter() - t
            else:  # BlendedDataset._build_indices
                weights = req["weights"]
                t = time.perf_counter()
                if req["op"] == "blend":
                    size = int(req["size"])
                    dataset_index, dataset_sample_index = np.zeros(size, np.int16), np.zeros(size, np.int64)
                    mh.build_blending_indices(dataset_index, dataset_sample_index, weights, len(weights), size, False)
                else:
                    size = sum(weights)
                    dataset_index, dataset_sample_index = np.zeros(size, np.int16), np.zeros(size, np.int64)
                    mh.build_exhaustive_blending_indices(dataset_index, dataset_sample_index, weights, len(weights))
                seconds = time.perf_counter() - t
                arrays = {"dataset_index": dataset_index, "dataset_sample_index": dataset_sample_index}
            if req.get("save"):
                np.savez(req["save"], **arrays)
            reply = {"seconds": seconds}
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()



if __name__ == "__main__":
    main()
