"""Sweeps of FlexDeMo's knobs on the convergence benchmark: the measurements the package defaults come from.

Each grid is a list of runs (method, learning rate, FlexDeMoConfig fields) on one convergence preset
(``convergence.py``'s data, model, topology and worker). Results accumulate in
``benchmarks/results/sweep_<grid>.json`` after every run, so an interrupted sweep resumes where it
stopped (``--rerun`` starts over); the JSON also holds a Markdown table and the Pareto front, and a
plot of final validation loss against inter-node bytes per step goes next to it, AdamW as the line. The top-level
header (command, started_at, git_commit, ...) is the latest invocation's; ``invocations`` holds every invocation's
header, and each run its invocation's index (``invocation``), so a run names the commit that produced it.

    python benchmarks/sweep.py density    # rate x block x lr x replicator, 300 steps: ~3 min per run on 2 cores
    python benchmarks/sweep.py levers     # what closes the gap over 1,000 steps: ~10 min per run
    python benchmarks/sweep.py overlap    # when the exchange runs (none / backward / delayed), 300 steps
    python benchmarks/sweep.py local      # H x rate x value bits x outer rule (x DCT, streaming), 300 steps (86 runs)
    python benchmarks/sweep.py local_long # local steps' candidates and AdamW at 1,000 steps, two seeds (10 runs)
    python benchmarks/sweep.py nodes      # the defaults and AdamW-HSDP at R = 2, 4, 8 nodes, 2,000 steps
    python benchmarks/sweep.py nodes_weak # ... with the batch per node fixed (weak scaling) at R = 8, 4
    python benchmarks/sweep.py nodes_weak_long  # ... at 8 weak nodes over 1,000 steps, where AdamW-HSDP is not flat
    python benchmarks/sweep.py nodes_weak_step_wise  # the dense step-wise rule at 8 and 4 weak nodes: where the gap is
    python benchmarks/sweep.py nodes_strong_step_wise  # ... at 8 nodes under strong scaling
    python benchmarks/sweep.py nodes_leader  # replicator="leader" at R = 8, 4, 2 nodes, 2,000 steps
    python benchmarks/sweep.py nodes_owner  # replicator="owner" at R = 8, 4 and 2 nodes, 2,000 steps
    python benchmarks/sweep.py bits       # the defaults and half their bits or less at 2 nodes, 2,000 steps
    python benchmarks/sweep.py rounds_by_length  # rounds of 4 and 8 at 1,000 steps, two seeds
    python benchmarks/sweep.py sizes      # the frontier on the quick model and the d256 4 + 4 T5, 300 steps
    python benchmarks/sweep.py sizes_long # the d256 4 + 4 T5 over 2,000 steps: AdamW-HSDP, rounds of 16 and of 8
    python benchmarks/sweep.py lr_horizon # the quick model: rounds of 16, AdamW-HSDP and the defaults around 3e-3
    python benchmarks/sweep.py levers --only "flexdemo lr=0.003 compression_feedback=0.2 momentum=ema"
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import convergence
import harness

HERE = Path(__file__).resolve().parent
QUICK = ["--quick", "--bleu_samples", "0"]
LONG = [*QUICK, "--max_steps", "1000", "--eval_steps", "100", "--warmup_steps", "50", "--timeout_s", "2400"]
OLD_DEFAULT = {"compression_topk": 4, "compression_chunk": 64}  # the first release: 4 of 64 x 64 = 1/1024
V2 = {"momentum": "ema", "compression_feedback": 0.2, "update": "sign"}  # DeMo's second version (arXiv 2411.19870v2)
RULE = {"update": "rmsprop"}
# grid "local": the outer rules, SparseLoCo's (the mean, error feedback as the momentum) and DiLoCo's Nesterov
OUTER = ({}, {"outer_lr": 0.7, "outer_momentum": 0.9})  # the update rule the long runs picked (grid "levers")
HORIZON = ["--horizon", "--bleu_samples", "0"]
# convergence.py flags (TrainingArguments fields, the topology and the model's size), not FlexDeMoConfig fields
MODEL_FLAGS = ("d_model", "d_ff", "num_layers")
RUN_FLAGS = ("adam_beta1", "seed", "nodes", "procs_per_node", "scaling", "gradient_accumulation_steps",
             *MODEL_FLAGS)
# What a gap is measured against: AdamW-HSDP from the same initialisation, on the same topology, global batch and model.
REFERENCE_FLAGS = ("seed", "nodes", "procs_per_node", "scaling", *MODEL_FLAGS)
# The second model size: the T5 of convergence.py's full preset (4 + 4 layers, d256) on the quick preset's
# tokenizer and batch, so that the model's size is all that differs from the quick model.
D256 = {flag: convergence.PRESETS["full"][flag] for flag in MODEL_FLAGS}
# R nodes as convergence.py runs them: 2 x 2 (the reference topology), and 8 processes as 4 x 2 and 8 x 1.
NODE_TOPOLOGIES = ({}, {"nodes": 4, "procs_per_node": 2}, {"nodes": 8, "procs_per_node": 1})


def _run(method: str, lr: float, **knobs: Any) -> dict[str, Any]:
    return {"method": method, "lr": lr, "knobs": knobs}


def pinned_knobs(grid: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """What a run of ``grid`` sets: its pin, the pin for its number of nodes, then its own knobs (AdamW: its own)."""
    if run["method"] == "adamw":
        return run["knobs"]
    by_nodes = grid.get("pin_by_nodes", {}).get(run["knobs"].get("nodes", 2), {})
    knobs = {**grid.get("pin", {}), **by_nodes, **run["knobs"]}
    if knobs.get("replicator") == "full" and "value_dtype" not in run["knobs"]:  # it sends float32, whatever a pin said
        knobs.pop("value_dtype", None)
    return knobs


def _dense_step_wise(scaling: str, nodes: tuple[int, ...] = (8,)) -> dict[str, Any]:
    """The step-wise rule without compression on 8 processes: every step, the dense float32 mean of the nodes' AdamW
    steps, each normalised by its own node's moments. It differs from AdamW-HSDP at the same lr (grids "nodes_weak"
    and "nodes") only there: no rounds, no compression."""
    return {"argv": HORIZON, "pin": {"momentum": "adam", "update": "sgd"},
            "runs": [_run("flexdemo", 3e-3, nodes=r, procs_per_node=8 // r, scaling=scaling, local_steps=1,
                          replicator="full", value_dtype="float32") for r in nodes]}


def _local(steps: int, *, rate: float = 1 / 4, value_dtype: str = "int2", **knobs: Any) -> dict[str, Any]:
    """A local-steps run at AdamW's lr on 32 x 32 blocks (grids "local" and "local_long")."""
    return _run("flexdemo", 3e-3, local_steps=steps, compression_rate=rate, compression_chunk=32,
                value_dtype=value_dtype, **knobs)


