"""Corpus BLEU through sacreBLEU, as an ``evaluate`` metric that loads with no network.

Same inputs, arguments and output keys as the Hub's ``evaluate.load("sacrebleu")``;
``hf_flexdemo.seq2seq.metrics`` loads this file by path when the Hub cannot be reached.
"""

import datasets
import evaluate
import sacrebleu

_CITATION = """\
@inproceedings{post-2018-call,
    title = "A Call for Clarity in Reporting {BLEU} Scores",
    author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
    year = "2018",
    pages = "186--191",
}
"""

_DESCRIPTION = "Corpus-level BLEU (0-100) computed by sacreBLEU with its default 13a tokenization."

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of translations to score.
    references: list of lists of references, the same number for every prediction.
    smooth_method, smooth_value, force, lowercase, tokenize, use_effective_order: as in
        ``sacrebleu.BLEU``.
Returns:
    score, counts, totals, precisions, bp, sys_len, ref_len.
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Sacrebleu(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Value("string"),
                    "references": datasets.Sequence(datasets.Value("string")),
                }
            ),
            codebase_urls=["https://github.com/mjpost/sacreBLEU"],
        )

    def _compute(
        self,
        predictions,
        references,
        smooth_method="exp",
        smooth_value=None,
        force=False,
        lowercase=False,
        tokenize=None,
        use_effective_order=False,
    ):
        per_prediction = {len(refs) for refs in references}
        if len(per_prediction) > 1:
            raise ValueError("sacrebleu: every prediction needs the same number of references")
        streams = [list(stream) for stream in zip(*references)]
        bleu = sacrebleu.BLEU(
            smooth_method=smooth_method,
            smooth_value=smooth_value,
            force=force,
            lowercase=lowercase,
            tokenize=tokenize,
            effective_order=use_effective_order,
        )
        result = bleu.corpus_score(predictions, streams)
        return {
            "score": result.score,
            "counts": result.counts,
            "totals": result.totals,
            "precisions": result.precisions,
            "bp": result.bp,
            "sys_len": result.sys_len,
            "ref_len": result.ref_len,
        }
