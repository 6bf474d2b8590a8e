"""The trainer's filter of FSDP2's warning that a T5 block returns a view tensor silences that warning and no other
(that the warning is harmless, the gradients under FSDP2 equal to the unsharded model's on 2 gloo ranks:
tests/distributed/test_fsdp_t5_views_distributed.py)."""

from __future__ import annotations

import warnings

import pytest

from hf_flexdemo.trainer.trainer import ignore_t5_view_warning

FSDP_STATE = "torch.distributed.fsdp._fully_shard._fsdp_state"  # where FSDP2 raises it (stacklevel 2: its caller)
TAIL = " returned a view tensor. An in-place op on this view (e.g., `x += y`) will silently drop the pre-backward hook"


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
