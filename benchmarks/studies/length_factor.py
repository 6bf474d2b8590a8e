"""Does ``progress_scale="batch"`` estimate the signal right where each node steps on few sequences?

``progress_scale="batch"`` lengthens each element of a node's progress by ``f = sqrt(R v / (v + (R - 1) s))``, with
the signal ``s`` estimated from the node's consecutive gradients (an EMA of ``g_t * g_{t-1}``, as ``v`` is of
``g_t ** 2``). That product is the signal only if the step between the two gradients does not move the second one:
each inner step follows the first gradient's noise, and on a curved loss the next gradient answers it, which biases
``s`` low by an amount that grows with the noise, i.e. as a node's batch shrinks. This trains the quick model with one
node's AdamW (lr 3e-3, warmup 100, linear decay over 2,000 steps, clip 1.0: the horizon preset's) on ``b`` sequences
a step, keeps the estimator's state as the optimizer does, and at each checkpoint compares, summed over the model:

* ``lag_share``: the estimator's own reading over the last ``--window`` steps, sum(g_t g_{t-1}) / sum(g_t^2);
* ``probe_share``: the signal's share measured at the current weights from ``--probes`` independent batches of
  ``b`` (the squared mean less its sampling variance, over the mean square), which no step moves;
* ``ema_share``: what the factor uses, the bias-corrected EMAs' sum(clip(s, 0, v)) / sum(v);
* ``f_ema`` and ``f_probe``: the factor at ``--nodes`` nodes per tensor from those sums, averaged by size;
* ``f_element``: the mean of the factor the optimizer applies, per element (``progress_scale.length_factors``).

With ``--micro_batches`` each step's batch is two micro-batches, token-weighted as gradient accumulation adds them,
and the rows add what ``progress_scale_estimate="micro_batches"`` reads on the same run, from the unclipped gradients:

* ``micro_share``: its EMAs' sum(clip(s, 0, v)) / sum(v), ``s`` from the products of the two micro-batches;
* ``f_micro_element``: the mean of its factor per element.

    python -m benchmarks.studies.length_factor   # minutes on one core, writes benchmarks/results/length_factor.json
    python -m benchmarks.studies.length_factor --micro_batches --batch_sizes 32 \
        --out benchmarks/results/length_factor_micro.json

A study (``benchmarks/studies/README.md``): its figures are in docs/results.md ("Weak scaling").
"""

from __future__ import annotations

import argparse
from collections import deque
from pathlib import Path

import torch
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments, T5ForConditionalGeneration, set_seed
from transformers.optimization import get_linear_schedule_with_warmup

from benchmarks import harness
from hf_flexdemo.optim.progress_scale import length_factors
from hf_flexdemo.seq2seq.data import DataTrainingArguments, load_raw_datasets, tokenize_splits
from hf_flexdemo.seq2seq.model import ModelArguments, load_tokenizer
from hf_flexdemo.seq2seq.tiny_t5 import tiny_t5_config

MULTI30K = harness.REPO.parent / "shared" / "data" / "multi30k"
TASK, LR, WARMUP, HORIZON, BETA2 = "translation", 3e-3, 100, 2000, 0.999


def training_data(seed: int) -> tuple[object, object, object]:
    """The quick preset's tokenizer, tokenized training split and collator, as ``convergence_worker`` builds them."""
    tokenizer, tokenized, collate = quick_splits(seed)
    return tokenizer, tokenized["train"], collate


def quick_splits(seed: int) -> tuple[object, dict[str, object], object]:
    """The quick preset's tokenizer, tokenized training and validation splits (model inputs only) and collator."""
    data_args = DataTrainingArguments(train_file=str(MULTI30K / "train.en.gz"), source_lang="en", target_lang="fr",
                                      validation_file=str(MULTI30K / "val.en.gz"), max_source_length=64,
                                      max_target_length=64)
    splits, _ = load_raw_datasets(TASK, data_args, None, seed)
    tokenizer = load_tokenizer(ModelArguments(tokenizer_vocab_size=4000), splits, TASK, data_args)
    training_args = Seq2SeqTrainingArguments(output_dir="/tmp/length_factor", use_cpu=True, report_to="none")
    tokenized = {name: split.remove_columns([c for c in split.column_names
                                             if c not in ("input_ids", "attention_mask", "labels")])
                 for name, split in tokenize_splits(splits, TASK, tokenizer, data_args, training_args).items()}
    return tokenizer, tokenized, DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100)


