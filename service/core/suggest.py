"""Did you mean ...? The closest of a few known names to a mistyped one (rapidfuzz).

The names offered are always the caller's own (a tenant's verifiers, datasets; the catalog
every tenant reads): a suggestion must never tell one tenant another's names.
"""

from __future__ import annotations

from collections.abc import Iterable

from rapidfuzz import fuzz, process, utils

# fuzz.ratio (normalised Indel similarity, 0-100) at or above which a name counts as a typo
# of another: `gsm8k-answr` for `gsm8k-answer` scores 96 and `anwser` for `answer` 83 (offered);
# `math` for `path` 75 and `em` for `en` 50 (two different words: not offered).
CUTOFF = 80.0
MAX_NAMES = 1000  # names read to compare with: a tenant's quotas keep it to fewer


def closest(word: str, names: Iterable[str]) -> str | None:
    """The name most like `word` (case and punctuation aside), when one is close enough."""
    found = process.extractOne(
        word, list(names), scorer=fuzz.ratio, processor=utils.default_process, score_cutoff=CUTOFF
    )
    return None if found is None or found[0] == word else found[0]


def did_you_mean(word: str, names: Iterable[str]) -> str:
    """`: did you mean 'x'?` to end a message with, or '' when no name is close."""
    match = closest(word, names)
    return f": did you mean '{match}'?" if match is not None else ""
