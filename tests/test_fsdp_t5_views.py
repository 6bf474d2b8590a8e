"""FSDP2's warning that a T5 block returns a view tensor is harmless: on 2 gloo ranks the gradients of the tiny T5
under FSDP2 equal the unsharded model's, and the trainer's filter silences that warning and no other."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from launch import run_worker

from hf_flexdemo.trainer.trainer import T5_VIEW_WARNING, ignore_t5_view_warning

FSDP_STATE = "torch.distributed.fsdp._fully_shard._fsdp_state"  # where FSDP2 raises it (stacklevel 2: its caller)
TAIL = " returned a view tensor. An in-place op on this view (e.g., `x += y`) will silently drop the pre-backward hook"


def _is_t5_view_warning(message: str) -> bool:
    return re.match(T5_VIEW_WARNING, message) is not None


@pytest.mark.multiprocess
def test_t5_gradients_under_fsdp2_equal_the_unsharded_models_despite_the_view_warning(tmp_path):
    ranks = run_worker("view_grad_worker", 2, tmp_path)
    for result in ranks:
        assert any(map(_is_t5_view_warning, result["unfiltered"]))  # the case the filter is for: it does arise
        assert not any(map(_is_t5_view_warning, result["filtered"]))
        assert result["grads"].keys() == result["expected"].keys()
        for name, grad in result["grads"].items():
            torch.testing.assert_close(grad, result["expected"][name], rtol=1e-5, atol=1e-6, msg=name)
        # the view is block 0's position bias: its embedding's gradient flows through it
        bias = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        assert result["grads"][bias].abs().sum() > 0
    torch.testing.assert_close(ranks[0]["grads"], ranks[1]["grads"], rtol=0, atol=0)


@pytest.mark.parametrize(("module_class", "source", "silenced"), [
    ("FSDPT5Block", FSDP_STATE, True),
    ("FSDPLlamaDecoderLayer", FSDP_STATE, False),  # not checked for other models: it stays
    ("FSDPT5Block", "my_training_script", False),  # the same words from elsewhere are not FSDP2's
])
def test_the_filter_silences_fsdp2s_view_warning_for_t5_blocks_only(module_class, source, silenced):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ignore_t5_view_warning()
        warnings.warn_explicit(f"FSDP2-wrapped module ({module_class}){TAIL}", UserWarning, "_fsdp_state.py", 331,
                               module=source)
    assert (not seen) == silenced