# A grid's "pin": knob values its runs take unless they set them, left out of the run keys: the package defaults
# when the grid's runs were chosen, so that a rerun measures what the committed JSON's run keys meant
# (tests/unit/test_sweep_pins.py rebuilds every committed run's FlexDeMoConfig from its key and the pin). The grids
# "density" and "levers" chose the step-wise rule under the first defaults (DeMo's momentum and consensus, 1/8 of
# 8 x 8 blocks, bfloat16 values); "overlap" ran step-wise at the rule they chose; the local-steps grids waited
# for each exchange unless a run said overlap="delayed" (the default "auto" streams now), streamed the whole
# model in one round unless a run said outer_fragments (the default streams 4 fragments now), and selected from the
# DCT unless a run said compression_transform (the default "auto" selects the values with local steps now). The
# node grids ran at outer_lr=1 unless a run said otherwise (the default now follows the nodes: sqrt(R / 2)). The
# grids of the 2,000-step horizon and "outer_delay" streamed each fragment's exchange to land one step after it
# started unless a run said outer_delay (the default now travels until the next fragment's starts: 2 at H = 8).
MEAN_OUTER = {"outer_lr": 1.0}
# A grid's "pin_by_nodes": its pin for the runs on that many nodes. Runs with replicator="full" or "owner" that left
# outer_lr to the package ran sqrt(R / 2), the rule for every replicator until those two took 1: 2 at 8 nodes.
ALL_GATHER_OUTER_AT_8 = {8: {"outer_lr": 2.0}}
LANDING_NEXT = {"outer_delay": 1}
# Grid "outer_delay" (300 steps) ran the default rounds of 8 before local_steps=None followed the run's length (rounds
# of 4 under 1,000 steps now).
ROUNDS_OF_8 = {"local_steps": 8}
STEP_WISE = {"local_steps": 1}
FIRST_DEFAULTS = {**STEP_WISE, "momentum": "lr", "consensus": "choosers", "value_dtype": "bfloat16",
                  "compression_chunk": 8}
WAITING = {"overlap": "none", "outer_fragments": 1, "compression_transform": "dct"}

