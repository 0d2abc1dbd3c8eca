"""Perplexity: hand-computed on models with known outputs; windows and joins as in the papers' protocol."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gac.errors import GacError
from gac.evaluation import perplexity, perplexity_of_ids
from gac.text import load_rows, load_text

from .fakes import CharTokenizer, TableModel

ALPHABET = "abcdefgh \n"


def _hand_ppl(table: torch.Tensor, ids: list[int], seq_len: int) -> tuple[float, int, int]:
    """exp(mean NLL) over non-overlapping windows, computed with Python floats, one token at a time."""
    t = table.double().tolist()
    total, count = 0.0, 0
    n_windows = len(ids) // seq_len
    for w in range(n_windows):
        win = ids[w * seq_len : (w + 1) * seq_len]
        for prev, nxt in zip(win[:-1], win[1:], strict=True):
            row = t[prev]
            log_z = math.log(sum(math.exp(v) for v in row))
            total -= row[nxt] - log_z
            count += 1
    return math.exp(total / count), count, n_windows


def test_perplexity_equals_hand_computation():
    g = torch.Generator().manual_seed(0)
    table = torch.randn(len(ALPHABET), len(ALPHABET), generator=g) * 2
    model, tok = TableModel(table), CharTokenizer(ALPHABET)
    text = "abc defg\nhh ab " * 7 + "gfe"  # 115 characters: 14 windows of 8, 3 left over
    res = perplexity(model, tok, text, seq_len=8)
    ids = tok(text)["input_ids"]
    ppl, count, n_windows = _hand_ppl(table, ids, 8)
    assert res["ppl"] == pytest.approx(ppl, rel=1e-5)
    assert res["nll"] == pytest.approx(math.log(ppl), rel=1e-5)
    assert (res["n_windows"], res["n_tokens"], res["seq_len"]) == (n_windows, count, 8)
    assert res["n_text_tokens"] == len(ids) and res["dropped_tokens"] == len(ids) % 8
    # batching windows does not change the result
    assert perplexity(model, tok, text, seq_len=8, batch_size=5)["ppl"] == pytest.approx(res["ppl"], rel=1e-6)


def test_large_vocabularies_cap_the_windows_per_forward(monkeypatch):
    """A real vocabulary (smollm2: 49152) makes a batch of long windows gigabytes of logits: the batch shrinks to
    the logits budget, the value does not change, and the record says which batch ran."""
    import importlib

    P = importlib.import_module("gac.evaluation.perplexity")  # the module (the package exports a function by its name)

    assert P.perplexity_batch(8, 2048, 49152) == 1 and P.perplexity_batch(8, 1024, 4096) == 8  # smollm2, tiny
    g = torch.Generator().manual_seed(1)
    table = torch.randn(len(ALPHABET), len(ALPHABET), generator=g)
    model, tok = TableModel(table), CharTokenizer(ALPHABET)
    text = "abc defg\nhh ab " * 7
    batches = []  # the windows handed to one forward (window_nll)
    real = P.window_nll
    monkeypatch.setattr(P, "window_nll", lambda m, x, **kw: batches.append(x.shape[0]) or real(m, x, **kw))
    full = perplexity(model, tok, text, seq_len=8, batch_size=5)
    assert full["batch_size"] == 5 and max(batches) == 5
    monkeypatch.setattr(P, "LOGITS_BUDGET", 2 * 8 * len(ALPHABET))  # room for two windows' logits
    batches.clear()
    capped = perplexity(model, tok, text, seq_len=8, batch_size=5)
    assert capped["batch_size"] == 2 and max(batches) == 2
    assert capped["ppl"] == pytest.approx(full["ppl"], rel=1e-6)


def test_uniform_model_has_perplexity_equal_to_vocab_size():
    v = len(ALPHABET)
    res = perplexity(TableModel(torch.zeros(v, v)), CharTokenizer(ALPHABET), "abcdefgh " * 20, seq_len=16)
    assert res["ppl"] == pytest.approx(v, rel=1e-6)


def test_windows_are_non_overlapping_and_the_tail_is_dropped():
    v = len(ALPHABET)
    model = TableModel(torch.zeros(v, v))
    ids = torch.arange(50) % v
    res = perplexity_of_ids(model, ids, seq_len=12, batch_size=2)
    seen = torch.cat(model.inputs)
    assert seen.shape == (4, 12)  # 50 // 12 windows, the last 2 tokens dropped
    assert torch.equal(seen.reshape(-1), ids[:48])
    assert res["n_windows"] == 4 and res["dropped_tokens"] == 2 and res["n_tokens"] == 4 * 11
    model.inputs.clear()
    assert perplexity_of_ids(model, ids, seq_len=12, max_windows=1)["n_windows"] == 1
    assert len(model.inputs) == 1


def test_perplexity_matches_the_hf_loss_on_tiny(tiny):
    model, tok = tiny
    ids = tok("\n\n".join(load_rows("tiny", "test")[:400]))["input_ids"]
    seq = 128
    res = perplexity_of_ids(model, ids, seq_len=seq, max_windows=3)
    x = torch.tensor(ids[: 3 * seq]).view(3, seq)
    with torch.no_grad():
        hf = [model(input_ids=w[None], labels=w[None]).loss.item() for w in x]  # HF shifts labels itself
    assert res["nll"] == pytest.approx(sum(hf) / 3, rel=1e-4)


def test_text_rows_are_joined_like_the_hub_wikitext_loader(tmp_path):
    raw = " = Title = \n \n Line one . \n\n Line two . \n"
    p = tmp_path / "wiki.test.raw"
    p.write_text(raw)
    # the hub's wikitext-2-raw-v1 rows of this file: lines with their newline, whitespace-only lines empty
    rows = [" = Title = \n", "", " Line one . \n", "", " Line two . \n"]
    assert load_rows(p) == rows
    assert load_text(p) == "\n\n".join(rows)
    j = tmp_path / "wiki.jsonl"
    j.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    assert load_text(j) == load_text(p)
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.table({"text": rows}), tmp_path / "test-00000-of-00001.parquet")
    assert load_text(tmp_path / "test-00000-of-00001.parquet") == load_text(p)


def test_a_file_source_gives_the_same_perplexity_as_its_joined_text(tmp_path):
    v = len(ALPHABET)
    g = torch.Generator().manual_seed(1)
    model, tok = TableModel(torch.randn(v, v, generator=g)), CharTokenizer(ALPHABET)
    p = tmp_path / "t.txt"
    p.write_text("abc def\n\nhgf edc\nab\n" * 5)
    assert perplexity(model, tok, p, seq_len=8)["ppl"] == pytest.approx(
        perplexity(model, tok, load_text(p), seq_len=8)["ppl"], rel=1e-7)


# ------------------------------------------------------------------------------------------------- bad input


def test_seq_len_above_the_model_maximum_is_an_error():
    v = len(ALPHABET)
    with pytest.raises(GacError, match=r"seq_len=128 is above the model's maximum sequence length \(64"):
        perplexity(TableModel(torch.zeros(v, v), max_len=64), CharTokenizer(ALPHABET), "abc " * 100, seq_len=128)


def test_default_seq_len_is_2048_capped_at_the_model_maximum(tiny):
    from gac.evaluation import resolve_seq_len

    assert resolve_seq_len(tiny[0], None) == min(2048, tiny[0].config.max_position_embeddings)


def test_text_shorter_than_one_window_is_an_error():
    v = len(ALPHABET)
    with pytest.raises(GacError, match="fewer than one window"):
        perplexity(TableModel(torch.zeros(v, v)), CharTokenizer(ALPHABET), "abc def", seq_len=32)


@pytest.mark.parametrize("content", ["", "\n \n\n", None])
def test_empty_eval_file_is_an_error(tmp_path, content):
    v = len(ALPHABET)
    p = tmp_path / ("empty.jsonl" if content is None else "empty.txt")
    p.write_text("" if content is None else content)
    with pytest.raises(GacError, match="empty"):
        perplexity(TableModel(torch.zeros(v, v)), CharTokenizer(ALPHABET), p, seq_len=8)


def test_hub_dataset_without_network_says_how_to_use_a_local_file():
    with pytest.raises(GacError) as e:
        load_text("wikitext2", "test")
    msg = str(e.value)
    assert "could not load WikiText-2" in msg and "--ppl-data" in msg and "wiki.test.raw" in msg


def test_unknown_source_name_suggests_close_matches():
    with pytest.raises(GacError, match="did you mean 'wikitext2'"):
        load_text("wikitxt2")
    with pytest.raises(GacError, match="does not exist"):
        load_text("/no/such/wiki.test.raw")
