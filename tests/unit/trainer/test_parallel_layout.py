"""The parallel layout in one process: exact shard / unshard of every split kind, and the refusals (a layout
the world or the model does not fit, a request at another layout, an unknown optimizer) that change nothing."""

from __future__ import annotations

import pytest
import torch

from meshrl.common.errors import ConfigError, InvalidArgument
from meshrl.trainer.hf_config import read_hf_config
from meshrl.trainer.model import check_fits_layout, padded_vocab_size
from meshrl.trainer.optim import OptimizerConfig
from meshrl.trainer.parallel import Layout, check_layout
from meshrl.trainer.sharding import COLUMN, FC1, ROW, VOCAB, WHOLE, placements, shard, unshard


@pytest.mark.parametrize("split", [COLUMN, ROW, FC1, VOCAB, WHOLE])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_shard_then_unshard_is_exact(split, tp):
    full = torch.randn(275 if split == VOCAB else 16, 8)
    rows = padded_vocab_size(275, tp) if split == VOCAB else 0
    parts = [shard(full, split, tp, r, rows) for r in range(tp)]
    if split == FC1:  # rank r holds [gate_r; up_r]
        gate, up = full.chunk(2)
        assert torch.equal(parts[-1], torch.cat([gate.chunk(tp)[-1], up.chunk(tp)[-1]]))
    if split == VOCAB and tp > 1:  # zero padding rows at the end of the last shard
        assert parts[-1].shape[0] * tp == rows and parts[-1][-(rows - 275) :].abs().sum() == 0
    assert torch.equal(unshard(parts if split != WHOLE else parts[:1], split, 275), full)


def test_placements_split_layers_by_stage(qwen2_dir):
    spec = read_hf_config(qwen2_dir)
    placed = {p.mapping.megatron: p for p in placements(spec, Layout(pipeline_parallel=2))}
    layer1 = placed["decoder.layers.1.mlp.linear_fc1.weight"]
    assert (layer1.stage, layer1.local_name, layer1.split) == (1, "decoder.layers.0.mlp.linear_fc1.weight", FC1)
    assert placed["embedding.word_embeddings.weight"].stage == 0 and placed["decoder.final_layernorm.weight"].stage == 1
    assert placed["decoder.layers.0.self_attention.linear_proj.weight"].split == ROW


def test_layouts_the_world_or_model_cannot_take_are_refused(qwen2_dir):
    with pytest.raises(ConfigError, match="parallel.tensor_parallel"):
        check_layout(4, 0, 1)
    with pytest.raises(ConfigError, match="does not divide the 4 trainer ranks"):
        check_layout(4, 3, 1)
    assert check_layout(8, 2, 2) == 2
    spec = read_hf_config(qwen2_dir)  # 4 heads, 2 kv heads, 2 layers
    with pytest.raises(InvalidArgument, match="num_key_value_heads 2 is not divisible by tensor_parallel 4"):
        check_fits_layout(spec, Layout(tensor_parallel=4), value_head=False)
    with pytest.raises(InvalidArgument, match="num_hidden_layers 2 is not divisible by pipeline_parallel 4"):
        check_fits_layout(spec, Layout(pipeline_parallel=4), value_head=False)
    with pytest.raises(InvalidArgument, match="critic"):
        check_fits_layout(spec, Layout(tensor_parallel=2), value_head=True)


def test_a_process_at_one_layout_refuses_another():
    from meshrl.trainer.config import TrainerConfig
    from meshrl.trainer.core import TrainerCore
    from meshrl.trainer.parallel import init_parallel_state
    from meshrl.trainer.service import TrainerService

    with pytest.raises(ConfigError, match="does not divide the 1 trainer ranks"):
        init_parallel_state(1, 2)
    service = TrainerService(TrainerConfig(), TrainerCore())
    service.check_layout(1, 1, 1)
    service.check_layout(0, 0, 0)
    with pytest.raises(InvalidArgument, match=r"parallel.tensor_parallel = 2 was asked.*TP=1 PP=1 DP=1"):
        service.check_layout(2, 0, 0)


def test_unknown_optimizer_is_refused():
    with pytest.raises(ConfigError, match="optimizer.name"):
        OptimizerConfig(name="lion")
