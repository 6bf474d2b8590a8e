"""chrF / chrF++ through sacreBLEU, as an ``evaluate`` metric that loads with no network.

Same inputs, arguments and output keys as the Hub's ``evaluate.load("chrf")``;
``hf_flexdemo.seq2seq.metrics`` loads this file by path when the Hub cannot be reached.
"""

import datasets
import evaluate
import sacrebleu

_CITATION = """\
@inproceedings{popovic-2015-chrf,
    title = "chr{F}: character n-gram {F}-score for automatic {MT} evaluation",
    author = "Popovi{\\'c}, Maja",
    booktitle = "Proceedings of the Tenth Workshop on Statistical Machine Translation",
    year = "2015",
    pages = "392--395",
}
"""

_DESCRIPTION = "Corpus-level chrF (0-100): character n-gram F-score, chrF++ with word_order=2."

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of translations to score.
    references: list of lists of references, the same number for every prediction.
    char_order, word_order, beta, lowercase, whitespace, eps_smoothing: as in ``sacrebleu.CHRF``.
Returns:
    score, char_order, word_order, beta.
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ChrF(evaluate.Metric):
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
        char_order=6,
        word_order=0,
        beta=2,
        lowercase=False,
        whitespace=False,
        eps_smoothing=False,
    ):
        per_prediction = {len(refs) for refs in references}
        if len(per_prediction) > 1:
            raise ValueError("chrf: every prediction needs the same number of references")
        streams = [list(stream) for stream in zip(*references)]
        chrf = sacrebleu.CHRF(
            char_order=char_order,
            word_order=word_order,
            beta=beta,
            lowercase=lowercase,
            whitespace=whitespace,
            eps_smoothing=eps_smoothing,
        )
        result = chrf.corpus_score(predictions, streams)
        return {"score": result.score, "char_order": char_order, "word_order": word_order, "beta": beta}
