"""The incremental stop checker (`workers.grpo.stops`) ends rows where re-decoding the whole row
every step would: the same step, the same cut and text, on random token streams of a
character-level and of a byte-level tokenizer (characters split over tokens), stop strings
spanning tokens, and stop ids."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from workers.grpo.stops import StopScan
from workers.grpo.tiny_model import build_char_tokenizer


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """One token per byte (GPT-2's byte-level alphabet), a few merges, and `<eos>`."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = [("a", "b"), ("Ã", "©")]  # "ab"; "é" as one token (its two bytes' symbols)
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["<eos>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def full_redecode(tokenizer, tokens: list[int], ids: set[int], stops: list[str], skip: bool):  # noqa: ANN001, ANN201
    """The replaced way: decode the whole row after every token. (end step, text) or None."""
    row: list[int] = []
    for t, token in enumerate(tokens):
        if token in ids:
            return t, tokenizer.decode(row, skip_special_tokens=skip)
        row.append(token)
        text = tokenizer.decode(row, skip_special_tokens=skip)
        cut = min((text.find(s) for s in stops if s in text), default=-1)
        if cut >= 0:
            return t, text[:cut]
    return None, tokenizer.decode(row, skip_special_tokens=skip)


def incremental(tokenizer, tokens: list[int], ids: set[int], stops: list[str], skip: bool):  # noqa: ANN001, ANN201
    scan = StopScan(tokenizer, ids, stops, skip)
    for t, token in enumerate(tokens):
        if scan.push(token):
            return t, scan.text()
    return None, scan.text()


@pytest.mark.parametrize("kind", ["char", "byte"])
@pytest.mark.parametrize("skip", [True, False])
def test_incremental_stops_match_the_full_redecode(kind: str, skip: bool) -> None:
    tokenizer = build_char_tokenizer() if kind == "char" else byte_tokenizer()
    rng = random.Random(0)
    text_pieces = ["a", "b", "c", " ", "é", "€", "ab", "\n"]
    stop_sets = [["ab"], ["b c", "cé"], ["€a", "a\nb", "ccc"], ["é€é"], []]
    eos = tokenizer.eos_token_id
    ended = 0
    for trial in range(300):
        text = "".join(rng.choice(text_pieces) for _ in range(rng.randint(1, 30)))
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
        if trial % 3 == 0:  # an EOS somewhere, a raw token of half a character elsewhere
            tokens.insert(rng.randrange(len(tokens) + 1), eos)
        if kind == "byte" and trial % 5 == 0:
            tokens.insert(rng.randrange(len(tokens) + 1), tokenizer.convert_tokens_to_ids("Ã"))
        stops = stop_sets[trial % len(stop_sets)]
        ids = {eos} if trial % 2 else set()
        want = full_redecode(tokenizer, tokens, ids, stops, skip)
        assert incremental(tokenizer, tokens, ids, stops, skip) == want, (text, stops)
        ended += want[0] is not None
    assert ended > 60  # the streams do end at stops


def test_a_stop_string_spanning_tokens_ends_at_its_last_token() -> None:
    tokenizer = byte_tokenizer()
    tokens = tokenizer("xxé€yy", add_special_tokens=False)["input_ids"]
    scan = StopScan(tokenizer, set(), ["é€"])
    ends = [scan.push(t) for t in tokens]
    assert ends.index(True) == len(tokenizer("xxé€", add_special_tokens=False)["input_ids"]) - 1
    assert scan.text() == "xx"


def test_settled_text_holds_back_a_possible_stop_prefix() -> None:
    tokenizer = build_char_tokenizer()
    scan = StopScan(tokenizer, set(), ["abc"])
    for ch in "xyab":
        scan.push(tokenizer.convert_tokens_to_ids(ch))
    assert scan.text()[: scan.settled()] == "xy"
    scan.push(tokenizer.convert_tokens_to_ids("c"))
    assert scan.ended and scan.text() == "xy" and scan.settled() == 2


def test_a_batch_ends_each_row_where_its_own_redecode_would() -> None:
    """GRPO's decoders (`BatchStops`): rows of one batch, EOS marked by the decoder beforehand,
    each row's stop step the one the whole-row re-decode finds (stop_len = that step + 1)."""
    import torch

    from workers.grpo.stops import BatchStops

    tokenizer, rng = byte_tokenizer(), random.Random(1)
    eos, stops = tokenizer.eos_token_id, ["b c", "é€"]
    rows = []
    for _ in range(16):
        text = "".join(rng.choice(["a", "b", " ", "c", "é", "€"]) for _ in range(24))
        rows.append(tokenizer(text, add_special_tokens=False)["input_ids"][:24])
    width = max(map(len, rows))
    batch = torch.tensor([r + [eos] * (width - len(r)) for r in rows])  # (N, T)
    ended = torch.zeros(len(rows), dtype=torch.bool)
    stop_len: list[int | None] = [None] * len(rows)
    scans = BatchStops(tokenizer, len(rows), stops)
    for t in range(width):
        ended |= batch[:, t] == eos
        scans.push(batch[:, t], ended, stop_len, t + 1)
    for i, row in enumerate(rows):
        step, _ = full_redecode(tokenizer, row, set(), stops, True)
        assert stop_len[i] == (None if step is None else step + 1), (i, tokenizer.decode(row))
    assert sum(s is not None for s in stop_len) >= 4
