"""ROUGE through Google's ``rouge_score``, as an ``evaluate`` metric that loads with no network.

Same inputs, arguments and output keys as the Hub's ``evaluate.load("rouge")``, except that the
aggregate is the plain mean F-measure (deterministic) rather than a bootstrap median;
``hf_flexdemo.seq2seq.metrics`` loads this file by path when the Hub cannot be reached.
"""

import datasets
import evaluate
from rouge_score import rouge_scorer

_CITATION = """\
@inproceedings{lin-2004-rouge,
    title = "{ROUGE}: A Package for Automatic Evaluation of Summaries",
    author = "Lin, Chin-Yew",
    booktitle = "Text Summarization Branches Out",
    year = "2004",
    pages = "74--81",
}
"""

_DESCRIPTION = "ROUGE-N and ROUGE-L F-measures (0-1); rougeLsum splits sentences on newlines."

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of summaries to score.
    references: list of reference summaries, or of lists of them (the best-matching one counts).
    rouge_types: default ["rouge1", "rouge2", "rougeL", "rougeLsum"].
    use_aggregator: mean over the predictions (default) or one score per prediction.
    use_stemmer: Porter-stem words before matching.
    tokenizer: an object with a ``tokenize(text)`` method, instead of rouge_score's default.
Returns:
    one entry per rouge type.
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Rouge(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features(
                    {
                        "predictions": datasets.Value("string"),
                        "references": datasets.Sequence(datasets.Value("string")),
                    }
                ),
                datasets.Features(
                    {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
                ),
            ],
            codebase_urls=["https://github.com/google-research/google-research/tree/master/rouge"],
        )

    def _compute(
        self, predictions, references, rouge_types=None, use_aggregator=True, use_stemmer=False, tokenizer=None
    ):
        rouge_types = rouge_types or ["rouge1", "rouge2", "rougeL", "rougeLsum"]
        scorer = rouge_scorer.RougeScorer(rouge_types=rouge_types, use_stemmer=use_stemmer, tokenizer=tokenizer)
        scores = []
        for prediction, reference in zip(predictions, references):
            targets = [reference] if isinstance(reference, str) else list(reference)
            scores.append(scorer.score_multi(targets, prediction))
        per_type = {kind: [score[kind].fmeasure for score in scores] for kind in rouge_types}
        if use_aggregator:
            return {kind: sum(values) / len(values) if values else 0.0 for kind, values in per_type.items()}
        return per_type
