"""Probe: does ``torch.compile`` (inductor, CPU) make the local-steps exchange's compute cheaper, per phase?

At the local-steps defaults of its run (56e2dc3: ``local_steps=4``, ``replicator="demo"``, the DCT, int2 values,
rate ``DEFAULT_RATE`` of ``DEFAULT_CHUNK``-sided blocks) a round's exchange costs about 1.9 s of CPU on T5-small
(``benchmarks/optimizer_step.py``'s profile: compress ~1.1 s, decode ~0.44 s); the step ratio target (<= 1.5x AdamW)
needs it under ~1.0 s. Inductor fuses elementwise chains on CPU as on GPU, so this measures what it saves on the
phases the optimizer runs on a stack of equal-shaped parameters, each phase written with the package's own functions
(:mod:`hf_flexdemo.compression`, :mod:`hf_flexdemo.quantize`, :mod:`hf_flexdemo.dct`) in the order
``BlockReplicator.select``/``encode``, ``DemoReplicator.decode`` and ``LocalSteps.pseudo_gradient`` call them:

* ``pseudo_gradient``: ``decay * delta - local + anchor`` (elementwise; the package subtracts the local shards row by
  row with ``_foreach_sub_``, here one stacked tensor);
* ``encode``: the momentum cast to bfloat16, the blockwise DCT (two GEMMs), the magnitude keys and ``topk``
  (``select_topk``), ``encode_positions`` (bitmask), ``gather``, ``nan_to_num_`` of the values and
  ``encode_values`` (int2 codes, a bfloat16 scale per block);
* ``encode_after_topk``: the same from the coefficients and ``topk``'s indices on (no GEMM, no ``topk``);
* ``select_topk``: the keys and ``topk`` alone;
* ``feedback``: error feedback, as ``BlockReplicator.encode`` runs it: ``decode_values`` of the own payload,
  ``scatter_mean`` into dense coefficients, the inverse DCT (two GEMMs), ``momentum -= estimate``;
* ``decode``: ``compression.decode`` of ``R`` replicas' payloads (the own row added by index, each other row's bitmask
  unpacked and ``masked_scatter_``-ed, ``consensus="replicas"``), then the inverse DCT (two GEMMs);
* ``decode_before_idct``: the same without the inverse DCT.

``encode_after_topk``, ``decode_before_idct`` and ``pseudo_gradient`` are the parts without GEMMs or ``topk`` (the
parts inductor can generate code for; it calls the same aten/oneDNN kernels for ``topk``, ``mm`` and ``bmm``).
A round's exchange is ``pseudo_gradient + encode + feedback + decode`` (the JSON's ``round``); the optimizer also
runs the small non-finite check between encode and feedback, left out here.

Each phase is timed eager and as ``torch.compile(fn, dynamic=False)`` (inductor; ``--modes`` adds e.g.
``max-autotune-no-cudagraphs``), on the same pre-allocated buffers the package would use (mutated inputs included),
in one process and one thread (``OMP_NUM_THREADS=1``). After ``--warmup`` calls of each, eager and compiled
repetitions alternate, so a load shared with other processes falls on both; the figure is the median of
``--repeats``. The first compiled call (Dynamo trace, inductor codegen, the C++ build, one run) is reported as
``first_call_s``, with a fresh inductor cache (``TORCHINDUCTOR_CACHE_DIR`` in a temporary folder) unless
``--warm_cache``. Before compiling, ``torch._dynamo.explain`` records graphs and graph breaks (with reasons); a
phase that fails to compile records its error instead. ``encode`` and ``decode`` are also compiled with
``compression.select_topk`` and ``compression.decode`` left eager (``torch.compiler.disable``, label suffix
``+eager_islands``): in torch 2.13 inductor fails on both as written (``ValueError: Cannot view a tensor ...``: an
``out=`` and an in-place ``masked_scatter_`` into the strided block view ``BlockLayout.blocks`` of a buffer), and the
table then shows that variant. Compiled outputs (returned tensors and mutated inputs) are compared with eager ones run
on identical copies of the inputs: ``torch.equal``, else the largest absolute difference (for int2 codes: of the
values they decode to).

Inputs: the parameter shapes of T5-small (``hf_flexdemo.tiny_t5.named_t5_config("t5-small", T5_VOCAB_SIZE)`` on the
meta device, tied weights once), grouped by shape; every group is one stack of all its parameters (the optimizer's
plan cuts them by bucket and fragment into several stacks: the same elements in more, smaller kernels). By default the
four largest groups (99.97 % of the elements; the ``(512,)`` norms and ``(32, 8)`` biases left out, stated in the
JSON). Random float32 data (seeded): ``delta``, ``local`` and ``anchor``, and for each other replica another
pseudo-gradient whose payload is the one it sends.

    python benchmarks/compile_probe.py          # writes benchmarks/results/compile_probe.json; minutes (C++ builds)
    python benchmarks/compile_probe.py --groups 1 --phases encode --repeats 2 --out /tmp/compile_probe.json  # smoke

Prints a Markdown table (phase, eager s, compiled s, ratio, bit-identical, note), each row summed over the groups:
one round's compute for the parameters measured. Most of the run time is inductor's C++ builds (about 5 compiled
variants per group).
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
import torch
from torch import Tensor

from hf_flexdemo import compression, knobs
from hf_flexdemo.dct import BlockLayout
from hf_flexdemo.knobs import DEFAULT_CHUNK, DEFAULT_RATE
from hf_flexdemo.tiny_t5 import T5_VOCAB_SIZE, named_t5_config

HERE = Path(__file__).resolve().parent
PHASES = ("pseudo_gradient", "encode", "encode_after_topk", "select_topk", "feedback", "decode", "decode_before_idct")
ROUND = ("pseudo_gradient", "encode", "feedback", "decode")  # a round's exchange, as the optimizer runs it
ISLAND_PHASES = ("encode", "decode")  # also compiled with select_topk / decode run eagerly (make_phases' islands)
ISLANDS = "+eager_islands"  # the label suffix of that variant
DECAY, FEEDBACK = knobs.DEFAULTS["compression_decay"], knobs.DEFAULTS["compression_feedback"]
Phase = Callable[..., Any]


@dataclass(frozen=True)
class Group:
    """Parameters of one shape, stacked: ``count`` rows of ``shape``."""

    shape: tuple[int, ...]
    count: int

    @property
    def numel(self) -> int:
        return self.count * math.prod(self.shape)


def t5_small_groups() -> tuple[list[Group], int]:
    """T5-small's parameters grouped by shape, the largest group (by elements) first, and the model's size."""
    from transformers import T5ForConditionalGeneration

    with torch.device("meta"):
        model = T5ForConditionalGeneration(named_t5_config("t5-small", T5_VOCAB_SIZE))
    counts = collections.Counter(tuple(p.shape) for p in model.parameters())  # a tied weight once
    groups = sorted((Group(shape, n) for shape, n in counts.items()), key=lambda g: -g.numel)
    return groups, sum(p.numel() for p in model.parameters())


# --- the phases: the package's calls, on the buffers the optimizer's workspace would hand them ---------------------


def make_phases(layout: BlockLayout, k: int, value_dtype: str, islands: bool = False) -> dict[str, Phase]:
    """The phase functions of one stack layout (see the module docstring); each returns the tensors it produces
    (``R``, the number of replicas, comes with the inputs' leading dimension).

    ``islands``: ``compression.select_topk`` and ``compression.decode`` run eagerly inside a compiled phase
    (``torch.compiler.disable``: a graph break before and after each), the calls inductor fails on in torch 2.13
    (an ``out=`` and an in-place ``masked_scatter_`` into the strided block view of a buffer)."""
    select = torch.compiler.disable(compression.select_topk) if islands else compression.select_topk
    scatter = torch.compiler.disable(compression.decode) if islands else compression.decode

    def pseudo_gradient(delta: Tensor, local: Tensor, anchor: Tensor, out: Tensor) -> Tensor:
        torch.mul(delta, DECAY, out=out)
        return out.sub_(local).add_(anchor)

    def encode_after_topk(coefficients: Tensor, indices: Tensor) -> list[Tensor]:
        wire, indices = compression.encode_positions(indices, layout.block_numel)  # the values' wire order
        positions, values = compression.gather(coefficients, layout, indices)
        torch.nan_to_num_(values, nan=0.0, posinf=0.0, neginf=0.0)
        return [wire, positions, *compression.encode_values(values, value_dtype)]

    def select_topk(coefficients: Tensor, scratch: Tensor) -> Tensor:
        return select(coefficients, layout, k, scratch)

    def encode(momentum: Tensor, source: Tensor, coefficients: Tensor, scratch: Tensor) -> list[Tensor]:
        source.copy_(momentum)
        coefficients = layout.dct(source, out=coefficients, scratch=scratch)
        indices = select(coefficients, layout, k, scratch)
        return encode_after_topk(coefficients, indices)

    def feedback(momentum: Tensor, positions: Tensor, codes: Tensor, scale: Tensor, shape: Tensor, dense: Tensor,
                 spatial: Tensor, dense_scratch: Tensor) -> Tensor:
        values = compression.decode_values([codes, scale, shape])
        sent = compression.scatter_mean(positions.unsqueeze(0), values.view(1, -1), out=dense, counts=None)
        estimate = layout.idct(sent, out=spatial, scratch=dense_scratch)
        return momentum.sub_(estimate, alpha=FEEDBACK)

    def decode_before_idct(where: Tensor, codes: Tensor, scale: Tensor, shape: Tensor, positions: Tensor,
                           dense: Tensor, replica: Tensor) -> Tensor:
        return scatter(where, [codes, scale, shape], layout, out=dense, scratch=replica, counts=None,
                       consensus="replicas", own=(0, positions))

    def decode(where: Tensor, codes: Tensor, scale: Tensor, shape: Tensor, positions: Tensor, dense: Tensor,
               replica: Tensor, spatial: Tensor, dense_scratch: Tensor) -> Tensor:
        dense = decode_before_idct(where, codes, scale, shape, positions, dense, replica)
        return layout.idct(dense, out=spatial, scratch=dense_scratch)

    return {"pseudo_gradient": pseudo_gradient, "encode": encode, "encode_after_topk": encode_after_topk,
            "select_topk": select_topk, "feedback": feedback, "decode": decode,
            "decode_before_idct": decode_before_idct}


def make_inputs(group: Group, layout: BlockLayout, k: int, value_dtype: str, replicas: int,
                seed: int) -> dict[str, tuple[Tensor, ...]]:
    """Each phase's arguments for ``group``'s stack, computed eagerly from seeded random float32 state."""
    generator = torch.Generator().manual_seed(seed)
    stacked = (group.count, *group.shape)
    dtype = compression.transform_dtype(value_dtype)

    def randn() -> Tensor:
        return torch.randn(stacked, generator=generator)

    delta, local, anchor = randn().mul_(0.01), randn(), randn()
    momentum = torch.empty(stacked)
    phases = make_phases(layout, k, value_dtype)
    phases["pseudo_gradient"](delta, local, anchor, momentum)
    bf16 = [torch.empty(stacked, dtype=dtype) for _ in range(3)]  # source, coefficients, scratch
    payloads = []
    for replica in range(replicas):  # the own payload, then each other replica's (another pseudo-gradient)
        state = momentum if replica == 0 else randn().mul_(momentum.std())
        coefficients = torch.empty(stacked, dtype=dtype)
        payloads.append(phases["encode"](state, bf16[0], coefficients, bf16[2]))
        if replica == 0:
            own_coefficients = coefficients
    wire, positions, codes, scale, shape = payloads[0]
    indices = compression.select_topk(own_coefficients, layout, k, bf16[2])
    received = [torch.stack([payload[i] for payload in payloads]) for i in (0, 2, 3, 4)]  # where, codes, scale, shape
    dense = [torch.empty(stacked) for _ in range(4)]  # dense, spatial / replica, dense_scratch
    return {
        "pseudo_gradient": (delta, local, anchor, torch.empty(stacked)),
        "encode": (momentum, *bf16),
        "encode_after_topk": (own_coefficients, indices),
        "select_topk": (own_coefficients, bf16[2]),
        "feedback": (momentum.clone(), positions, codes, scale, shape, dense[0], dense[1], dense[2]),
        "decode": (*received, positions, dense[0], dense[3], dense[1], dense[2]),
        "decode_before_idct": (*received, positions, dense[0], dense[3]),
    }


# --- measuring ---------------------------------------------------------------------------------------------------


def explain(fn: Phase, args: Sequence[Tensor]) -> dict[str, Any]:
    """``torch._dynamo.explain``'s graphs, graph breaks and their reasons (or the error it raised)."""
    try:
        found = torch._dynamo.explain(fn)(*clone(args))
    except Exception as err:  # noqa: BLE001 - recorded, not raised: the probe reports what fails
        return {"error": f"{type(err).__name__}: {err}"[:2000]}
    finally:
        torch._dynamo.reset()
    return {"graphs": found.graph_count, "graph_breaks": found.graph_break_count,
            "ops_per_graph": [len(ops) for ops in found.ops_per_graph],
            "break_reasons": [str(reason.reason)[:500] for reason in found.break_reasons]}


def error_line(text: str) -> str:
    """The line of an inductor error that says what failed (the one after ``raised:``), else its first line."""
    lines = text.splitlines()
    after = [lines[i + 1] for i, line in enumerate(lines[:-1]) if line.rstrip().endswith("raised:")]
    return (after or lines or [""])[0][:300]


def clone(args: Sequence[Tensor]) -> list[Tensor]:
    return [a.clone() for a in args]


def flatten(result: Any) -> list[Tensor]:
    if isinstance(result, Tensor):
        return [result]
    return [t for item in result for t in flatten(item)]


def compare(name: str, args: Sequence[Tensor], eager: Phase, compiled: Phase) -> dict[str, Any]:
    """Run both on identical copies of ``args``: are the returned tensors and the mutated inputs bit-identical?"""
    left, right = clone(args), clone(args)
    produced = flatten(eager(*left)) + left
    got = flatten(compiled(*right)) + right
    equal = [torch.equal(a, b) for a, b in zip(produced, got)]
    record: dict[str, Any] = {"bit_identical": all(equal) and len(produced) == len(got),
                              "tensors_compared": len(produced)}
    differing = []
    for i, (a, b, same) in enumerate(zip(produced, got, equal)):
        if same:
            continue
        entry: dict[str, Any] = {"index": i, "dtype": str(a.dtype), "shape": list(a.shape)}
        if a.shape != b.shape or a.dtype != b.dtype:
            entry["mismatch"] = f"{b.dtype} {list(b.shape)}"
        elif a.is_floating_point():
            entry["max_abs_diff"] = (a.float() - b.float()).abs().max().item()
            entry["max_abs"] = a.float().abs().max().item()
        else:
            entry["elements_differing"] = int((a != b).sum())
        differing.append(entry)
    if differing:
        record["differing"] = differing
    if name in ("encode", "encode_after_topk") and not record["bit_identical"]:  # the values the payloads decode to
        decoded = [compression.decode_values(out[2:5]) for out in (produced, got)]
        if decoded[0].shape == decoded[1].shape:
            record["decoded_values_max_abs_diff"] = (decoded[0] - decoded[1]).abs().max().item()
    return record


def timed(fn: Phase, args: Sequence[Tensor]) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def measure(name: str, fn: Phase, variants: dict[str, tuple[Phase, str | None]], args: Sequence[Tensor],
            warmup: int, repeats: int) -> dict[str, Any]:
    """Eager and compiled timings of one phase (``variants``: label -> the function to compile and its mode),
    the first compiled call's time, graph breaks and the bit-identity check."""
    record: dict[str, Any] = {label: {"mode": mode or "default", "explain": explain(source, args)}
                              for label, (source, mode) in variants.items()}  # explain resets Dynamo: first
    compiled: dict[str, Phase] = {}
    for label, (source, mode) in variants.items():
        entry = record[label]
        try:
            candidate = torch.compile(source, dynamic=False, mode=mode)
            entry["first_call_s"] = timed(candidate, clone(args))
            entry |= compare(name, args, fn, candidate)
            compiled[label] = candidate
        except Exception as err:  # noqa: BLE001 - recorded, not raised
            entry["error"] = f"{type(err).__name__}: {err}"[:2000]
            entry["traceback_tail"] = traceback.format_exc()[-1500:]
    runs = {"eager": fn, **compiled}
    seconds: dict[str, list[float]] = {label: [] for label in runs}
    for run in runs.values():
        for _ in range(warmup):
            run(*args)
    for _ in range(repeats):  # interleaved: a varying load falls on every variant alike
        for label, run in runs.items():
            seconds[label].append(timed(run, args))
    eager = statistics.median(seconds["eager"])
    record["eager"] = {"median_s": eager, "seconds": seconds["eager"]}
    for label in compiled:
        median = statistics.median(seconds[label])
        record[label] |= {"median_s": median, "seconds": seconds[label], "ratio_to_eager": median / eager}
    torch._dynamo.reset()
    return record


def chosen(record: dict[str, Any], mode: str) -> tuple[str, dict[str, Any]] | None:
    """The compiled variant a phase's figure is for: the package's code as it is, else with eager islands."""
    for label in (mode, f"{mode}{ISLANDS}"):
        if "median_s" in record.get(label, {}):
            return label, record[label]
    return None


def table(totals: dict[str, dict[str, Any]], modes: Sequence[str]) -> str:
    rows = []
    for phase, total in totals.items():
        for mode in modes:
            compiled = total[mode]
            label = phase if len(modes) == 1 else f"{phase} ({mode})"
            if compiled["median_s"] is None:
                rows.append([label, f"{total['eager_s']:.3f}", "failed", "-", "-", compiled["note"]])
                continue
            rows.append([label, f"{total['eager_s']:.3f}", f"{compiled['median_s']:.3f}",
                         f"{compiled['median_s'] / total['eager_s']:.2f}", "yes" if compiled["bit_identical"] else "no",
                         compiled["note"]])
    return harness.markdown_table(["phase", "eager s", "compiled s", "compiled / eager", "bit-identical", "note"],
                                  rows)


def summarize(per_group: list[dict[str, Any]], phases: Sequence[str], modes: Sequence[str]) -> dict[str, Any]:
    """Per phase (and for a round, when its phases were run), the medians summed over the groups: eager, and per
    mode the compiled code as it is or, where inductor failed on it, with eager islands (``note`` says which)."""
    totals: dict[str, dict[str, Any]] = {}
    for name in [*phases, *(["round"] if set(ROUND) <= set(phases) else [])]:
        members = ROUND if name == "round" else (name,)
        records = [(m, g["phases"][m]) for g in per_group for m in members]
        total: dict[str, Any] = {"eager_s": sum(r["eager"]["median_s"] for _, r in records)}
        for mode in modes:
            picks = [chosen(r, mode) for _, r in records]
            labels = sorted({f"{m} {pick[0]}" for (m, _), pick in zip(records, picks) if pick and pick[0] != mode})
            failed = sorted({f"{m}: {error_line(r[mode]['error'])}" for m, r in records if "error" in r.get(mode, {})})
            ok = all(pick is not None for pick in picks)
            total[mode] = {
                "median_s": sum(pick[1]["median_s"] for pick in picks) if ok else None,
                "first_call_s": sum(pick[1]["first_call_s"] for pick in picks if pick is not None),
                "bit_identical": all(pick[1]["bit_identical"] for pick in picks) if ok else None,
                "graph_breaks": sum(pick[1]["explain"].get("graph_breaks", 0) for pick in picks if pick is not None),
                "errors_as_is": failed,
                "note": ("inductor fails as is" + (": figure " + ", ".join(labels) if labels else "")) if failed
                else "as is",
            }
        totals[name] = total
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=4,
                        help="the N largest shape groups of T5-small (4: 99.97 %% of its elements; 6: all)")
    parser.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    parser.add_argument("--modes", nargs="+", default=["default"],
                        help="torch.compile modes ('default' is mode=None; e.g. max-autotune-no-cudagraphs)")
    parser.add_argument("--replicas", type=int, default=2, help="R, the payloads decode adds (optimizer_step: 2)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls of each variant first")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warm_cache", action="store_true",
                        help="use inductor's usual on-disk cache (compile times then depend on earlier runs)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "compile_probe.json")
    harness.add_provenance_flags(parser)
    args = parser.parse_args()
    if min(args.groups, args.replicas, args.repeats, args.warmup) < 1:
        parser.error("--groups, --replicas, --repeats and --warmup must be >= 1")
    bench = harness.Run.start(args.out, args.allow_dirty)
    torch.set_num_threads(1)
    cache = None
    if not args.warm_cache:
        cache = tempfile.TemporaryDirectory(prefix="compile_probe_inductor_")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache.name
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)

    value_dtype = knobs.resolve_value_dtype("auto", "demo", knobs.DEFAULTS["local_steps"])  # int2
    groups, parameters = t5_small_groups()
    selected = groups[: args.groups]
    per_group = []
    for group in selected:
        layout = BlockLayout.for_shape(group.shape, DEFAULT_CHUNK)
        k = compression.kept_per_block(layout.block_numel, DEFAULT_RATE, None)
        inputs = make_inputs(group, layout, k, value_dtype, args.replicas, args.seed)
        phases, islands = make_phases(layout, k, value_dtype), make_phases(layout, k, value_dtype, islands=True)
        results = {}
        for name in args.phases:
            modes = {mode: None if mode == "default" else mode for mode in args.modes}
            variants = {label: (phases[name], mode) for label, mode in modes.items()}
            if name in ISLAND_PHASES:
                variants |= {label + ISLANDS: (islands[name], mode) for label, mode in modes.items()}
            results[name] = record = measure(name, phases[name], variants, inputs[name], args.warmup, args.repeats)
            for label in variants:
                entry = record[label]
                outcome = (f"{entry['median_s']:.3f} s (x{entry['ratio_to_eager']:.2f}), first call "
                           f"{entry['first_call_s']:.1f} s, bit-identical {entry['bit_identical']}, graph breaks "
                           f"{entry['explain'].get('graph_breaks')}" if "median_s" in entry
                           else "failed: " + error_line(entry["error"]))
                print(f"[compile_probe] {group.count} x {group.shape} {name}: eager {record['eager']['median_s']:.3f} "
                      f"s; {label}: {outcome}", flush=True)
        per_group.append({"shape": list(group.shape), "count": group.count, "numel": group.numel,
                          "block": list(layout.block), "kept_per_block": k, "phases": results})
        del inputs

    totals = summarize(per_group, args.phases, args.modes)
    text = table(totals, args.modes)
    numel = sum(g.numel for g in selected)
    report = bench.write(args.out, {
        "threads": torch.get_num_threads(),
        "settings": {
            "model": "t5-small", "vocab_size": T5_VOCAB_SIZE, "compression_rate": DEFAULT_RATE,
            "compression_chunk": DEFAULT_CHUNK, "value_dtype": value_dtype, "consensus": "replicas",
            "replicas": args.replicas, "compression_decay": DECAY, "compression_feedback": FEEDBACK,
            "modes": args.modes, "dynamic": False, "warmup": args.warmup, "repeats": args.repeats, "seed": args.seed,
            "fresh_inductor_cache": not args.warm_cache,
        },
        "inputs": {
            "groups": [{"shape": list(g.shape), "count": g.count, "numel": g.numel} for g in selected],
            "left_out": [{"shape": list(g.shape), "count": g.count, "numel": g.numel} for g in groups[args.groups:]],
            "numel": numel, "model_parameters": parameters, "fraction_of_model": numel / parameters,
            "stacking": "one stack per shape group (the optimizer's plan splits groups by bucket and fragment)",
        },
        "phases_in_round": list(ROUND),
        "totals": totals,
        "per_group": per_group,
        "table": text,
    })
    print(f"\nT5-small, {len(selected)} shape groups ({numel:,} of {parameters:,} elements), one thread; medians of "
          f"{args.repeats}, summed over the groups (one round's exchange: {' + '.join(ROUND)}):\n")
    print(text)
    print(f"\n[compile_probe] wrote {args.out} in {report['duration_seconds']:.1f} s")
    if cache is not None:
        cache.cleanup()


if __name__ == "__main__":
    main()
