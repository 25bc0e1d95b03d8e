"""A real `mf_models.serving.serve` process for the soak test: a one-layer tiny llama (vocab 100, EOS 2),
token-id prompts (no tokenizer), 127.0.0.1 on a free port; prints `listening on URL` when ready.

    python soak_server.py            # serve until SIGTERM
    python soak_server.py --break-decode-after N
                                     # from the N-th decode step on, every decode raises (a device
                                     # that went away): the server must exit non-zero by itself
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402

import mf_models  # noqa: E402
from mf_models.inference import InferenceEngine  # noqa: E402
from mf_models.serving import ServerLimits, serve  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--break-decode-after", type=int)
    args = parser.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU", pynative_synchronize=True)
    model = mf_models.build_model(mf_models.tiny_model_section("llama", vocab_size=100, eos_token_id=2,
                                                         num_hidden_layers=1), seed=4)
    engine = InferenceEngine(model, max_slots=4, max_len=32)
    if args.break_decode_after is not None:
        real, calls = engine._decode_all, [0]

        def decode(active):
            calls[0] += 1
            if calls[0] > args.break_decode_after:
                raise RuntimeError("device lost (injected)")
            real(active)

        engine._decode_all = decode
    try:
        serve(engine, model_name="soak", host="127.0.0.1", port=0, limits=ServerLimits(max_tokens=8, max_waiting=64),
              on_ready=lambda url: print(f"listening on {url}", flush=True))
    except RuntimeError as exc:
        print(f"soak server: failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