def gradients(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(**batch).loss.backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def quick_training(tokenizer: object, seed: int) -> tuple[torch.nn.Module, torch.optim.AdamW, object,
                                                          torch.Generator]:
    """The quick model from ``seed``, torch's AdamW on it with the horizon preset's schedule, and the data order."""
    set_seed(seed)
    model = T5ForConditionalGeneration(tiny_t5_config(len(tokenizer), d_model=128, num_layers=2, num_heads=4,
                                                      d_ff=512))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    return (model, optimizer, get_linear_schedule_with_warmup(optimizer, WARMUP, HORIZON),
            torch.Generator().manual_seed(seed))


def measure(batch_size: int, args: argparse.Namespace, data: tuple[object, object, object]) -> list[dict]:
    tokenizer, train, collate = data
    model, optimizer, schedule, order = quick_training(tokenizer, args.seed)
    params = list(model.parameters())

    def batch() -> dict[str, torch.Tensor]:
        rows = torch.randint(len(train), (batch_size,), generator=order).tolist()
        return collate([train[i] for i in rows])

    lag = [torch.zeros_like(p) for p in params]
    micro, squares = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    prev: list[torch.Tensor] | None = None
    window: deque[tuple[float, float]] = deque(maxlen=args.window)
    rows = []
    for t in range(1, max(args.at) + 1):
        model.zero_grad(set_to_none=True)
        if args.micro_batches:
            step_micro_batches(model, batch(), micro, squares)
        else:
            model(**batch()).loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        grads = [p.grad.detach().clone() for p in params]
        if prev is not None:  # the estimator of progress_scale.accumulate
            torch._foreach_mul_(lag, BETA2)
            torch._foreach_addcmul_(lag, grads, prev, value=1 - BETA2)
            window.append((sum(float((g * q).sum()) for g, q in zip(grads, prev)),
                           sum(float((g * g).sum()) for g in grads)))
        prev = grads
        optimizer.step()
        schedule.step()
        if t not in args.at:
            continue
        probes = [gradients(model, batch()) for _ in range(args.probes)]
        sums, f_element = [], 0.0  # per tensor: the estimate's s and v, the weights' signal and mean square
        for i, p in enumerate(params):
            v = optimizer.state[p]["exp_avg_sq"] / (1 - BETA2**t)
            s = torch.minimum((lag[i] / (1 - BETA2 ** (t - 1))).clamp_min(0.0), v)
            stack = torch.stack([probe[i] for probe in probes])
            signal = stack.mean(0).square() - stack.var(0) / args.probes  # unbiased for the squared mean
            square = stack.square().mean(0)
            sums.append(torch.stack([x.sum() for x in (s, v, signal, square)]).double())
            f_element += float(length_factors([v], [s], args.nodes)[0].sum())
        ema_s, ema_v, probe_s, probe_v = torch.stack(sums).unbind(1)
        sizes = torch.tensor([p.numel() for p in params], dtype=torch.float64)
        f_ema, f_probe = length_factors([ema_v, probe_v], [ema_s, probe_s], args.nodes)
        row = {"batch_size": batch_size, "step": t, "lag_share": sum(a for a, _ in window) / sum(b for _, b in window),
               "probe_share": float(probe_s.sum() / probe_v.sum()), "ema_share": float(ema_s.sum() / ema_v.sum()),
               "f_ema": float(f_ema @ sizes / sizes.sum()), "f_probe": float(f_probe @ sizes / sizes.sum()),
               "f_element": f_element / float(sizes.sum())}
        if args.micro_batches:
            v, s = ([x / (1 - BETA2**t) for x in xs] for xs in (squares, micro))
            clipped = [torch.minimum(x.clamp_min(0.0), y) for x, y in zip(s, v)]
            row["micro_share"] = float(sum(x.sum() for x in clipped) / sum(y.sum() for y in v))
            row["f_micro_element"] = float(sum(f.sum() for f in length_factors(v, s, args.nodes)) / sizes.sum())
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
        rows.append(row)
    return rows


def step_micro_batches(model: torch.nn.Module, rows: dict[str, torch.Tensor], micro: list[torch.Tensor],
                       squares: list[torch.Tensor]) -> None:
    """Backward over ``rows`` as two micro-batches, each loss weighted by its share of the label tokens (the step's
    gradient is then the token mean of the whole batch, as gradient accumulation gives it), and the EMAs of
    ``progress_scale_estimate="micro_batches"``: 4 a (g - a) for the first micro-batch's share ``a``, and g^2."""
    labels = rows["labels"].ne(-100).sum()
    half = len(rows["labels"]) // 2
    first = None
    for part in (slice(0, half), slice(half, None)):
        chunk = {k: v[part] for k, v in rows.items()}
        (model(**chunk).loss * chunk["labels"].ne(-100).sum() / labels).backward()
        if first is None:
            first = [p.grad.detach().clone() for p in model.parameters()]
    for ema, square, a, p in zip(micro, squares, first, model.parameters()):
        ema.mul_(BETA2).add_(a * (p.grad - a), alpha=4 * (1 - BETA2))
        square.mul_(BETA2).addcmul_(p.grad, p.grad, value=1 - BETA2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[8, 32], help="sequences per node and step")
    parser.add_argument("--at", type=int, nargs="+", default=[200, 450, 800], help="checkpoint steps")
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--probes", type=int, default=32, help="independent batches per checkpoint")
    parser.add_argument("--window", type=int, default=100, help="steps of the lag-product reading")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--micro_batches", action="store_true", help="each step two micro-batches; also the estimate "
                        "from their products")
    parser.add_argument("--out", type=Path, default=harness.RESULTS / "length_factor.json")
    harness.add_provenance_flags(parser)
    args = parser.parse_args()
    bench = harness.Run.start(args.out, args.allow_dirty)
    torch.set_num_threads(1)
    data = training_data(args.seed)
    rows = [row for b in args.batch_sizes for row in measure(b, args, data)]
    bench.write(args.out, {"lr": LR, "warmup": WARMUP, "horizon": HORIZON, "nodes": args.nodes,
                           "probes": args.probes, "window": args.window, "seed": args.seed,
                           "micro_batches": args.micro_batches, "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
