"""Scores of generated text for ``Seq2SeqTrainer``: BLEU and chrF (translation) or ROUGE (summarization).

Metrics go through ``evaluate``: the Hub's modules when it is reachable, the copies shipped in
``metric_scripts/`` next to this file otherwise (or when ``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import evaluate
import huggingface_hub
import numpy as np
from transformers import EvalPrediction, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

METRICS_DIR = Path(__file__).resolve().parent / "metric_scripts"
# Set once a Hub lookup failed: the process's later metrics go to the offline copies without another try. The
# fallback is worth one warning per job, not one per metric and rank: the scores then come from the copies shipped
# with the package rather than the Hub's current modules, which a reader of the scores should know.
_hub_unreachable = False


def decode_texts(tokenizer: PreTrainedTokenizerBase, ids: np.ndarray) -> list[str]:
    """Token ids (label padding -100 included) as stripped texts without special tokens."""
    ids = np.where(ids != -100, ids, tokenizer.pad_token_id)
    return [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]


def load_metric(name: str) -> evaluate.EvaluationModule:
    """``evaluate.load(name)`` from the Hub, or the offline copy in ``metric_scripts/`` when the Hub is out of reach
    (offline mode, or a lookup of this process failed: one warning, from rank 0)."""
    global _hub_unreachable
    local = str(METRICS_DIR / name)
    if huggingface_hub.constants.HF_HUB_OFFLINE or evaluate.config.HF_EVALUATE_OFFLINE or _hub_unreachable:
        return evaluate.load(local, keep_in_memory=True)
    try:
        return evaluate.load(name, keep_in_memory=True)
    except OSError as err:  # evaluate raises FileNotFoundError (an OSError) when the Hub cannot be reached
        _hub_unreachable = True
        if int(os.environ.get("RANK", "0") or 0) == 0:  # every rank falls back alike: rank 0 says it for the job
            logger.warning("evaluate.load(%r) could not reach the Hub (%s); the metrics come from the offline copies "
                           "in %s (HF_HUB_OFFLINE=1 goes there directly)", name, err, METRICS_DIR)
        return evaluate.load(local, keep_in_memory=True)


class Seq2SeqMetrics:
    """``compute_metrics`` for generated text: BLEU and chrF (translation) or ROUGE (summarization).

    Keeps the last decoded predictions and references, so the run can show a few at the end.
    """

    def __init__(self, task: str, tokenizer: PreTrainedTokenizerBase) -> None:
        self.task = task
        self.tokenizer = tokenizer
        names = ("sacrebleu", "chrf") if task == "translation" else ("rouge",)
        self.metrics = {name: load_metric(name) for name in names}
        self.predictions: list[str] = []
        self.references: list[str] = []

    def __call__(self, eval_preds: EvalPrediction) -> dict[str, float]:
        predictions = eval_preds.predictions[0] if isinstance(eval_preds.predictions, tuple) else eval_preds.predictions
        self.predictions = decode_texts(self.tokenizer, predictions)
        self.references = decode_texts(self.tokenizer, eval_preds.label_ids)
        if self.task == "translation":
            references = [[r] for r in self.references]
            result = {
                "bleu": self.metrics["sacrebleu"].compute(predictions=self.predictions, references=references)["score"],
                "chrf": self.metrics["chrf"].compute(predictions=self.predictions, references=references)["score"],
            }
        else:
            scores = self.metrics["rouge"].compute(
                predictions=self.predictions, references=self.references, use_stemmer=True
            )
            result = {kind: 100 * value for kind, value in scores.items()}
        result["gen_len"] = float(np.mean([np.count_nonzero(p != self.tokenizer.pad_token_id) for p in predictions]))
        return {key: round(value, 4) for key, value in result.items()}
