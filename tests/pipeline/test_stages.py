"""A model cut into stages computes exactly what the whole model computes, and each member holds only
its own layers."""

from __future__ import annotations

import pytest
import torch

from workloads.model.loading import load_model
from workloads.pipeline.stages import StageError, boundary_activations, load_stage, plan_stages, split_layers


def test_layers_are_split_contiguously_the_first_members_taking_the_remainder() -> None:
    assert split_layers(4, 2) == [range(0, 2), range(2, 4)]
    assert split_layers(4, 3) == [range(0, 2), range(2, 3), range(3, 4)]
    assert split_layers(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    with pytest.raises(StageError, match="at least one layer"):
        split_layers(4, 5)


@pytest.mark.parametrize("members", [1, 2, 3, 4])
def test_chained_stages_give_the_whole_models_activations_and_logits(members: int) -> None:
    full = load_model("tiny")
    plans = plan_stages("tiny", members)
    stages = [load_stage("tiny", p) for p in plans]
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = (ids != 0).long()
    mask[1] = 1
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    x, outs = ids, []
    for stage in stages:
        x, _ = stage.forward(x, mask, pos, None)
        outs.append(x)
    with torch.inference_mode(), boundary_activations(full, plans) as captured:
        want = full(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    assert torch.equal(stages[-1].logits(x[:, -1]), want[:, -1])
    for out, got in zip(outs, captured, strict=True):
        assert torch.equal(out, got[0])


def test_a_member_holds_only_its_layers() -> None:
    model = load_model("tiny")
    layer = [sum(p.numel() for p in block.parameters()) for block in model.model.layers]
    embed, norm = model.model.embed_tokens.weight.numel(), model.model.norm.weight.numel()
    stages = [load_stage("tiny", p) for p in plan_stages("tiny", 3)]  # layers 2 + 1 + 1
    # stage 0: its layers and the embedding; stage 1: one layer; stage 2: one layer, norm, tied head
    assert [s.parameters for s in stages] == [layer[0] + layer[1] + embed, layer[2], layer[3] + norm + embed]
    assert len(stages[1].model.model.layers) == 1
    assert stages[1].model.model.embed_tokens.weight.numel() == 0  # the middle stage has no embedding
    with pytest.raises(StageError, match="only the last stage"):
        stages[0].logits(torch.zeros(1, 128, dtype=torch.bfloat16))