GRIDS: dict[str, dict[str, Any]] = {
    "density": {
        "argv": QUICK,
        "pin": FIRST_DEFAULTS,
        "runs": [
            _run("adamw", 3e-3),
            *(_run("flexdemo", 3e-3, compression_rate=rate, compression_chunk=8, **RULE)
              for rate in (1 / 8, 1 / 16, 1 / 4, 1 / 32)),
            _run("flexdemo", 1e-2, **OLD_DEFAULT, update="sign"),
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=8, replicator="random", **RULE),
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=8, update="sign"),
            _run("flexdemo", 3e-3, compression_rate=1 / 16, compression_chunk=64, **RULE),
            *(_run("flexdemo", lr, compression_rate=1 / 8, compression_chunk=8, **RULE) for lr in (1e-3, 1e-2)),
            _run("flexdemo", 3e-3, compression_rate=1 / 16, compression_chunk=8, replicator="random", **RULE),
            # the long runs' best rule (grid "levers": momentum="ema", lr 2e-3) at 300 steps
            _run("flexdemo", 2e-3, compression_rate=1 / 8, compression_chunk=8, momentum="ema", **RULE),
            # the long runs' mean over all replicas (grid "levers") at 300 steps: the AdamW-direction path at 1/8
            # and 1/4 of 8 x 8 and 1/8 of larger blocks, the default rule
            *(_run("flexdemo", 3e-3, compression_rate=rate, compression_chunk=chunk, consensus="replicas",
                   momentum="adam", update="sgd")
              for rate, chunk in ((1 / 8, 8), (1 / 4, 8), (1 / 8, 16), (1 / 8, 32))),
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=8, consensus="replicas", **RULE),
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=32, **RULE),  # larger blocks, default rule
            # rate 1/4 in about the default's bytes: bitmask positions and float8 values (grid "levers")
            *(_run("flexdemo", 3e-3, compression_rate=rate, compression_chunk=chunk, consensus="replicas",
                   momentum="adam", update="sgd", value_dtype="float8")
              for rate, chunk in ((1 / 4, 8), (1 / 4, 32), (5 / 16, 32))),
        ],
    },
    "levers": {
        "pin": FIRST_DEFAULTS,
        "argv": LONG,
        "runs": [
            _run("adamw", 3e-3),
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=8, **V2),
            # update="adamw" with beta1 = 0 is update="rmsprop"'s arithmetic (which runs it in fewer passes)
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=8, update="adamw", adam_beta1=0.0),
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=8, update="adamw"),
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=8, update="sign"),  # DeMo's rule at 1/8
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=8, momentum="ema", update="sign"),
            # probe: the same rule without compression (the momentum averaged densely and spent every step)
            _run("flexdemo", 3e-3, replicator="full", **RULE),
            # probes: the learning rate of the rule without a first moment; a denser payload over the long run
            _run("flexdemo", 1e-3, compression_rate=1 / 8, compression_chunk=8, **RULE),
            _run("flexdemo", 6e-3, compression_rate=1 / 8, compression_chunk=8, **RULE),
            _run("flexdemo", 3e-3, compression_rate=1 / 4, compression_chunk=8, **RULE),
            # probes: a first moment without stale residuals rescaled by a decayed lr (momentum="ema"), on the
            # consensus (AdamW on Q) or in the momentum (error feedback alpha < 1 keeps what was sent)
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=8, momentum="ema", update="adamw"),
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=8, momentum="ema", **RULE),
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=8, momentum="ema",
                 compression_feedback=0.1, **RULE),
            # probe: AdamW's own direction m / (sqrt(v) + eps) of each replica's gradient is what the error-feedback
            # momentum accumulates and the payload carries; the step applies the consensus as it is
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=8, momentum="adam", update="sgd"),
            # ... fast early, then a plateau: a smaller step for the delayed (error-feedback) update
            _run("flexdemo", 1.5e-3, compression_rate=1 / 8, compression_chunk=8, momentum="adam", update="sgd"),
            _run("flexdemo", 4e-3, compression_rate=1 / 8, compression_chunk=8, momentum="ema", **RULE),
            # probe: AdamW's first moment before the error feedback, its second moment after the consensus
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=8, momentum="avg", **RULE),
            _run("flexdemo", 2e-3, compression_rate=1 / 8, compression_chunk=8, momentum="ema", **RULE),
            _run("flexdemo", 3e-3, replicator="full", momentum="avg", **RULE),  # ... and without compression
            _run("flexdemo", 3e-3, replicator="full", update="adamw"),  # AdamW on FlexDeMo's path: AdamW-HSDP
            _run("flexdemo", 1.5e-3, compression_rate=1 / 8, compression_chunk=8, momentum="ema", **RULE),
            # how much of a difference is the seed's: AdamW and the defaults again from another initialisation
            _run("adamw", 3e-3, seed=7),
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=8, seed=7, **RULE),
            # probes: is AdamW-on-Q's loss a step-size one (Q's v counts the bursts error feedback sends in), and is
            # momentum="adam"'s a compression one (without it, the replicas' mean AdamW direction)?
            _run("flexdemo", 6e-3, compression_rate=1 / 8, compression_chunk=8, update="adamw"),
            _run("flexdemo", 3e-3, replicator="full", momentum="adam", update="sgd"),
            _run("flexdemo", 2e-3, compression_rate=1 / 8, compression_chunk=8, momentum="adam", update="sgd"),
            # ... and is it the bursts (a coefficient waits ~1/rate steps, then carries them all)? Twice the rate,
            # with positions (2x the bytes) or from the shared seed (values only: the default's bytes)
            *(_run("flexdemo", 2e-3, compression_rate=1 / 4, compression_chunk=8, momentum="adam", update="sgd",
                   replicator=replicator) for replicator in ("demo", "random")),
            # DeMo's decode takes a coefficient's mean over the replicas that chose it: one replica's coefficient
            # enters Q whole, and the others send theirs later (error feedback), so Q over-counts what the replicas
            # disagree on. The mean over all replicas is the replicas' mean momentum, spread over time.
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=8, consensus="replicas", **RULE),
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=8, consensus="replicas", momentum="adam",
                 update="sgd"),
            # ... what that path needs: a denser payload (2x the bytes), or larger blocks at the same rate
            _run("flexdemo", 3e-3, compression_rate=1 / 4, compression_chunk=8, consensus="replicas", momentum="adam",
                 update="sgd"),
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=16, consensus="replicas", momentum="adam",
                 update="sgd"),
            _run("flexdemo", 3e-3, compression_rate=1 / 4, compression_chunk=8, consensus="replicas", momentum="adam",
                 update="sgd", seed=7),
            # 10 of 64: the rate 3-byte coefficients (8-bit positions) would fit in the default's 8x fewer bytes
            _run("flexdemo", 3e-3, compression_rate=10 / 64, compression_chunk=8, consensus="replicas", momentum="adam",
                 update="sgd"),
            *(_run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=chunk, consensus="replicas",
                   momentum="adam", update="sgd") for chunk in (32, 64)),  # larger blocks still?
            _run("flexdemo", 3e-3, compression_rate=1 / 8, compression_chunk=32, **RULE),  # ... for the default rule?
            # rate 1/4 in the default's bytes or fewer: positions as a bitmask of the block (1 bit per coefficient)
            # and float8 values with a per-block scale (1 byte; error feedback sends what the rounding lost later)
            *(_run("flexdemo", 3e-3, compression_rate=1 / 4, compression_chunk=chunk, consensus="replicas",
                   momentum="adam", update="sgd", value_dtype="float8", **seed) for chunk, seed in
              ((8, {}), (8, {"seed": 7}), (32, {}))),
            # ... and denser still within 8x fewer bytes than AdamW-HSDP: 5/16 of 32 x 32 (about 9x)
            _run("flexdemo", 3e-3, compression_rate=5 / 16, compression_chunk=32, consensus="replicas", momentum="adam",
                 update="sgd", value_dtype="float8"),
            # the new defaults (1/4 of 32 x 32, float8) from another initialisation
            _run("flexdemo", 3e-3, compression_rate=1 / 4, compression_chunk=32, consensus="replicas", momentum="adam",
                 update="sgd", value_dtype="float8", seed=7),
        ],
    },
    # Local steps over 1,000 steps, two seeds: the grid "local"'s candidates at 40x fewer bytes than bf16 HSDP.
    "local_long": {
        "argv": LONG,
        "pin": WAITING,
        "runs": [
            *(_run("adamw", 3e-3, **seed) for seed in ({}, {"seed": 7})),
            *(_local(steps, **seed) for steps in (4, 8) for seed in ({}, {"seed": 7})),
            *(_local(4, overlap="delayed", outer_delay=1, **seed) for seed in ({}, {"seed": 7})),  # streaming
            # ... by fragments: a quarter of the model's round ends every step
            *(_local(4, overlap="delayed", outer_delay=1, outer_fragments=4, **seed) for seed in ({}, {"seed": 7})),
            # ... and rounds of 8 steps in 4 fragments (one fragment's round ends every other step), with and without
            # the DCT
            *(_local(8, overlap="delayed", outer_delay=1, outer_fragments=4, **transform, **seed)
              for transform in ({}, {"compression_transform": "none"}) for seed in ({}, {"seed": 7})),
        ],
    },
    # Node scaling at the package defaults over 2,000 steps, against AdamW-HSDP on the same nodes and global batch:
    # strong scaling (the global batch fixed, each node steps on 1/R of it) at 8, 4 and 2 nodes.
    "nodes": {
        "argv": HORIZON,
        "pin": {**MEAN_OUTER, **LANDING_NEXT},
        "runs": [
            *(_run(method, 3e-3, **topology, scaling="strong") for topology in reversed(NODE_TOPOLOGIES)
              for method in ("flexdemo", "adamw")),
        ],
    },
    # Weak scaling at today's defaults (the outer step sqrt(R / 2)): the batch per node fixed at the 2 x 2 reference's
    # 32 sequences, so the global batch grows with R (256 at 8 nodes), as when a user adds nodes; 2,000 steps, each
    # gap against AdamW-HSDP on the same nodes and global batch. Then: does the outer step's rule, measured under
    # strong scaling (each node's step on 1/R of the batch is short), hold when each node keeps its batch?
    "nodes_weak": {
        "argv": HORIZON,
        "pin": LANDING_NEXT,
        "pin_by_nodes": ALL_GATHER_OUTER_AT_8,
        "runs": [
            *(_run(method, 3e-3, nodes=8, procs_per_node=1, scaling="weak") for method in ("flexdemo", "adamw")),
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="weak", outer_lr=1.0),
            *(_run(method, 3e-3, nodes=4, procs_per_node=2, scaling="weak") for method in ("flexdemo", "adamw")),
            # the 8-node gap is optimisation speed and outer_lr 1 -> 2 closed most of what closed: a step of sqrt(R)
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="weak", outer_lr=2.83),
            # what the rest of the 8-node gap is: the compression (the dense pseudo-gradient mean, 5x the bits) or the
            # length of a round (rounds of 4, 2x the bits), each at the default outer step
            *(_run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="weak", **knobs)
              for knobs in ({"replicator": "full"}, {"local_steps": 4})),
            # the outer step without its noise: at 8 weak nodes outer_lr 2 beats 1 (+28.6 %) and 2.83 (+36.8 %),
            # as if a longer step bought progress on what the nodes agree on and paid for it in what they do not.
            # Nesterov momentum 0.5 at outer_lr 1 moves a direction the rounds repeat as far as outer_lr 2
            # (1 / (1 - 0.5)) and one they do not about 1.15 x as far (1 / sqrt(1 - 0.5^2))
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="weak", outer_lr=1.0, outer_momentum=0.5),
            # each method's lr by the same small sweep (issue 32): the 3e-3 of every run above is the quick model's
            # choice at 2 nodes, where AdamW-HSDP steps on a quarter of this batch
            *(_run(method, 6e-3, nodes=8, procs_per_node=1, scaling="weak") for method in ("adamw", "flexdemo")),
            # AdamW-HSDP's lr sweep went up to its top at 6e-3 (-5.61 % against 3e-3): one step further
            _run("adamw", 1.2e-2, nodes=8, procs_per_node=1, scaling="weak"),
            # ... and at 4 weak nodes, whose global batch of 128 is half the 8 nodes'
            _run("adamw", 6e-3, nodes=4, procs_per_node=2, scaling="weak"),
            # the mean of two seeds at 8 weak nodes, each method at its best lr: AdamW-HSDP at 6e-3 against
            # the defaults at 3e-3
            _run("adamw", 6e-3, nodes=8, procs_per_node=1, scaling="weak", seed=7),
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="weak", seed=7),
            # the defaults' lr sweep at 4 weak nodes, where AdamW-HSDP's best measured lr is 3e-3
            _run("flexdemo", 6e-3, nodes=4, procs_per_node=2, scaling="weak"),
            # issue 32's H sweep at 8 nodes: rounds of 4 cost what rounds of 8 do here (+12.44 % against +11.29 %),
            # so do rounds of 16 too? They halve what a node sends and receives (an all-gather receives R - 1 payloads)
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="weak", local_steps=16),
            # ... they did (+0.78 % over rounds of 8, inside the seeds' spread of 1.09 points): a second seed
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="weak", local_steps=16, seed=7),
            # the cause, each node normalising by its own batch's second moment, met where it arises: each element of
            # what a node sends lengthened to the nodes' batch (progress_scale="batch"), at the outer step of a mean
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="weak", progress_scale="batch", outer_lr=1.0),
            # ... the second seed, against AdamW-HSDP at 6e-3 of the same seed
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="weak", progress_scale="batch", outer_lr=1.0,
                 seed=7),
            # ... at equal lr (3e-3) it is +2.01 % from AdamW-HSDP, and AdamW-HSDP gains 5.61 % at 6e-3: the same lr
            # sweep for it
            _run("flexdemo", 6e-3, nodes=8, procs_per_node=1, scaling="weak", progress_scale="batch", outer_lr=1.0),
            # ... the nodes' own AdamW does not take 6e-3 on 32 sequences (nor do the defaults'), so the larger step
            # goes to the consensus instead: the inner lr kept, the outer step sqrt(2)
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="weak", progress_scale="batch", outer_lr=1.41),
            # ... and at 4 weak nodes (f <= 2), where the defaults are +14.36 % with both methods at their best lr,
            # 3e-3: the second point a rule for progress_scale by the nodes' batch would rest on
            _run("flexdemo", 3e-3, nodes=4, procs_per_node=2, scaling="weak", progress_scale="batch", outer_lr=1.0),
            # the lr sweep at 8 weak nodes between its two points (3e-3 best, 6e-3 +16.01 % behind): AdamW-HSDP gains
            # 5.61 % from 3e-3 to 6e-3 there, so does the lengthened exchange take a step of sqrt(2)?
            _run("flexdemo", 4.24e-3, nodes=8, procs_per_node=1, scaling="weak", progress_scale="batch", outer_lr=1.0),
            # at 4 weak nodes, where no run overfits by step 2,000, the lengthened exchange levels off 9.5-10 points
            # behind AdamW-HSDP: is that the compression? The dense mean of the lengthened pseudo-gradients
            _run("flexdemo", 3e-3, nodes=4, procs_per_node=2, scaling="weak", progress_scale="batch", outer_lr=1.0,
                 replicator="full"),
            # ... lr 4.24e-3 ends 1.24 % under 3e-3 at 8 weak nodes, inside the seeds' spread (1.90 %): a second seed
            _run("flexdemo", 4.24e-3, nodes=8, procs_per_node=1, scaling="weak", progress_scale="batch", outer_lr=1.0,
                 seed=7),
            # AdamW-HSDP's lr swept in steps of 2 (3e-3, 6e-3 best, 1.2e-2), the lengthened exchange's at 4.24e-3: the
            # same step of sqrt(2) for AdamW-HSDP before the two count as each at its best lr
            _run("adamw", 4.24e-3, nodes=8, procs_per_node=1, scaling="weak"),
            # ... ahead of 6e-3 from step 400 to 1,400, level at the end (+0.19 %, seed 42): the same lrs on both seeds
            _run("adamw", 4.24e-3, nodes=8, procs_per_node=1, scaling="weak", seed=7),
            # the lengthened exchange is +9.87 % at 4 weak nodes on one seed: the second, both methods at 3e-3
            _run("adamw", 3e-3, nodes=4, procs_per_node=2, scaling="weak", seed=7),
            _run("flexdemo", 3e-3, nodes=4, procs_per_node=2, scaling="weak", progress_scale="batch", outer_lr=1.0,
                 seed=7),
            # AdamW-HSDP's sqrt(2) steps at 8 weak nodes: 4.24e-3 ends behind 6e-3 on both seeds, 1.2e-2 far behind
            # (+47.52 %); the step between them
            _run("adamw", 8.49e-3, nodes=8, procs_per_node=1, scaling="weak"),
            # the lengthened exchange is +10.33 % at 4 weak nodes (two seeds) at lr 3e-3; at 8 the step of sqrt(2) to
            # 4.24e-3 took it from +8.02 % to +4.05 %: the same step at 4
            _run("flexdemo", 4.24e-3, nodes=4, procs_per_node=2, scaling="weak", progress_scale="batch", outer_lr=1.0),
            # ... it costs (+8.88 % over 3e-3); AdamW-HSDP's lrs at 4 weak nodes are 3e-3 (best) and 6e-3: the sqrt(2)
            # step below its best, so that its best is bracketed
            _run("adamw", 2.12e-3, nodes=4, procs_per_node=2, scaling="weak"),
            # ... and the same step below the lengthened exchange's best there, so that both methods' lrs are bracketed
            _run("flexdemo", 2.12e-3, nodes=4, procs_per_node=2, scaling="weak", progress_scale="batch", outer_lr=1.0),
            # at 4 weak nodes the lengthened exchange levels off 10 points behind AdamW-HSDP with both lrs bracketed,
            # and the dense mean does worse (compression is not the cause): the length of a round, issue 32's H sweep,
            # rounds of 4 (twice the bits) and of 16 (half)
            *(_run("flexdemo", 3e-3, nodes=4, procs_per_node=2, scaling="weak", progress_scale="batch", outer_lr=1.0,
                   local_steps=steps) for steps in (4, 16)),
            # nor the length of a round: the lengthening's estimate, whose EMAs at the inner beta2 of 0.999 still hold
            # the early steps' larger signal (length_factor.json); a memory of its own, about 100 steps
            # ... -0.63 % against the estimate at 0.999, as far as the two seeds of 0.999 are apart: seed 7
            *(_run("flexdemo", 3e-3, nodes=4, procs_per_node=2, scaling="weak", progress_scale="batch", outer_lr=1.0,
                   progress_scale_decay=0.99, **seed) for seed in ({}, {"seed": 7})),
            # the lengthening where a node barely drifts: the dense mean every 2 steps (the dense step-wise rule, grid
            # nodes_weak_step_wise, normalised before the mean and unlengthened, is +16.32 %); near AdamW-HSDP, the
            # estimate holds and the points left are in the rounds
            _run("flexdemo", 3e-3, nodes=4, procs_per_node=2, scaling="weak", progress_scale="batch", outer_lr=1.0,
                 replicator="full", local_steps=2),
            # ... it runs as the lengthened dense mean in rounds of 8 did, behind the dense step-wise rule: the same
            # rounds of 2 unlengthened, so that the lengthening is the one difference
            _run("flexdemo", 3e-3, nodes=4, procs_per_node=2, scaling="weak", outer_lr=1.0, replicator="full",
                 local_steps=2),
            # the lengthening costs 5.89 points where every element crosses, and gains where the top quarter of each
            # block does: the top eighth, a filter twice as strict at half the bits
            _run("flexdemo", 3e-3, nodes=4, procs_per_node=2, scaling="weak", progress_scale="batch", outer_lr=1.0,
                 compression_rate=1 / 8),
            # the estimate no step moves: the products of each step's two micro-batches (16 sequences each, the same
            # 32 per node and step), compressed and in the dense rounds of 2 where the lengthening cost
            *(_run("flexdemo", 3e-3, nodes=4, procs_per_node=2, scaling="weak", progress_scale="batch", outer_lr=1.0,
                   progress_scale_estimate="micro_batches", gradient_accumulation_steps=2, **knobs)
              for knobs in ({}, {"replicator": "full", "local_steps": 2})),
            # in one process the lengthened dense mean of every step is AdamW-HSDP's (dense_lengthening.json); these
            # rounds of 2 land a step late, each replica's next gradient taken where it was, not at the anchor: the
            # same rounds waited for in step()
            _run("flexdemo", 3e-3, nodes=4, procs_per_node=2, scaling="weak", progress_scale="batch", outer_lr=1.0,
                 replicator="full", local_steps=2, overlap="none"),
            # ... they end 10.88 % below the same rounds landing late: the compressed exchange lands a step late too,
            # so the defaults' wire waited for in step()
            _run("flexdemo", 3e-3, nodes=4, procs_per_node=2, scaling="weak", progress_scale="batch", outer_lr=1.0,
                 overlap="none"),
            # ... +2.06 % over streamed: not the landing. In one process rounds of 2 take back what the lengthening
            # gives (dense_lengthening_rounds2.json), each node's later steps taken on a path the mean does not walk;
            # walked by each node, they keep it (dense_lengthening_rounds2_path.json): the defaults' wire, walked
            _run("flexdemo", 3e-3, nodes=4, procs_per_node=2, scaling="weak", progress_scale="batch", outer_lr=1.0,
                 progress_scale_path="lengthened"),
            # ... +4.49 % over the own path, where in one process the walk gains in dense rounds of 8
            # (dense_lengthening_rounds8*.json): the package's dense mean in rounds of 8, walked, against its +24.44 %
            # on the own path. If it gains, the walk's cost comes with the compression
            _run("flexdemo", 3e-3, nodes=4, procs_per_node=2, scaling="weak", progress_scale="batch", outer_lr=1.0,
                 replicator="full", progress_scale_path="lengthened"),
            # ... and every way measured at 4 weak nodes ends 10 to 25 points behind: DiLoCo's own rule as a reference,
            # the dense mean of rounds of 8 waited for, plain averaging, nothing lengthened
            _run("flexdemo", 3e-3, nodes=4, procs_per_node=2, scaling="weak", outer_lr=1.0, replicator="full",
                 overlap="none"),
        ],
    },
    # Grid "nodes_weak" at 1,000 steps: at 8 weak nodes the lengthened exchange's +4.05 % (lr 4.24e-3 against
    # AdamW-HSDP's 6e-3, 2,000 steps) comes late, after AdamW-HSDP has flattened on 17.7 passes over the data. Half
    # the steps are 8.8 passes, as at 4 weak nodes over 2,000, where nothing flattens: each method at the two lrs
    # nearest its best there, rounds of 8 as on the 2,000-step horizon
    "nodes_weak_long": {
        "argv": LONG,
        "pin": {**LANDING_NEXT, **ROUNDS_OF_8},
        "runs": [
            _run("adamw", 6e-3, nodes=8, procs_per_node=1, scaling="weak"),
            _run("flexdemo", 4.24e-3, nodes=8, procs_per_node=1, scaling="weak", progress_scale="batch", outer_lr=1.0),
            _run("adamw", 4.24e-3, nodes=8, procs_per_node=1, scaling="weak"),
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="weak", progress_scale="batch", outer_lr=1.0),
            # each method did better at the lower of its two lrs: the sqrt(2) step below each, so both are bracketed
            _run("adamw", 3e-3, nodes=8, procs_per_node=1, scaling="weak"),
            _run("flexdemo", 2.12e-3, nodes=8, procs_per_node=1, scaling="weak", progress_scale="batch", outer_lr=1.0),
            # both bracketed (AdamW-HSDP best at 4.24e-3, the lengthened exchange at 3e-3): issue 32's second seed
            _run("adamw", 4.24e-3, nodes=8, procs_per_node=1, scaling="weak", seed=7),
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="weak", progress_scale="batch", outer_lr=1.0,
                 seed=7),
        ],
    },
    # Where the 8-node gap comes from: each node normalising its own gradient before the mean (_dense_step_wise);
    # then at 4 weak nodes, where the lengthened exchange's 10 points are neither its compression nor its rounds' length
    "nodes_weak_step_wise": _dense_step_wise("weak", nodes=(8, 4)),
    # ... under strong scaling (grid "nodes": the global batch fixed at 64 sequences, 8 per node), where the defaults'
    # outer step of 1 was +15.74 % and the dense pseudo-gradient mean +15.17 %
    "nodes_strong_step_wise": _dense_step_wise("strong"),
    # What the defaults lose at 8 nodes (strong scaling, 2,000 steps; AdamW-HSDP and the defaults are grid "nodes"):
    # compression (the dense pseudo-gradient mean instead), the outer rule (DiLoCo's Nesterov; a larger outer step:
    # the mean of R normalised AdamW updates on noisy gradients is shorter than one update on their mean), or the
    # length of a round.
    "nodes_outer": {
        "argv": HORIZON,
        "pin": {**MEAN_OUTER, **LANDING_NEXT},
        "runs": [
            *(_run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="strong", **knobs) for knobs in (
                {"replicator": "full"}, {"outer_lr": 0.7, "outer_momentum": 0.9}, {"outer_lr": 2.0},
                {"local_steps": 4})),
            # the outer step sqrt(R / 2) at 4 nodes (1 at 2, 2 at 8)
            _run("flexdemo", 3e-3, nodes=4, procs_per_node=2, scaling="strong", outer_lr=1.41),
            # above the rule at 8 nodes: sqrt(R), the step that fell back under weak scaling (grid "nodes_weak")
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="strong", outer_lr=2.83),
            # the rule's step at 8 nodes (inner lr x outer lr = 6e-3) with half the drift: each node's round moves half
            # as far from the anchor, so its gradients stay nearer the anchor's, and the outer step doubles to match
            _run("flexdemo", 1.5e-3, nodes=8, procs_per_node=1, scaling="strong", outer_lr=4.0),
            # ... and the other way: the same product with the inner lr up by sqrt(2) and the outer step down by it
            _run("flexdemo", 4.24e-3, nodes=8, procs_per_node=1, scaling="strong", outer_lr=1.41),
            # a second seed at 8 nodes (issue 32's target is the mean of two): AdamW-HSDP and the rule's outer step
            _run("adamw", 3e-3, nodes=8, procs_per_node=1, scaling="strong", seed=7),
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="strong", outer_lr=2.0, seed=7),
            # rounds of 16 at the rule's step: at 8 weak nodes they cost under a point over rounds of 8 (+0.78 %, grid
            # "nodes_weak") for half the bits, where at 2 nodes they cost 1.41 (grid "bits", both landing after one
            # step). Under strong scaling too?
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="strong", outer_lr=2.0, local_steps=16),
            # each element of what a node sends lengthened to the nodes' batch (progress_scale="batch", grid
            # "nodes_weak"), at the outer step of a mean
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="strong", progress_scale="batch"),
            # ... if what parts the scalings is the noise lengthened into what a node sends, which its own path does
            # not answer and which builds up over a round (benchmarks/studies/length_factor.py), rounds of 4 halve it
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="strong", progress_scale="batch", local_steps=4),
        ],
    },
    # Received bytes flat in R: replicator="leader" (one node's positions, chosen the exchange before; one all-reduce
    # of 2-bit codes) against the all-gather at the same outer step (grids "nodes" at 2 nodes and "nodes_outer" at 4
    # and 8: the defaults' sqrt(R / 2)), strong scaling, 2,000 steps. At 8 nodes also twice the rate: the leader
    # sends k values per block where the all-gather brings up to R k, and 1/2 still costs 0.6x the all-gather's 1/4.
    "nodes_leader": {
        "argv": HORIZON,
        "pin": LANDING_NEXT,
        "runs": [
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="strong", replicator="leader"),
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="strong", replicator="leader",
                 compression_rate=0.5),
            _run("flexdemo", 3e-3, nodes=4, procs_per_node=2, scaling="strong", replicator="leader"),
            _run("flexdemo", 3e-3, scaling="strong", replicator="leader"),
        ],
    },
    # Received bytes flat in R with each node's own top-k: replicator="owner" (an all-to-all to the blocks' owners, who
    # forward the top-k of the mean with the next exchange: a round late), against the all-gather and the leader at
    # the same outer step (grids "nodes_outer", "nodes_leader"), strong scaling, 2,000 steps; 8 nodes first.
    "nodes_owner": {
        "argv": HORIZON,
        "pin": LANDING_NEXT,
        "pin_by_nodes": ALL_GATHER_OUTER_AT_8,
        "runs": [
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="strong", replicator="owner"),
            _run("flexdemo", 3e-3, scaling="strong", replicator="owner"),
            # what the owners' loss at 8 nodes comes from: the consensus landing a round late (every value in float32,
            # so the owners forward the exact mean, a round late), against the dense mean landing at once
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="strong", replicator="owner",
                 compression_rate=1.0, value_dtype="float32"),
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="strong", replicator="full"),
            # the owners forward (the top of) a mean, as replicator="full" does, whose outer step at 8 nodes is best
            # at 1 (grid "nodes_outer"), not the sqrt(R / 2) the all-gather's sum of sparse values takes
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="strong", replicator="owner", outer_lr=1.0),
            # issue 32 measures the flat exchange at R = 2, 4 and 8: 4 nodes, at the owner's default outer step (1)
            _run("flexdemo", 3e-3, nodes=4, procs_per_node=2, scaling="strong", replicator="owner"),
            # a second seed at 8 nodes, at the owner's best outer step there (1, its default), and at 2
            _run("flexdemo", 3e-3, nodes=8, procs_per_node=1, scaling="strong", replicator="owner", outer_lr=1.0,
                 seed=7),
            _run("flexdemo", 3e-3, scaling="strong", replicator="owner", seed=7),
        ],
    },
    # Bits at 2 nodes over 2,000 steps (2 x 2): AdamW-HSDP, the defaults (0.19 bits per parameter per step sent per
    # node), two probes of why the defaults fall behind late in the run, and the ways to send half of that or less:
    # rounds twice or four times as long (local_steps 16, 32; the bitmask and 2-bit values per round unchanged), or a
    # sixteenth of each 32 x 32 block per round, whose positions pack as 10-bit indices (0.096 bits). Each gap against
    # the AdamW-HSDP run of this grid.
    "bits": {
        "argv": HORIZON,
        "pin": LANDING_NEXT,
        "runs": [
            _run("adamw", 3e-3),
            _run("flexdemo", 3e-3),
            # the defaults fall behind as the learning rate decays (+0.0 % at step 1,000, +3.0 % at 2,000): does error
            # feedback that forgets (SparseLoCo's 0.95 per exchange) stop stale residuals crossing late in the run?
            _run("flexdemo", 3e-3, feedback_decay=0.95),
            # ... or is each node's step on half the batch shorter than one on the whole (as at 8 nodes, where a larger
            # outer step recovered most of the gap)? sqrt(R), not sqrt(R / 2)
            _run("flexdemo", 3e-3, outer_lr=1.41),
            _run("flexdemo", 3e-3, local_steps=16),
            _run("flexdemo", 3e-3, compression_rate=1 / 16),
            _run("flexdemo", 3e-3, local_steps=32),
            # the field's point (SparseLoCo in Covenant-72B): rounds of 30, 64 of each 64 x 64 block as 12-bit indices,
            # 2-bit values, error feedback decaying 0.95: 0.0074 bits per parameter per step
            _run("flexdemo", 3e-3, local_steps=30, compression_chunk=64, compression_rate=1 / 64, feedback_decay=0.95),
            # a second seed where the margin to the 2 % bar is under a point: AdamW-HSDP, the defaults, and decay 0.95
            *(_run(method, 3e-3, seed=7, **knobs) for method, knobs in (
                ("adamw", {}), ("flexdemo", {}), ("flexdemo", {"feedback_decay": 0.95}))),
            # ... and of half the bits (the seeds' AdamW-HSDP differ by 2.2 %, more than the margins to the bar)
            _run("flexdemo", 3e-3, local_steps=16, seed=7),
            # a fragment's exchange starts every other step (H / F = 2) but must land after one (outer_delay 1), so a
            # slow link needs twice the mean rate (time_to_target.py --links 1 2 10): the loss of landing after two
            _run("flexdemo", 3e-3, outer_delay=2),
            _run("flexdemo", 3e-3, outer_delay=2, seed=7),
            # each element of what a node sends lengthened to the nodes' batch (grids "nodes_weak" and "nodes_outer")
            # at 2 nodes, where the defaults are on par with AdamW-HSDP: by up to sqrt(2) here
            _run("flexdemo", 3e-3, outer_delay=2, progress_scale="batch"),
        ],
    },
    # The same at 300 steps (the smoke test), side by side on one machine: AdamW-HSDP, the defaults, and each
    # fragment's exchange landing after the two steps until its next one starts (outer_delay 2), two seeds each.
    # Then rounds of 4 (their fragments' exchanges land after one step either way): whether a short run wants
    # shorter rounds, so that H resolved from the run's length serves both horizons.
    "outer_delay": {
        "argv": QUICK,
        "pin": {**LANDING_NEXT, **ROUNDS_OF_8},
        "runs": [
            *(_run(method, 3e-3, **knobs, **seed) for seed in ({}, {"seed": 7})
              for method, knobs in (("adamw", {}), ("flexdemo", {}), ("flexdemo", {"outer_delay": 2}))),
            *(_run("flexdemo", 3e-3, local_steps=4, **seed) for seed in ({}, {"seed": 7})),
        ],
    },
    # The frontier at two model sizes (issue 32): AdamW-HSDP, the defaults and a sixteenth of each block (half their
    # bits or less) on the quick model (1.4 M parameters) and on the d256 4 + 4 T5 (8.4 M), 300 steps at 2 x 2, side
    # by side in one run, two seeds (the margins are under a point). The d256 model takes about 3.6x the quick
    # model's step on 2 cores, so the short horizon is what fits.
    "sizes": {
        "argv": [*QUICK, "--timeout_s", "3600"],
        "runs": [
            *(_run(method, 3e-3, **size, **knobs, **seed) for seed in ({}, {"seed": 7}) for size in ({}, D256)
              for method, knobs in (("adamw", {}), ("flexdemo", {}), ("flexdemo", {"compression_rate": 1 / 16}))),
        ],
    },
    # The second model size on the long horizon (issue 32): the d256 4 + 4 T5 over 2,000 steps at 2 x 2, AdamW-HSDP,
    # rounds of 16 (0.095 bits per parameter per step: the quick model's point under 0.1 bits, +3.06 % there) and the
    # defaults (rounds of 8, 0.19 bits). At 300 steps the d256 model lost nothing by halving the bits (grid "sizes"):
    # does that hold where rounds are many? At lr 1e-3 (an AdamW-HSDP run of this model at the quick model's 3e-3,
    # stopped at step 800, spiked its gradient norm past 10), then the same pair at 2e-3 and at 5e-4 (each method's lr
    # bracketed; AdamW-HSDP at 2.5e-4 too, its best of the three being the lowest), then seed 7 of each method at the
    # best lr seed 42 found for it (AdamW-HSDP 5e-4, rounds of 16 1e-3). About 50 min per run on 2 cores.
    "sizes_long": {
        "argv": HORIZON,
        # its runs that leave local_steps to the package ran rounds of 8, before a long run on this model's size took
        # rounds of 16 (knobs.LARGE_MODEL_PARAMETERS)
        "pin": ROUNDS_OF_8,
        "runs": [
            *(_run(method, 1e-3, **D256, **knobs) for method, knobs in (
                ("adamw", {}), ("flexdemo", {"local_steps": 16}), ("flexdemo", {}))),
            *(_run(method, lr, **D256, **knobs) for lr in (2e-3, 5e-4) for method, knobs in (
                ("adamw", {}), ("flexdemo", {"local_steps": 16}))),
            _run("adamw", 2.5e-4, **D256),
            *(_run(method, lr, **D256, **knobs, seed=7) for method, lr, knobs in (
                ("adamw", 5e-4, {}), ("flexdemo", 1e-3, {"local_steps": 16}))),
            # the defaults at AdamW-HSDP's best lr: what a user who tuned AdamW on this model gets
            _run("flexdemo", 5e-4, **D256),
            # seed 7 of the defaults at their best lr (1e-3, -2.31 % against AdamW-HSDP at 5e-4 with seed 42)
            _run("flexdemo", 1e-3, **D256, seed=7),
        ],
    },
    # The learning rate on the long horizon (issue 32: each method's lr by the same small sweep): AdamW-HSDP and the
    # defaults at half and twice the 3e-3 every 2,000-step run took (grid "bits" holds both at 3e-3), 2 x 2, seed 42.
    # First, rounds of 16 as grid "bits" ran them (landing next) at twice its lr: on the d256 model their best lr was
    # twice AdamW-HSDP's (grid sizes_long), and on the quick model they are +3.06 % at 3e-3, AdamW-HSDP's lr.
    # Then both at 4e-3, between the 3e-3 where rounds of 16 are +3.72 % and the 6e-3 where both methods fall back.
    "lr_horizon": {
        "argv": HORIZON,
        "runs": [_run("flexdemo", 6e-3, local_steps=16, **LANDING_NEXT),
                 *(_run(method, lr) for lr in (6e-3, 1.5e-3) for method in ("adamw", "flexdemo")),
                 _run("flexdemo", 4e-3, local_steps=16, **LANDING_NEXT), _run("adamw", 4e-3)],
    },
    # Rounds of 4 against the defaults' 8 at 1,000 steps, two seeds: where between the smoke test (rounds of 4 ahead by
    # a point) and the 2,000-step horizon (the defaults within 2 %) a run's length would switch them.
    "rounds_by_length": {
        "argv": LONG,
        "runs": [
            *(_run(method, 3e-3, **knobs, **seed) for seed in ({}, {"seed": 7})
              for method, knobs in (("adamw", {}), ("flexdemo", {}), ("flexdemo", {"local_steps": 4}))),
        ],
    },
    # At the package defaults: "delayed" is one step stale. ("backward" is "none"'s update, bit for bit, tested
    # in tests/distributed/test_overlap.py; it refuses Trainer's gradient clipping, which these runs use.)
    "overlap": {
        "argv": QUICK,
        "pin": STEP_WISE,
        "runs": [_run("adamw", 3e-3), *(_run("flexdemo", 3e-3, overlap=o) for o in ("none", "delayed")),
                 _run("flexdemo", 1e-3, overlap="delayed")],  # does a stale update want a smaller step?
    },
    # Local steps (DESIGN.md section 8): H inner AdamW steps at AdamW's lr, then the pseudo-gradient's top rate of
    # each 32 x 32 block at 8 (float8), 4 or 2 bits. H = 1 is the step-wise default, where the outer rule is unused.
    "local": {
        "argv": QUICK,
        "pin": WAITING,
        "runs": [
            _run("adamw", 3e-3),
            *(_local(steps, rate=rate, value_dtype=value_dtype, **outer)
              for steps in (1, 2, 4, 8, 16, 32) for rate in (1 / 4, 1 / 16)
              for value_dtype in ("float8", "int4", "int2") for outer in (OUTER if steps > 1 else OUTER[:1])),
            # does the DCT help a pseudo-gradient? top-k of the values themselves, as SparseLoCo
            *(_local(steps, compression_transform="none") for steps in (2, 4, 8)),
            _local(4, compression_transform="none", seed=7),
            # a second seed where a margin is under a point (H = 1 in float8: the package defaults)
            _run("adamw", 3e-3, seed=7),
            *(_local(steps, value_dtype="float8" if steps == 1 else "int2", seed=7) for steps in (1, 2, 4, 8)),
            # streaming: each round's exchange travels during the next outer_delay inner steps before it lands
            *(_local(4, overlap="delayed", outer_delay=delay, **seed) for delay in (1, 2, 4)
              for seed in ({}, {"seed": 7})),
            # streaming by fragments (Streaming DiLoCo): a quarter or a half of the model's round ends every step
            *(_local(4, overlap="delayed", outer_delay=1, outer_fragments=fragments, **seed) for fragments in (2, 4)
              for seed in ({}, {"seed": 7})),
            # ... and rounds twice as long in 4 fragments: half the bytes and half the exchange's compute per step;
            # with and without the DCT (no transforms: the step cost target, 1.32 x AdamW's step measured)
            *(_local(8, overlap="delayed", outer_delay=1, outer_fragments=4, **transform, **seed)
              for transform in ({}, {"compression_transform": "none"}) for seed in ({}, {"seed": 7})),
        ],
    },
}


