"""Scoring of the `string_check` and `text_similarity` graders, in the built-in kinds' helper
process (`builtin_host.py`), under its per-batch deadline.

The metrics are the maintained libraries', not ours: rapidfuzz (fuzzy_match: `fuzz.ratio`/100),
sacrebleu (bleu: `sentence_bleu(...).score`/100), nltk (gleu: `sentence_gleu` over whitespace
tokens), rouge-score (rouge_N / rouge_l: the F-measure of `RougeScorer`). They are imported
only here, at first use, and this module is imported only by the helper (through
`factory.in_process_verifier`), so the API process never loads them (nor numpy under them).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .base import Sample
from .grader_config import Grader, StringCheckGrader, TextSimilarityGrader
from .grader_templates import parse_template, render, sample_namespace


def _fuzzy_match(text: str, reference: str) -> float:
    from rapidfuzz import fuzz

    return fuzz.ratio(text, reference) / 100.0


def _bleu(text: str, reference: str) -> float:
    import sacrebleu

    return sacrebleu.sentence_bleu(text, [reference]).score / 100.0


def _gleu(text: str, reference: str) -> float:
    from nltk.translate.gleu_score import sentence_gleu

    hypothesis, references = text.split(), [reference.split()]
    if not hypothesis or not references[0]:  # nltk divides by zero on empty text
        return 1.0 if hypothesis == references[0] else 0.0
    return float(sentence_gleu(references, hypothesis))


@functools.cache
def _rouge_scorer(rouge_type: str) -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer([rouge_type])


def _rouge(rouge_type: str) -> Callable[[str, str], float]:
    def metric(text: str, reference: str) -> float:
        # RougeScorer.score(target, prediction): the reference is the target.
        return float(_rouge_scorer(rouge_type).score(reference, text)[rouge_type].fmeasure)

    return metric


METRICS: dict[str, Callable[[str, str], float]] = {
    "fuzzy_match": _fuzzy_match,
    "bleu": _bleu,
    "gleu": _gleu,
    **{f"rouge_{n}": _rouge(f"rouge{n}") for n in range(1, 6)},
    "rouge_l": _rouge("rougeL"),
}

_OPERATIONS: dict[str, Callable[[str, str], bool]] = {
    "eq": lambda text, ref: text == ref,
    "ne": lambda text, ref: text != ref,
    "like": lambda text, ref: ref in text,  # OpenAI: the input contains the reference
    "ilike": lambda text, ref: ref.casefold() in text.casefold(),
}


def namespaces(sample: Sample) -> tuple[dict[str, Any], dict[str, Any]]:
    """(item, sample) as OpenAI's graders see them: the record is the item, the completion is
    the sample's output_text (and output_json when it is JSON). Same as the python sandbox's
    `grade(sample, item)` caller (`_bootstrap.py`)."""
    completion = sample.get("completion")
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a string, not {type(completion).__name__}")
    item = {k: v for k, v in sample.items() if k != "completion"}
    return item, sample_namespace(completion)


def grader_function(grader: Grader) -> Callable[[Sample], float]:
    """`fn(sample) -> float` for a string_check or text_similarity grader."""
    if not isinstance(grader, StringCheckGrader | TextSimilarityGrader):
        raise ValueError(f"the {grader.type} grader does not run in process")
    text_template = parse_template(grader.input)
    reference_template = parse_template(grader.reference)
    compare: Callable[[str, str], float]
    if isinstance(grader, StringCheckGrader):
        check = _OPERATIONS[grader.operation]

        def compare(text: str, reference: str) -> float:
            return 1.0 if check(text, reference) else 0.0

    else:
        compare = METRICS[grader.evaluation_metric]

    def fn(sample: Sample) -> float:
        item, namespace = namespaces(sample)
        text = render(text_template, item, namespace)
        reference = render(reference_template, item, namespace)
        return min(max(compare(text, reference), 0.0), 1.0)

    return fn
