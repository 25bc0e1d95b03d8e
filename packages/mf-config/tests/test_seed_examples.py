"""The YAML examples of the configuration reference (seeds/000), verbatim, in the order they appear:
the skeleton (examples/skeleton.yaml) and each section's example (examples/reference/NN_name.yaml).

They are the user's documented examples: every one must validate (combined with the minimal
required sections where it shows only one section). A test also checks, when the reference is
available beside the checkout, that these copies still match it. (tests-integration/
test_reference_examples.py lays each over the skeleton and dry-runs it at its own world.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from mf_config import config_to_dict, dump_config, load_config

REPO_ROOT = Path(__file__).resolve().parents[3]

SEED_EXAMPLES = {
    "skeleton": """\
# ===== 权重保存与加载（可省略，省略则按默认保存到 save_path）=====
checkpoint:
  # 保存配置，默认
  enable_save: True
  save_path: "./output/ckpt"
  save_interleaved_steps: 1000
  # 加载配置
  load_path: ""                 # 默认为空，表示不加载权重
  no_load_optim: False          # 断点续训务必为 False

# ===== 训练规模（建议显式提供）=====
training:
  steps: 1000
  local_batch_size: 1
  global_batch_size: 8
  max_norm: 1.0
  seed: 42

# ===== 多维并行（可省略，省略则纯 FSDP 单策略）=====
parallelism:
  data_parallel_shard: -1                      # -1 表示自动按可用卡数切分
  tensor_parallel: 1
  pipeline_parallel: 1
  context_parallel: 1
  expert_parallel: 1
  # sequence_parallel: False # 随 TP 自动开启，当前不支持关闭（无需配置此项，详见并行训练文档第六节）

# ===== 优化器（type 固定，其余按优化器类型透传）=====
optimizer:
  type: AdamW
  betas: [0.9, 0.95]
  eps: 1.e-8
  weight_decay: 0.01

# ===== 学习率调度（type/learning_rate 固定，warmup 等按调度器类型透传）=====
lr_scheduler:
  type: ConstantWarmUpLR
  learning_rate: 1.e-5
  warmup_ratio: 0                              # 透传字段，含义见具体学习率调度器的实现

# ===== 数据集（必须提供数据来源）=====
train_dataset:
  dataloader:
    type: BlendedMegatronDatasetDataLoader
    datasets_type: "GPTDataset"
    sizes: [1000, 0, 0]
    column_names: ["input_ids", "labels", "loss_mask", "position_ids"]
    shuffle: False
    config:                    # 完整字段见「数据集」文档
      seq_length: 4096
      split: "1, 0, 0"
      eod: 1
      pad: -1
      create_attention_mask: False
      create_compressed_eod_mask: False
      data_path:
        - '1'
        - "/path/megatron_data_text_document"
  drop_remainder: True
  num_parallel_workers: 8

# ===== 模型（必须提供）：model_type/architectures 固定，其余结构超参透传 =====
model:
  model_type: deepseek_v3
  architectures: DeepseekV3ForCausalLM
  vocab_size: 129280
  seq_length: 4096
  hidden_size: 1792
  num_hidden_layers: 12
  num_attention_heads: 8
  use_flash_attention: True
  compute_dtype: "bfloat16"

# ===== 以下段均可整段省略，省略即关闭对应能力 =====
monitor:
  moe_monitor:
    save_tokens_per_expert_interval: 100
    target_layers: [0, 1, 2]

profiler:
  enable_profiling: False

recompute:
  mode: "None"

swap:
  enable: False

callbacks: []
""",
}
# each section's example, in the reference's order (file names NN_name.yaml)
SEED_EXAMPLES.update({path.stem.split("_", 1)[1]: path.read_text(encoding="utf-8")
                      for path in sorted((REPO_ROOT / "examples" / "reference").glob("[0-9][0-9]_*.yaml"))})


@pytest.mark.parametrize("name", list(SEED_EXAMPLES))
def test_seed_example_validates_with_the_minimal_sections(load_text, name):
    cfg = load_text(SEED_EXAMPLES[name])
    # Every key the example writes is what the loaded config holds.
    written = yaml.safe_load(SEED_EXAMPLES[name])
    loaded = config_to_dict(cfg)
    for section, values in written.items():
        _assert_contains(loaded[section], values, section)
    assert load_config(yaml.safe_load(dump_config(cfg))) == cfg


def _assert_contains(loaded, written, path):
    if isinstance(written, dict):
        for key, value in written.items():
            _assert_contains(loaded[key], value, f"{path}.{key}")
    elif isinstance(written, list) and written and isinstance(written[0], dict):
        for i, (a, b) in enumerate(zip(loaded, written, strict=True)):
            _assert_contains(a, b, f"{path}[{i}]")
    elif isinstance(written, str) and isinstance(loaded, float):
        assert loaded == float(written), path  # PyYAML 1.1 reads 1.e-5 / 1e-5 differently; both are numbers here
    else:
        assert loaded == written, path


def _find_reference() -> Path | None:
    for ancestor in (REPO_ROOT, *REPO_ROOT.parents):
        candidate = ancestor / "shared" / "seeds" / "000_e9ec00f06edcd2f9.txt"
        if candidate.is_file():
            return candidate
    return None


def test_examples_skeleton_yaml_is_the_reference_skeleton_verbatim():
    text = (REPO_ROOT / "examples" / "skeleton.yaml").read_text(encoding="utf-8")
    assert text.endswith(SEED_EXAMPLES["skeleton"])


def test_this_copy_matches_the_reference():
    reference = _find_reference()
    if reference is None:
        pytest.skip("the configuration reference (shared/seeds) is not beside this checkout")
    blocks = re.findall(r"```yaml\n(.*?)```", reference.read_text(encoding="utf-8"), re.S)
    assert blocks == list(SEED_EXAMPLES.values())


@pytest.mark.parametrize("name", [n for n in SEED_EXAMPLES if n not in ("skeleton", "model")])
def test_seed_example_validates_on_the_seed_model(load_text, name):
    # The reference's own model (DeepSeek-V3 shape: 12 layers, 8 heads, 8 routed experts) with
    # each section example: the parallelism example's EP 8 / TP 2 / PP 2 must fit it.
    cfg = load_text(SEED_EXAMPLES[name] + SEED_EXAMPLES["model"])
    assert cfg.model.extra["n_routed_experts"] == 8