def run_key(run: dict[str, Any]) -> str:
    knobs = " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(run["knobs"].items()))
    return f"{run['method']} lr={run['lr']:g} {knobs}".strip()


def pareto(rows: list[dict[str, Any]]) -> list[str]:
    """Keys of the runs no other run beats on both final loss and bytes per step."""
    ok = [r for r in rows if math.isfinite(r.get("final_eval_loss", math.nan))]
    return [r["key"] for r in ok if not any(
        o["final_eval_loss"] <= r["final_eval_loss"] and o["bytes_per_step"] <= r["bytes_per_step"]
        and (o["final_eval_loss"], o["bytes_per_step"]) != (r["final_eval_loss"], r["bytes_per_step"]) for o in ok)]


def table(rows: list[dict[str, Any]], front: list[str]) -> str:
    cells = []
    for r in sorted(rows, key=lambda r: r.get("final_eval_loss", math.inf)):
        if r["status"] != "ok":
            cells.append([r["key"], r["status"], "", "", "", ""])
            continue
        gap = "-" if r.get("gap_pct") is None else f"{r['gap_pct']:+.1f} %"
        cells.append([r["key"], f"{r['final_eval_loss']:.3f}", gap, f"{r['bytes_per_step']:.4g}",
                      f"{r['train_wall_seconds']:.0f}", "yes" if r["key"] in front else ""])
    return harness.markdown_table(["run", "final val loss", "vs AdamW", "bytes/step (all ranks)", "train s", "Pareto"],
                                  cells)


