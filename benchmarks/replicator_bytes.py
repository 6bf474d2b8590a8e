"""Inter-node bytes per rank per optimizer step of every replicator, against the number of nodes R.

Why: an all-gather of top-k payloads (``replicator="demo"``) sends ``(R - 1)`` times the payload, so its
saving over a dense all-reduce shrinks as nodes are added, while an all-reduce (``"random"``, ``"full"``,
AdamW-HSDP) stays under twice its buffer at any R. This script computes, from the exact shapes of the local
FSDP2 shards (no training, no communication), the bytes each rank puts on the inter-node link per step for
R = 2 ... 64 nodes, and the R at which the all-gather stops paying off against AdamW-HSDP reducing in bf16
(``FlexDeMoConfig(method="adamw", reduce_dtype="bfloat16")``) and in fp32 (FSDP2's default).

    python benchmarks/replicator_bytes.py       # T5-small shape, shard size 8, package defaults: ~5 s on 2 cores
    python benchmarks/replicator_bytes.py --local_steps 1 --out benchmarks/results/replicator_bytes_step_wise.json

Local steps: FlexDeMo exchanges once every ``--local_steps`` H steps (the package default), so its bytes per step
are a round's divided by H (amortised; AdamW-HSDP reduces every step), and ``value_dtype="auto"`` and
``--outer_fragments`` (default: the package's choice, 4 with the default local steps) resolve as the optimizer
resolves them (int2 for demo with local steps, float8 step-wise). With F fragments a round is F exchanges, one per
fragment (``hf_flexdemo.optim.local_steps.partition`` of the parameters' full sizes, as the optimizer splits them), each
counted by the formulas below over its own shards, flag included: a round sends F - 1 more flags than F = 1.

Model: the published T5-small shape (``hf_flexdemo.seq2seq.tiny_t5.named_t5_config("t5-small", T5_VOCAB_SIZE)``,
60.5 M parameters, tied embeddings counted once), built on the meta device. FSDP2 shards dim 0 of every
parameter over ``--shard_size`` processes per node with ``torch.chunk``; rank 0's shard is the largest
(``ceil(dim0 / shard_size)`` rows, the padded size FSDP2 communicates). Compression: the package defaults
(``hf_flexdemo.optim.optimizer.DEFAULT_RATE``, ``DEFAULT_CHUNK``) unless ``--rate``/``--chunk`` are given.

Formulas (ring algorithms, counted as ``hf_flexdemo/wire/collectives.py`` counts them; per rank, per step; the
sums run over the rank's non-empty local shards; ``//`` is integer division as in
``hf_flexdemo.wire.collectives.dense_allreduce_bytes``):

* ``demo`` -- one all-gather of the packed payload::

      payload = sum_params blocks * (position_bytes + k * value_bytes + scale_bytes) + 1   # + 1 flag byte
      bytes   = (R - 1) * payload

  ``blocks``/``block_numel`` from ``BlockLayout.for_shape(local_shape, chunk)``,
  ``k = compression.kept_per_block(block_numel, rate, None)``,
  ``position_bytes = min(ceil(block_numel / 8), ceil(k * index_bits / 8))`` (a bitmask of the block when smaller
  than the packed indices; ``index_bits = ceil(log2(block_numel))``: 10 in 32 x 32, 12 in 64 x 64),
  ``value_bytes`` = 1/4 with int2 (the default ``value_dtype="auto"`` with local steps), 1/2 with int4, 1 with
  float8 (auto step-wise), each with a 2-byte ``scale_bytes`` per block; 2 with ``"bfloat16"``, 4 with
  ``"float32"``: ``compression.block_payload_bytes``; per step, these bytes divided by H.
* ``random`` -- one all-reduce of the values only (positions come from a shared seed), plus the flag as
  one more value::

      values = sum_params blocks * k
      bytes  = 2 * (R - 1) * (values + 1) * value_bytes // R         # bf16 for auto and float8
* ``full`` -- one all-reduce of the fp32 momentum, plus the flag::

      bytes = 2 * (R - 1) * (numel + 1) * 4 // R
* ``adamw`` (AdamW-HSDP) -- FSDP2's dense fp32 gradient all-reduce of the shard::

      bytes = 2 * (R - 1) * numel * 4 // R

  and with ``reduce_dtype="bfloat16"`` (``adamw_bf16``, recorded next to the table's columns)::

      bytes = 2 * (R - 1) * numel * 2 // R

Writes ``benchmarks/results/replicator_bytes.json`` (command, machine, versions, settings, the local shard
shapes, per-R bytes, ratios, crossovers and the Markdown table) and prints the table.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import harness
import torch

from hf_flexdemo import knobs
from hf_flexdemo.knobs import DEFAULT_CHUNK, DEFAULT_RATE
from hf_flexdemo.optim.local_steps import partition
from hf_flexdemo.seq2seq.tiny_t5 import T5_CONFIG_NAMES, T5_VOCAB_SIZE, named_t5_config
from hf_flexdemo.wire import compression
from hf_flexdemo.wire.collectives import dense_allreduce_bytes
from hf_flexdemo.wire.compression import VALUE_DTYPES
from hf_flexdemo.wire.dct import BlockLayout
from hf_flexdemo.wire.replicators import exchange_bytes

HERE = Path(__file__).resolve().parent
REPLICATORS = ("demo", "random", "full", "adamw")
DESCRIPTIONS = {
    "demo": "FlexDeMo demo: all-gather of (index, value) top-k payloads",
    "random": "FlexDeMo random: all-reduce of the values at shared random positions",
    "full": "FlexDeMo full: all-reduce of the fp32 momentum",
    "adamw": "AdamW-HSDP: dense fp32 gradient all-reduce",
    "adamw_bf16": "AdamW-HSDP with reduce_dtype='bfloat16': dense bf16 gradient all-reduce",
}
DEFAULT_NODES = (2, 4, 8, 16, 32, 64)


def kept_coefficients(local_shapes: Sequence[tuple[int, ...]], rate: float, chunk: int) -> list[tuple[int, int, int]]:
    """``(blocks, k, block_numel)`` of every non-empty local shard."""
    kept = []
    for shape in local_shapes:
        if not torch.Size(shape).numel():
            continue  # an empty shard sends nothing (the optimizer skips it)
        layout = BlockLayout.for_shape(tuple(shape), chunk)
        kept.append((layout.num_blocks, compression.kept_per_block(layout.block_numel, rate, None),
                     layout.block_numel))
    return kept


def bytes_per_rank(replicator: str, local_shapes: list[tuple[int, ...]], replicas: int, rate: float, chunk: int,
                   value_dtype: str = "bfloat16") -> int:
    """Bytes one rank sends across nodes in one optimizer step (the formulas of the module docstring).

    FlexDeMo's replicators are counted by ``hf_flexdemo.wire.replicators.exchange_bytes``, the function the optimizer's
    counters are tested against; ``"adamw"`` is AdamW-HSDP's dense fp32 all-reduce of the same shards.
    """
    if replicator != "adamw":
        return exchange_bytes(replicator, local_shapes, replicas, rate=rate, topk=None, chunk=chunk,
                              value_dtype=value_dtype)
    return dense_allreduce_bytes(sum(torch.Size(shape).numel() for shape in local_shapes), replicas, 4)


def local_shard_shapes(config_name: str, shard_size: int) -> tuple[list[tuple[str, tuple[int, ...], int]], int]:
    """Rank 0's FSDP2 shard shape and the full size of every parameter of the named T5 (tied weights once), and
    the model's size."""
    from transformers import T5ForConditionalGeneration

    with torch.device("meta"):
        model = T5ForConditionalGeneration(named_t5_config(config_name, T5_VOCAB_SIZE))
    shapes = []
    for name, parameter in model.named_parameters():  # named_parameters yields a tied weight once
        if parameter.dim() == 0 or shard_size == 1:
            shapes.append((name, tuple(parameter.shape), parameter.numel()))
        else:
            shapes.append((name, tuple(parameter.chunk(shard_size, dim=0)[0].shape), parameter.numel()))
    return shapes, sum(p.numel() for p in model.parameters())


