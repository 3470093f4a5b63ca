"""Where a sampled row ends: at a stop token id, or once its text holds a stop string, found
incrementally (GRPO's decoders, Tinker's sampler and the inference server).

`RowText` keeps a row's decoded text and extends it by the new tokens alone: each step decodes
the tokens since the last emitted text with the token before them as context (a SentencePiece
word's leading space, a byte-level BPE character split over tokens), as vLLM's incremental
detokenizer does, and holds back a tail that decodes to half a character (U+FFFD) until the
character completes. `StopScan` looks for the stop strings only where a match could end in the
newly decoded text (its new characters and the `len(longest stop) - 1` before them, whole
characters held before a half one included): a row of T tokens costs O(T) decoding and
searching, not the O(T^2) of re-decoding the whole row every step.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

_HALF = "\ufffd"  # what a tokenizer decodes half of a multi-byte character to


class RowText:
    """One row's tokens and their decoded text, extended token by token."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.tokens: list[int] = []
        self.text = ""  # the decoded text of tokens[:read], whole characters only
        self.held = ""  # what tokens[read:] add to it, ending in half a character (or nothing)
        self.prefix = 0  # tokens[prefix:read] decode to the text's tail: the context of the next
        self.read = 0

    def _decode(self, tokens: list[int]) -> str:
        text: str = self.tokenizer.decode(tokens, skip_special_tokens=self.skip)  # one row's
        return text

    def push(self, token: int) -> str:
        """Append `token`; the characters this adds to `text` (none while a character is half
        decoded: they are `held`)."""
        self.tokens.append(token)
        before = self._decode(self.tokens[self.prefix : self.read])
        new = self._decode(self.tokens[self.prefix :])[len(before) :]
        if not new or new.endswith(_HALF):
            self.held = new
            return ""
        self.text, self.held = self.text + new, ""
        self.prefix, self.read = self.read, len(self.tokens)
        return new

    @property
    def visible(self) -> str:
        """The text and the whole characters held before a half one."""
        return self.text + self.held.rstrip(_HALF)

    def final(self) -> str:
        """The whole text, a trailing half character included (what decoding the row gives)."""
        return self.text + self.held


def find_stop(text: str, since: int, stops: Sequence[str]) -> int | None:
    """Where the first stop string of `text` starts, among matches ending at or after its
    character `since` (earlier ones were looked for before); None: none."""
    if not stops or since >= len(text):
        return None
    start = max(0, since - max(len(s) for s in stops) + 1)
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits) if hits else None


class StopScan:
    """One row's end: a token of `token_ids` (not added to the text), or a stop string of
    `strings` in its text (`cut`: where the first one starts)."""

    def __init__(
        self,
        tokenizer: Any,
        token_ids: Collection[int],
        strings: Sequence[str],
        skip_special_tokens: bool = True,
    ) -> None:
        self.row = RowText(tokenizer, skip_special_tokens)
        self.token_ids, self.strings = token_ids, tuple(strings)
        self.longest = max((len(s) for s in self.strings), default=0)
        self.by_token = False
        self.cut: int | None = None
        self.seen = 0  # the visible characters already searched

    @property
    def ended(self) -> bool:
        return self.by_token or self.cut is not None

    def push(self, token: int) -> bool:
        """Append `token`; whether the row ends with it (a stop id is not added to the text)."""
        if token in self.token_ids:
            self.by_token = True
            return True
        self.row.push(token)
        if self.strings and self.cut is None:
            visible = self.row.visible
            self.cut = find_stop(visible, min(self.seen, len(visible)), self.strings)
            self.seen = len(visible)
        return self.ended

    def text(self) -> str:
        """The row's text, cut before its first stop string."""
        return self.row.visible[: self.cut] if self.cut is not None else self.row.final()

    def settled(self) -> int:
        """How many characters of `text()` no later token can change: all once ended, else those
        before the tail a stop string could still claim."""
        if self.ended:
            return len(self.text())
        return max(0, len(self.row.text) - max(0, self.longest - 1))


class BatchStops:
    """The stop strings of a batch of N rows decoded together (GRPO's decoders): one `StopScan`
    a row, each fed its new token step by step until its row ends."""

    def __init__(self, tokenizer: Any, n: int, strings: Sequence[str]) -> None:
        self.scans = [StopScan(tokenizer, (), strings) for _ in range(n)]

    def push(self, tokens: Any, ended: Any, stop_len: list[int | None], t: int) -> None:
        """Feed step `t`'s tokens (N,) to the rows not `ended` (N,) yet; a row whose text now
        holds a stop string is marked ended, with `stop_len[i]` = t (its length in tokens)."""
        going = (~ended).nonzero().flatten().tolist()
        if not going:
            return
        step = tokens.tolist()  # one read of the device a step
        for i in going:
            if self.scans[i].push(step[i]):
                ended[i], stop_len[i] = True, t
