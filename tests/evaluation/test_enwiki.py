"""The enwiki text source (gac.fixtures.enwiki), offline: markup stripping on real wiki syntax, and the build on a
small dump made here (the real one comes from the gensim==4.4.0 wheel and needs PyPI once)."""

from __future__ import annotations

import bz2
import hashlib
import json

import pytest

from gac.cli import main
from gac.errors import GacError
from gac.fixtures import enwiki

MARKUP = """{{Infobox country|name=Nowhere|capital={{nowrap|Town}}}}
'''Nowhere''' is a [[country]] in the [[Fictional Ocean|ocean]].<ref name="a">{{cite web|url=x}}</ref> It was
founded in 1900 by people who liked [[cartography]] and '''long''' sentences about places.<ref>Smith 1901.</ref>
[[File:Map.png|thumb|A map of [[Nowhere]], drawn in 1901.]]
{| class="wikitable"
| a || b
|}
== History ==
The first settlers arrived by boat and built houses along the coast, see [http://example.org the archive] for details.
* a short item
* A list item that is long enough to be kept as a paragraph of its own text.
=== Early years ===
During the early years the settlers farmed the land and traded fish with their neighbours.<!-- a comment -->
== References ==
The references section is cut with everything that follows it, even long paragraphs like this one.
[[Category:Countries]]
[[de:Nirgendwo]]
"""


def test_markup_becomes_wikitext_layout_paragraphs():
    paras = enwiki.wiki_to_paragraphs(MARKUP, enwiki.RECIPE["cut_sections"], min_words=8)
    assert paras == [
        "Nowhere is a country in the ocean. It was",
        "founded in 1900 by people who liked cartography and long sentences about places.",
        "= = History = =",
        "The first settlers arrived by boat and built houses along the coast, see the archive for details.",
        "A list item that is long enough to be kept as a paragraph of its own text.",
        "= = = Early years = = =",
        "During the early years the settlers farmed the land and traded fish with their neighbours.",
    ]  # (a line break in the markup ends a paragraph, as in the dump's own text)
    text = "\n".join(paras)
    for gone in ("{{", "}}", "[[", "]]", "<ref", "wikitable", "Category", "Nirgendwo", "references section", "http",
                 "'''", "a short item", "comment", "Map.png"):
        assert gone not in text, gone
    assert "= = History = =" in paras and "= = = Early years = = =" in paras
    assert "country in the ocean" in text and "the archive for details" in text


def _page(title: str, text: str, ns: int = 0, redirect: bool = False) -> str:
    from xml.sax.saxutils import escape

    red = f'<redirect title="{escape(title)}x" />' if redirect else ""
    return (f"<page><title>{escape(title)}</title><ns>{ns}</ns><id>1</id>{red}<revision><text>{escape(text)}</text>"
            f"</revision></page>")


def _article(i: int) -> str:
    sents = [f"Article number {i} begins with a sentence that has quite a few plain words in it, about topic {i}.",
             f"The second sentence of article {i} says something else entirely about the river and the hills.",
             f"A third sentence follows here, and it mentions that the town of {i} has a market every week.",
             "Finally the fourth sentence closes the paragraph with a remark on weather and the long winter."]
    body = "\n\n".join(" ".join(sents) for _ in range(3))
    return f"'''Topic {i}''' intro.\n== Overview ==\n{body}\n== See also ==\n* [[Elsewhere]]"


@pytest.fixture
def dump(tmp_path, monkeypatch):
    xml = ["<mediawiki xmlns=\"http://www.mediawiki.org/xml/export-0.10/\">"]
    xml += [_page(f"Topic {i}", _article(i)) for i in range(25)]
    xml += [_page("Old name", "#REDIRECT [[Topic 1]]", redirect=True), _page("Talk:Topic 1", _article(99), ns=1)]
    xml.append("</mediawiki>")
    path = tmp_path / "dump.xml.bz2"
    path.write_bytes(bz2.compress("".join(xml).encode()))
    recipe = json.loads(json.dumps(enwiki.RECIPE))
    recipe["member_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    recipe["task_items"] = {**recipe["task_items"], "piqa": 20, "hellaswag": 20}
    monkeypatch.setattr(enwiki, "RECIPE", recipe)
    monkeypatch.setenv("GAC_CACHE", str(tmp_path / "cache"))
    return path


def test_build_splits_by_article_and_makes_task_files(dump, capsys):
    from gac.evaluation.tasks import check_local_file
    from gac.fixtures import task_files_of
    from gac.metrics import ppl_metric
    from gac.text import load_text

    assert main(["fixtures", "build", "enwiki", "--dump", str(dump)]) == 0
    root = enwiki.default_dir()
    prov = json.loads((root / "provenance.json").read_text())
    # 25 articles (the redirect and the talk page dropped): index 3 mod 20 is test, 13 mod 20 validation
    assert prov["articles"]["test"] == ["Topic 3", "Topic 23"] and prov["articles"]["validation"] == ["Topic 13"]
    assert len(prov["articles"]["train"]) == 22 and "Old name" not in sum(prov["articles"].values(), [])
    test = load_text("enwiki", "test")
    assert " = Topic 3 = " in test and " = = Overview = = " in test and "See also" not in test and "Topic 5" not in test
    assert ppl_metric("enwiki (test)") == "ppl_enwiki" and ppl_metric(str(root / "test.txt")) == "ppl_enwiki"
    files = task_files_of("enwiki")
    for task, path in files.items():
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        assert len(rows) == prov["task_items"][task] > 0
        check_local_file(task, str(path))  # lm-eval's schema: what `gac evaluate --tasks` checks first
    assert main(["fixtures", "info", "enwiki"]) == 0
    assert "2 articles" in capsys.readouterr().out


def test_a_changed_dump_is_refused(dump, tmp_path):
    bad = tmp_path / "bad.xml.bz2"
    bad.write_bytes(dump.read_bytes() + b"x")
    with pytest.raises(GacError, match="not the pinned dump"):
        enwiki.build_enwiki(dump=bad)
    assert not enwiki.default_dir().exists()


def test_next_sentence_items_are_what_they_say():
    """HellaSwag format: the true next sentence among three other sentences of the same article (not adjacent, of
    similar length); PiQA format: a sentence's second half against another sentence's of similar length."""
    docs = [(f"Doc {d}", [f"Sentence {i} of document {d} has some words in it, exactly {i % 5 + 8} of them here." +
                          " more" * (i % 5) for i in range(30)]) for d in range(3)]
    piqa, hs = enwiki.next_sentence_items(docs, 40, 40, seed=0)
    assert len(piqa) == 40 and len(hs) == 40
    for r in hs:
        title = r["activity_label"]
        sents = dict(docs)[title]
        i = sents.index(r["endings"][int(r["label"])])
        assert r["ctx_a"] == sents[i - 1] and r["ctx_b"] == ""
        others = [sents.index(e) for k, e in enumerate(r["endings"]) if k != int(r["label"])]
        assert len(set(others)) == 3 and all(abs(j - i) > 1 for j in others)
        n = len(sents[i].split())
        assert all(abs(len(sents[j].split()) - n) <= max(2, n // 4) for j in others)
    for r in piqa:
        true = [r["sol1"], r["sol2"]][r["label"]]
        whole = [s for s in sum((x for _, x in docs), []) if s.startswith(r["goal"] + " ")]
        assert whole and whole[0] == f"{r['goal']} {true}"
        assert [r["sol1"], r["sol2"]][1 - r["label"]] != true