def plot(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    with harness.figure(path, figsize=(8, 5)) as [axes]:
        draw(axes, rows, title)


def draw(axes, rows: list[dict[str, Any]], title: str) -> None:
    """:func:`plot`'s points, the AdamW lines and the labels."""
    for r in rows:
        if r["status"] != "ok":
            continue
        if r["method"] == "adamw":
            axes.axhline(r["final_eval_loss"], color="black", linestyle="--",
                         label=f"{r['key']} (HSDP, {r['bytes_per_step']:.3g} B/step)")
            axes.axhline(1.02 * r["final_eval_loss"], color="grey", linestyle=":", linewidth=0.8,
                         label=f"{r['key']} + 2 % (the parity target)")
            continue
        marker = {"flexdemo": "o", "demo": "s"}[r["method"]]
        axes.scatter(r["bytes_per_step"], r["final_eval_loss"], marker=marker)
        axes.annotate(r["key"].replace(" compression_", " ").replace(f"{r['method']} ", ""),
                      (r["bytes_per_step"], r["final_eval_loss"]), fontsize=6)
    axes.set_xscale("log")
    axes.set_xlabel("inter-node bytes per optimizer step, all ranks (o flexdemo, s demo)")
    axes.set_ylabel("final validation loss")
    axes.set_title("\n".join(textwrap.wrap(title, 100)), fontsize=8)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grid", choices=sorted(GRIDS))
    parser.add_argument("--only", nargs="+", help="run keys to run (default: every run of the grid)")
    parser.add_argument("--rerun", action="store_true", help="ignore the results already in the JSON")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/sweep_<grid>.json")
    harness.add_provenance_flags(parser)
    args = parser.parse_args()
    grid = GRIDS[args.grid]
    keys = [run_key(r) for r in grid["runs"]]
    if unknown := sorted(set(args.only or ()) - set(keys)):
        parser.error(f"--only {unknown}: not runs of grid {args.grid!r}; its run keys are {keys}")
    out = args.out or HERE / "results" / f"sweep_{args.grid}.json"
    bench = harness.Run.start(out, args.allow_dirty)
    report = json.loads(out.read_text()) if out.exists() and not args.rerun else {"runs": {}}
    # Every invocation that added to the file (a file from before the harness: its commands, the first's start).
    legacy = [{"command": c} for c in report.pop("commands", [])]
    if legacy:
        legacy[0]["started_at"] = report.get("started_at")
    invocations = report.setdefault("invocations", legacy)
    invocations.append(bench.header)
    for name in [*bench.header, "duration_seconds"]:
        report.pop(name, None)  # the latest invocation's header goes on top (Run.write)
    settings = convergence.parse_args(grid["argv"])
    report.update(grid=args.grid, convergence_argv=grid["argv"], pin=grid.get("pin", {}),
                  pin_by_nodes=grid.get("pin_by_nodes", {}),
                  settings=convergence.settings(settings))
    wanted = [(key, run) for key, run in zip(keys, grid["runs"]) if not args.only or key in args.only]
    with tempfile.TemporaryDirectory(prefix="fdm-sweep-") as scratch:
        for key, run in wanted:
            if key in report["runs"] and report["runs"][key]["status"] == "ok":
                continue
            training = [f"--{k}={v}" for k, v in run["knobs"].items() if k in RUN_FLAGS]
            knobs = [f"{k}={v}" for k, v in pinned_knobs(grid, run).items() if k not in RUN_FLAGS]
            options = convergence.parse_args([*grid["argv"], *training, *(["--flexdemo", *knobs] if knobs else [])])
            start = time.monotonic()
            result = convergence.summarize(convergence.run_method(options, run["method"], run["lr"], 0, Path(scratch)))
            report["runs"][key] = {"method": run["method"], "knobs": run["knobs"], "seconds": time.monotonic() - start,
                                   "invocation": len(invocations) - 1, **result}
            bench.write(out, report)
    rows = []
    def reference_key(run: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(run["knobs"].get(flag) for flag in REFERENCE_FLAGS)

    # AdamW's final loss per REFERENCE_FLAGS, and per REFERENCE_FLAGS and lr: a run's gap is against its AdamW-HSDP
    # at the same lr where the grid has one, else at the grid's first
    references: dict[tuple[Any, ...], float] = {}
    for r in report["runs"].values():
        if r["method"] == "adamw" and r["status"] == "ok":
            references.setdefault(reference_key(r), r["final_eval_loss"])
            references.setdefault((*reference_key(r), r["lr"]), r["final_eval_loss"])
    for key, r in report["runs"].items():
        row = {"key": key, "method": r["method"], "status": r["status"]}
        reference = references.get((*reference_key(r), r["lr"]), references.get(reference_key(r)))
        if r["status"] == "ok":
            row |= {"final_eval_loss": r["final_eval_loss"], "bytes_per_step": r["bytes_sent"]["per_step"],
                    "train_wall_seconds": r["train_wall_seconds"],
                    "gap_pct": None if reference is None or r["method"] == "adamw"
                    else 100 * (r["final_eval_loss"] - reference) / reference}
        rows.append(row)
    front = pareto([r for r in rows if r["status"] == "ok" and r["method"] != "adamw"])
    report.update(rows=rows, pareto=front, table=table(rows, front))
    bench.write(out, report)
    title = (f"sweep '{args.grid}': {' '.join(grid['argv'])} (2 nodes x 2 CPU ranks unless a run says nodes, "
             f"Multi30k en->fr)")
    plot(rows, title, out.with_suffix(".png"))
    print(report["table"])
    print(f"[sweep] wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