def first_at_least(nodes: Sequence[int], left: dict[int, int], right: dict[int, int]) -> int | None:
    """The smallest R of ``nodes`` with ``left[R] >= right[R]`` (None if there is none)."""
    return next((r for r in nodes if left[r] >= right[r]), None)


def markdown(rows: list[dict[str, Any]]) -> str:
    header = ["R (nodes)", "demo (all-gather)", "random (all-reduce values)", "full (fp32 momentum)",
              "AdamW-HSDP (dense fp32)", "AdamW-HSDP (dense bf16)", "bf16 / demo", "fp32 / demo", "bf16 / random",
              "demo / random"]
    ratios = ("dense_bf16_over_demo", "dense_over_demo", "dense_bf16_over_random", "demo_over_random")
    return harness.markdown_table(header, [
        [row["replicas"], *(f"{row['bytes'][m]:,.0f}" for m in (*REPLICATORS, "adamw_bf16")),
         *(f"{row[k]:.2f}" for k in ratios)] for row in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config_name", default="t5-small", choices=T5_CONFIG_NAMES,
                        help="a published T5 shape (hf_flexdemo.seq2seq.tiny_t5), vocab T5_VOCAB_SIZE")
    parser.add_argument("--shard_size", type=int, default=8, help="processes per node (FSDP2 group size)")
    parser.add_argument("--nodes", type=int, nargs="+", default=list(DEFAULT_NODES), help="values of R")
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE, help="compression_rate (package default)")
    parser.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help="compression_chunk (package default)")
    parser.add_argument("--value_dtype", default="auto", choices=("auto", *VALUE_DTYPES),
                        help="wire type of the values (auto, the package default: for demo int2 with local steps, "
                             "float8 step-wise; bfloat16 for random, whose all-reduce adds values)")
    parser.add_argument("--local_steps", type=int, default=knobs.resolve_local_steps(None),
                        help="H: FlexDeMo exchanges every H steps (default: the package's choice for a "
                             "run of unknown or long length); 1: the step-wise mode")
    parser.add_argument("--outer_fragments", type=int, default=knobs.DEFAULTS["outer_fragments"],
                        help="fragments of a round (default: the package's choice for --local_steps)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "replicator_bytes.json")
    harness.add_provenance_flags(parser)
    args = parser.parse_args()
    if args.shard_size < 1 or min(args.nodes) < 1 or not 0 < args.rate <= 1 or args.chunk < 1 or args.local_steps < 1:
        parser.error("--shard_size, --nodes, --chunk and --local_steps must be >= 1 and --rate in (0, 1]")
    knobs.validate({"local_steps": args.local_steps, "outer_fragments": args.outer_fragments, "overlap": "delayed",
                    "outer_delay": 1})  # the fragments of a streamed round
    bench = harness.Run.start(args.out, args.allow_dirty)
    named_shapes, parameters = local_shard_shapes(args.config_name, args.shard_size)
    shapes = [shape for _, shape, _ in named_shapes]
    nodes = sorted(set(args.nodes))
    steps = args.local_steps
    fragments = knobs.resolve_outer_fragments(args.outer_fragments, steps, "delayed", 1)
    where = partition([numel for _, _, numel in named_shapes], fragments)
    rounds = [[shape for shape, f in zip(shapes, where) if f == fragment] for fragment in range(fragments)]
    demo_dtype = knobs.resolve_value_dtype(args.value_dtype, "demo", steps)
    random_dtype = knobs.resolve_value_dtype(  # an all-reduce adds values: scaled types cannot travel
        "auto" if args.value_dtype in knobs.SCALED_VALUE_DTYPES else args.value_dtype, "random", steps)

    def per_step(m: str, r: int) -> float:
        """FlexDeMo's round (one exchange per fragment) once in H steps, amortised; AdamW-HSDP's every step."""
        if m == "adamw":
            return bytes_per_rank(m, shapes, r, args.rate, args.chunk)
        value_dtype = random_dtype if m == "random" else demo_dtype
        return sum(bytes_per_rank(m, part, r, args.rate, args.chunk, value_dtype) for part in rounds) / steps

    table = {r: {m: per_step(m, r) for m in REPLICATORS} for r in nodes}
    numel = sum(torch.Size(s).numel() for s in shapes)
    for r in nodes:  # AdamW-HSDP reducing in bf16 (reduce_dtype="bfloat16"): the same all-reduce, 2-byte elements
        table[r]["adamw_bf16"] = dense_allreduce_bytes(numel, r, 2)
    rows = [{
        "replicas": r,
        "bytes": table[r],
        "dense_bf16_over_demo": table[r]["adamw_bf16"] / table[r]["demo"] if table[r]["demo"] else None,
        "dense_bf16_over_random": table[r]["adamw_bf16"] / table[r]["random"] if table[r]["random"] else None,
        "dense_over_demo": table[r]["adamw"] / table[r]["demo"] if table[r]["demo"] else None,
        "dense_over_random": table[r]["adamw"] / table[r]["random"] if table[r]["random"] else None,
        "demo_over_random": table[r]["demo"] / table[r]["random"] if table[r]["random"] else None,
    } for r in nodes if r > 1]
    per_r = {m: {r: table[r][m] for r in nodes if r > 1} for m in (*REPLICATORS, "adamw_bf16")}
    grid = [r for r in nodes if r > 1]
    kept = kept_coefficients(shapes, args.rate, args.chunk)
    coefficients = sum(blocks * k for blocks, k, _ in kept)
    payload = sum(bytes_per_rank("demo", part, 2, args.rate, args.chunk, demo_dtype) for part in rounds)
    # demo = (R-1) P / H per step and dense = 8 n (R-1)/R in fp32 (4 n (R-1)/R in bf16), so demo >= dense exactly
    # when R >= 8 n H / P (R >= 4 n H / P).
    crossover_exact, bf16_crossover_exact = 8 * numel * steps / payload, 4 * numel * steps / payload
    dense_cross = first_at_least(grid, per_r["demo"], per_r["adamw"])
    bf16_cross = first_at_least(grid, per_r["demo"], per_r["adamw_bf16"])
    random_cross = first_at_least(grid, per_r["demo"], per_r["random"])
    text = markdown(rows)
    summary = (
        f"demo's all-gather sends (R-1) x {payload:,} B per rank every {steps} step(s), AdamW-HSDP's dense "
        f"all-reduce (R-1)/R x 4 x {numel:,} B every step in bf16 (reduce_dtype='bfloat16'), twice that in fp32: "
        f"demo >= dense bf16 for R >= 4 n H / payload = {bf16_crossover_exact:.2f} (on this grid from R = "
        f"{bf16_cross}), demo >= dense fp32 for R >= 8 n H / payload = {crossover_exact:.2f} (from R = "
        f"{dense_cross}); demo >= random for every R >= "
        f"{random_cross} on this grid (random's all-reduce stays "
        f"below 2 x {(coefficients + 1) * VALUE_DTYPES[random_dtype].itemsize:,} B at any R)."
    )
    report = bench.write(args.out, {
        "settings": {
            "config_name": args.config_name, "vocab_size": T5_VOCAB_SIZE, "shard_size": args.shard_size,
            "nodes": nodes, "compression_rate": args.rate, "compression_chunk": args.chunk,
            "value_dtype": args.value_dtype, "resolved_value_dtypes": {"demo": demo_dtype, "random": random_dtype},
            "local_steps": steps, "outer_fragments": fragments,
            "shard_of": "rank 0 (torch.chunk on dim 0, the largest shard)",
        },
        "formulas": {  # FlexDeMo's per exchange, summed over a round's outer_fragments; per step divided by local_steps
            "demo": "(R-1) * (sum_params blocks*(min(ceil(block_numel/8), k*index_bytes)+k*value_bytes+scale_bytes)+1)",
            "random": "2*(R-1)*(sum_params blocks*k + 1)*value_bytes // R",
            "full": "2*(R-1)*(numel+1)*4 // R",
            "adamw": "2*(R-1)*numel*4 // R",
            "adamw_bf16": "2*(R-1)*numel*2 // R",
        },
        "descriptions": DESCRIPTIONS,
        "model_parameters": parameters,
        "local_shard": {
            "numel": numel,
            "kept_coefficients": coefficients,
            "density": coefficients / numel,
            "demo_payload_bytes": payload,
            "bytes_per_kept_coefficient_demo": (payload - fragments) / coefficients,  # less each exchange's flag
            "shapes": {name: list(shape) for name, shape, _ in named_shapes},
        },
        "rows": rows,
        "crossover": {
            "demo_ge_dense_from_R": dense_cross,
            "demo_ge_dense_from_R_exact": crossover_exact,
            "demo_ge_dense_bf16_from_R": bf16_cross,
            "demo_ge_dense_bf16_from_R_exact": bf16_crossover_exact,
            "demo_ge_random_from_R": random_cross,
            "summary": summary,
        },
        "table": text,
    })
    print(f"{args.config_name} ({parameters:,} parameters), shard size {args.shard_size}: rank 0's shard holds "
          f"{numel:,} elements, {coefficients:,} kept coefficients (density {coefficients / numel:.4g}, "
          f"rate {args.rate:g}, chunk {args.chunk}). Bytes per rank per optimizer step (FlexDeMo: an exchange every "
          f"{steps} step(s), amortised):\n")
    print(text)
    print(f"\n{summary}")
    print(f"[replicator_bytes] wrote {args.out} in {report['duration_seconds']:.1f} s")


if __name__ == "__main__":
    main()
