"""Per-block top-k selection on CPU, side by side with AdamW's step on as many elements (issue #9's step time).

FlexDeMo's step chooses the ``k`` largest of every block's coefficients; on CPU that choice is the largest
single cost of the step (``benchmarks/optimizer_step.py``'s profile). This times, in one process and one
thread, the ways of choosing the top ``DEFAULT_RATE`` of each ``DEFAULT_CHUNK x DEFAULT_CHUNK`` block of a
T5-small-sized shard (bf16 coefficients, as they travel), against ``torch.optim.AdamW``'s step (for-loop, as on
CPU) over the same number of float32 elements:

* ``int_keys``: ``compression.select_topk``, the package's way (``topk`` over the bit patterns, sign cleared);
* ``bf16_abs``: ``topk`` over the bf16 magnitudes (the previous way); ``fp32_abs``: over float32 magnitudes;
* ``kthvalue``: only the k-th largest magnitude per block (a threshold, before any indices);
* ``sort``: a full sort of every block.

    python -m benchmarks.studies.selection    # ~1 minute, writes benchmarks/results/selection.json
    python -m benchmarks.studies.selection --fraction 0.01 --repeats 2 --out /tmp/selection.json   # smoke, seconds

A study (``benchmarks/studies/README.md``): its answer, the package's way, is in ``compression.select_topk``, and its
figures in docs/results.md ("Optimizer step"). It runs as a module of the repository (``python -m``, from the root),
which makes ``benchmarks.harness`` importable without a path setting.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import T5ForConditionalGeneration

from benchmarks import harness
from hf_flexdemo.knobs import DEFAULT_CHUNK, DEFAULT_RATE
from hf_flexdemo.seq2seq.tiny_t5 import T5_VOCAB_SIZE, named_t5_config
from hf_flexdemo.wire import compression
from hf_flexdemo.wire.dct import BlockLayout


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    fn()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fraction", type=float, default=1.0, help="of the T5-small shard's elements (smoke runs)")
    parser.add_argument("--out", type=Path, default=harness.RESULTS / "selection.json")
    harness.add_provenance_flags(parser)
    args = parser.parse_args()
    if not 0 < args.fraction <= 1 or args.repeats < 1:
        parser.error("--fraction must be in (0, 1] and --repeats >= 1")
    bench = harness.Run.start(args.out, args.allow_dirty)
    torch.set_num_threads(1)
    numel = sum(p.numel() for p in T5ForConditionalGeneration(named_t5_config("t5-small", T5_VOCAB_SIZE)).parameters())
    block = DEFAULT_CHUNK * DEFAULT_CHUNK
    rows = max(1, int(numel * args.fraction) // block)
    k = compression.kept_per_block(block, DEFAULT_RATE, None)
    generator = torch.Generator().manual_seed(0)
    coefficients = torch.randn(rows, DEFAULT_CHUNK, DEFAULT_CHUNK, generator=generator).bfloat16()
    layout = BlockLayout.for_shape((DEFAULT_CHUNK, DEFAULT_CHUNK), DEFAULT_CHUNK)
    magnitude = torch.empty_like(coefficients)
    flat = coefficients.view(rows, block)
    ways = {
        "int_keys": lambda: compression.select_topk(coefficients, layout, k, magnitude),
        "bf16_abs": lambda: flat.abs().topk(k, dim=1, sorted=False),
        "fp32_abs": lambda: flat.float().abs_().topk(k, dim=1, sorted=False),
        "kthvalue": lambda: flat.float().abs_().kthvalue(block - k + 1, dim=1),
        "sort": lambda: flat.abs().sort(dim=1),
    }
    param = torch.nn.Parameter(torch.randn(rows * block, generator=generator))
    param.grad = torch.randn(rows * block, generator=generator)
    adamw = torch.optim.AdamW([param])
    seconds = {"adamw_step": timed(adamw.step, args.repeats)}
    seconds |= {name: timed(fn, args.repeats) for name, fn in ways.items()}
    median = {name: statistics.median(s) for name, s in seconds.items()}
    bench.write(args.out, {
        "threads": 1,
        "fraction": args.fraction,
        "rows": rows, "block": [DEFAULT_CHUNK, DEFAULT_CHUNK], "kept_per_block": k, "adamw_numel": rows * block,
        "median_s": median,
        "ratio_to_adamw_step": {name: m / median["adamw_step"] for name, m in median.items()},
        "seconds": seconds,
    })
    for name, m in median.items():
        print(f"{name:>10}: {m:.3f} s  ({m / median['adamw_step']:.2f} x AdamW's step)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
