"""Context assembly: merging chunks, the token budget, neighbours, numbering, citations."""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from ragservice.answering.context import (
    Context,
    assemble_context,
    citation_markers,
    extractive_answer,
    source_from_json,
    source_to_json,
)
from ragservice.retrieval.search import SearchHit
from ragservice.types import PageSpan

Counter = Callable[[str], int]


def words(text: str) -> int:
    return len(text.split())


def quarter_chars(text: str) -> int:
    """Roughly a subword tokenizer: a token per four characters, whitespace included."""
    return (len(text) + 3) // 4


# --------------------------------------------------------------------------- helpers

VOCABULARY = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
]


@dataclass(frozen=True)
class Doc:
    """A document and its chunks, cut from its text with exact offsets as the chunker does."""

    id: uuid.UUID
    text: str
    spans: list[tuple[int, int]]
    external_id: str
    title: str | None

    def id_of(self, ordinal: int) -> uuid.UUID:
        # The same chunk has the same id whether it comes as a hit or as a neighbour.
        return uuid.uuid5(self.id, str(ordinal))

    def hit(self, ordinal: int, score: float = 0.0) -> SearchHit:
        start, end = self.spans[ordinal]
        return SearchHit(
            chunk_id=self.id_of(ordinal),
            score=score,
            text=self.text[start:end],
            ordinal=ordinal,
            start_char=start,
            end_char=end,
            chunk_metadata={},
            collection_id=uuid.UUID(int=1),
            collection="default",
            document_id=self.id,
            external_id=self.external_id,
            title=self.title,
            document_metadata={"lang": "en"},
        )


def make_doc(
    n_words: int,
    *,
    size: int = 10,
    overlap: int = 3,
    rng: random.Random | None = None,
    external_id: str = "doc.txt",
    title: str | None = "Doc",
) -> Doc:
    """`n_words` words with varied whitespace, chunked into windows of `size` words, each
    sharing `overlap` words with the one before."""
    rng = rng or random.Random(0)
    separators = [" ", " ", " ", "\n", "  ", "\n\n"]
    text = VOCABULARY[0]
    for i in range(1, n_words):
        text += rng.choice(separators) + VOCABULARY[i % len(VOCABULARY)]
    bounds = [m.span() for m in re.finditer(r"\S+", text)]
    starts = range(0, max(n_words - overlap, 1), size - overlap)
    spans = [(bounds[s][0], bounds[min(s + size, n_words) - 1][1]) for s in starts]
    return Doc(uuid.uuid4(), text, spans, external_id, title)


def assemble(
    hits: list[SearchHit],
    budget: int = 10_000,
    neighbours: list[SearchHit] | None = None,
    counter: Counter = words,
) -> Context:
    return assemble_context(
        hits, count_tokens=counter, budget_tokens=budget, neighbours=neighbours or []
    )


# --------------------------------------------------------------------------- merging


def test_overlapping_chunks_merge_into_the_document_slice() -> None:
    doc = make_doc(60, size=10, overlap=3)
    context = assemble([doc.hit(3, 0.9), doc.hit(2, 0.5), doc.hit(4, 0.7)])

    [source] = context.sources
    assert source.chunk_ids == (doc.id_of(2), doc.id_of(3), doc.id_of(4))
    assert (source.start_char, source.end_char) == (doc.spans[2][0], doc.spans[4][1])
    assert source.text == doc.text[source.start_char : source.end_char]
    assert source.score == 0.9
    assert context.dropped == 0


def test_a_chunk_inside_another_adds_nothing() -> None:
    doc = make_doc(30, size=10, overlap=3)
    outer, inner = doc.spans[0], (doc.spans[0][0] + 6, doc.spans[0][1] - 6)
    doc = replace(doc, spans=[outer, inner, doc.spans[1]])

    [source] = assemble([doc.hit(0), doc.hit(1), doc.hit(2)]).sources

    assert source.text == doc.text[doc.spans[0][0] : doc.spans[2][1]]


def test_consecutive_chunks_without_overlap_join_with_a_newline() -> None:
    doc = make_doc(40, size=10, overlap=0)
    second, third = doc.hit(2), doc.hit(3)

    [source] = assemble([third, second]).sources

    assert source.text == second.text + "\n" + third.text
    assert (source.start_char, source.end_char) == (second.start_char, third.end_char)


def test_chunks_apart_stay_separate_passages_numbered_by_rank() -> None:
    doc = make_doc(60, size=10, overlap=3)

    context = assemble([doc.hit(4, 0.8), doc.hit(1, 0.6)])

    assert [s.chunk_ids for s in context.sources] == [(doc.id_of(4),), (doc.id_of(1),)]
    assert [s.number for s in context.sources] == [1, 2]


def test_a_repeated_hit_counts_once_at_its_first_rank() -> None:
    a, b = make_doc(20, external_id="a"), make_doc(20, external_id="b")

    context = assemble([a.hit(0, 0.9), b.hit(0, 0.8), a.hit(0, 0.1)])

    assert [s.external_id for s in context.sources] == ["a", "b"]
    assert context.sources[0].score == 0.9


# --------------------------------------------------------------------------- format


def test_sources_block_format() -> None:
    guide = make_doc(30, external_id="guide.md", title="The\nGuide")
    notes = make_doc(30, external_id="notes.txt", title=None)
    same = make_doc(30, external_id="same", title="same")
    hits = [guide.hit(2, 0.9), notes.hit(0, 0.8), guide.hit(0, 0.7), same.hit(1, 0.6)]

    context = assemble(hits)

    assert context.text == (
        f"[1] The Guide (guide.md)\n{hits[0].text}\n\n"
        f"[2] notes.txt\n{hits[1].text}\n\n"
        f"[3] The Guide (guide.md)\n{hits[2].text}\n\n"
        f"[4] same\n{hits[3].text}"
    )
    assert context.token_count == words(context.text)
    assert [s.number for s in context.sources] == [1, 2, 3, 4]


def test_sources_of_a_paged_document_name_their_pages() -> None:
    report = make_doc(60, external_id="report.pdf", title="Annual Report")
    scan = make_doc(30, external_id="scan.pdf", title=None)
    hits = [
        replace(report.hit(1, 0.9), pages=PageSpan(3, 3)),
        replace(report.hit(2, 0.8), pages=PageSpan(3, 4)),
        replace(scan.hit(0, 0.7), pages=PageSpan(12, 13)),
        report.hit(6, 0.6),  # stored before pages were kept
    ]

    context = assemble(hits)

    headers = [line for line in context.text.splitlines() if line.startswith("[")]
    assert headers == [
        "[1] Annual Report (report.pdf, pp. 3\u20134)",
        "[2] scan.pdf, pp. 12\u201313",
        "[3] Annual Report (report.pdf)",
    ]
    assert [s.pages for s in context.sources] == [PageSpan(3, 4), PageSpan(12, 13), None]
    assert context.sources[1].cited_as == "scan.pdf, pp. 12\u201313"
    assert [source_from_json(source_to_json(s)) for s in context.sources] == context.sources
    assert source_to_json(context.sources[0])["pages"] == [3, 4]
    cached_before = {k: v for k, v in source_to_json(context.sources[0]).items() if k != "pages"}
    assert source_from_json(cached_before).pages is None


def test_no_hits_give_an_empty_context() -> None:
    assert assemble([]) == Context(sources=[], text="", token_count=0, dropped=0)


def test_a_budget_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="budget_tokens"):
        assemble([], budget=0)


# --------------------------------------------------------------------------- budget


def test_a_passage_that_does_not_fit_is_skipped_for_a_smaller_later_one() -> None:
    small_a = make_doc(10, size=10, external_id="a", title=None)
    large = make_doc(60, size=60, external_id="large", title=None)
    small_c = make_doc(10, size=10, external_id="c", title=None)
    # Each source costs its header ("[n] id", 2 words) plus its words.
    context = assemble([small_a.hit(0), large.hit(0), small_c.hit(0)], budget=30)

    assert [s.external_id for s in context.sources] == ["a", "c"]
    assert context.token_count == 24
    assert context.dropped == 1


def test_an_oversize_best_passage_is_cut_after_the_last_word_that_fits() -> None:
    doc = make_doc(50, size=50, external_id="big", title=None)
    hit = doc.hit(0)

    context = assemble([hit], budget=20)

    [source] = context.sources
    assert context.token_count == 20  # 2 header words and 18 of the passage
    assert source.text.split() == hit.text.split()[:18]
    assert source.text == doc.text[source.start_char : source.end_char]
    assert source.chunk_ids == (hit.chunk_id,)
    assert context.dropped == 0


def test_a_cut_passage_starts_at_its_best_hit() -> None:
    doc = make_doc(60, size=20, overlap=5, title=None)
    first, second = doc.hit(0, 0.2), doc.hit(1, 0.9)

    context = assemble([second, first], budget=12)

    [source] = context.sources
    assert source.chunk_ids == (second.chunk_id,)
    assert second.text.startswith(source.text)
    assert source.start_char == second.start_char
    assert context.dropped == 1


def test_a_single_word_too_long_is_cut_inside() -> None:
    doc = make_doc(1, size=1, overlap=0, external_id="d", title=None)
    doc = replace(doc, text="x" * 100, spans=[(0, 100)])

    context = assemble([doc.hit(0)], budget=20, counter=len)

    assert context.text == "[1] d\n" + "x" * 14
    assert context.sources[0].end_char == 14


def test_nothing_is_returned_when_not_even_a_header_fits() -> None:
    doc = make_doc(20)

    context = assemble([doc.hit(0)], budget=1)

    assert (context.sources, context.text, context.dropped) == ([], "", 1)


@pytest.mark.parametrize("counter", [words, quarter_chars], ids=["words", "chars"])
def test_the_budget_is_never_exceeded(counter: Counter) -> None:
    for seed in range(300):
        rng = random.Random(seed)
        docs, hits, neighbours = random_search(rng)
        budget = rng.randint(1, 300)

        context = assemble(hits, budget, neighbours, counter)

        assert counter(context.text) == context.token_count <= budget, seed
        check_sources(context, docs, hits, seed)


def random_search(rng: random.Random) -> tuple[list[Doc], list[SearchHit], list[SearchHit]]:
    """Hits from a few documents in random order, their neighbours, and some strays."""
    docs = []
    for i in range(rng.randint(1, 4)):
        size = rng.randint(3, 40)
        overlap = rng.choice([0, rng.randint(0, size // 2 - 1)])
        title = rng.choice([None, f"Title {i}"])
        docs.append(make_doc(rng.randint(1, 200), size=size, overlap=overlap, rng=rng, title=title))
    chunks = [(d, ordinal) for d, doc in enumerate(docs) for ordinal in range(len(doc.spans))]
    picked = rng.sample(chunks, rng.randint(0, min(len(chunks), 12)))
    picked += rng.sample(picked, min(len(picked), rng.randint(0, 2)))  # repeats
    hits = [docs[d].hit(o, 1.0 - n / 100) for n, (d, o) in enumerate(picked)]
    near = {(d, o + step) for d, o in picked for step in (-2, -1, 1, 2)}
    near |= set(rng.sample(chunks, min(len(chunks), 3)))  # strays, next to no hit
    neighbours = [docs[d].hit(o) for d, o in sorted(near) if 0 <= o < len(docs[d].spans)]
    return docs, hits, neighbours


def check_sources(context: Context, docs: list[Doc], hits: list[SearchHit], seed: int) -> None:
    texts = {doc.id: doc.text for doc in docs}
    ranks: dict[uuid.UUID, int] = {}
    for rank, hit in enumerate(hits):
        ranks.setdefault(hit.chunk_id, rank)
    seen: set[uuid.UUID] = set()
    best = []
    for number, source in enumerate(context.sources, 1):
        assert source.number == number, seed
        # The source is the document's text, whitespace aside where chunks were newline-joined.
        piece = texts[source.document_id][source.start_char : source.end_char]
        assert source.text.split() == piece.split(), seed
        assert f"\n{source.text}" in context.text, seed
        assert not seen & set(source.chunk_ids), seed
        seen |= set(source.chunk_ids)
        best.append(min(ranks[c] for c in source.chunk_ids if c in ranks))
    assert best == sorted(best), seed
    assert context.dropped == len(set(ranks) - seen), seed


def test_overlapping_sources_repeat_no_text_under_any_budget() -> None:
    for seed in range(100):
        rng = random.Random(seed)
        doc = make_doc(300, size=rng.randint(6, 30), overlap=rng.randint(1, 2), rng=rng)
        ordinals = rng.sample(range(len(doc.spans)), min(len(doc.spans), 6))

        context = assemble([doc.hit(o) for o in ordinals], rng.randint(5, 400), counter=len)

        for source in context.sources:
            assert source.text == doc.text[source.start_char : source.end_char], seed


# --------------------------------------------------------------------------- neighbours


def test_neighbours_extend_a_hit_on_both_sides() -> None:
    doc = make_doc(120, size=10, overlap=3)
    other = make_doc(30)
    neighbours = [doc.hit(o, score=5.0) for o in (3, 4, 6, 7, 9)] + [other.hit(0)]

    context = assemble([doc.hit(5, 0.4)], neighbours=neighbours)

    [source] = context.sources
    assert source.chunk_ids == tuple(doc.id_of(o) for o in (3, 4, 5, 6, 7))
    assert source.text == doc.text[doc.spans[3][0] : doc.spans[7][1]]
    assert source.score == 0.4


def test_neighbours_never_displace_a_hit() -> None:
    a, b = make_doc(60, external_id="a"), make_doc(60, external_id="b")
    hits = [a.hit(2), b.hit(2)]
    tight = assemble(hits).token_count

    context = assemble(hits, tight, neighbours=[a.hit(1), a.hit(3), b.hit(1), b.hit(3)])

    assert context == assemble(hits)


def test_nearest_neighbours_come_first_under_pressure() -> None:
    doc = make_doc(120, size=10, overlap=3)
    hit = doc.hit(5)
    budget = assemble([hit], neighbours=[doc.hit(4), doc.hit(6)]).token_count

    context = assemble([hit], budget, neighbours=[doc.hit(o) for o in (3, 4, 6, 7)])

    assert context.sources[0].chunk_ids == tuple(doc.id_of(o) for o in (4, 5, 6))


def test_a_neighbour_joins_two_hits_into_one_passage() -> None:
    doc = make_doc(80, size=10, overlap=3)
    other = make_doc(20, external_id="other")

    context = assemble([doc.hit(4), other.hit(0), doc.hit(2)], neighbours=[doc.hit(3)])

    first, second = context.sources
    assert first.chunk_ids == tuple(doc.id_of(o) for o in (2, 3, 4))
    assert first.text == doc.text[doc.spans[2][0] : doc.spans[4][1]]
    assert second.external_id == "other"


# --------------------------------------------------------------------------- citations of the hits


def placed(doc: Doc, ordinal: int, span: PageSpan, score: float = 0.0) -> SearchHit:
    return replace(doc.hit(ordinal, score), pages=span)


def test_a_citation_names_the_hits_slide_not_its_neighbours() -> None:
    deck = make_doc(80, external_id="deck.pptx", title=None)
    slides = [placed(deck, o, PageSpan(o, o, "slide")) for o in range(1, 6)]

    context = assemble([slides[2]], neighbours=[slides[1], slides[3]])  # slide 3, 2 and 4

    [source] = context.sources
    assert source.chunk_ids == tuple(deck.id_of(o) for o in (2, 3, 4))  # the context is kept
    assert source.text == deck.text[deck.spans[2][0] : deck.spans[4][1]]
    assert (source.pages, source.cited_as) == (PageSpan(3, 3, "slide"), "deck.pptx, slide 3")
    assert context.text.startswith("[1] deck.pptx, slide 3\n")
    assert source_to_json(source)["pages"] == [3]


def test_hits_joined_by_a_neighbour_are_cited_from_the_first_to_the_last() -> None:
    report = make_doc(80, external_id="report.pdf", title="Report")
    pages = [placed(report, o, PageSpan(o + 1, o + 1)) for o in range(6)]

    context = assemble(
        [pages[2], pages[4]], neighbours=[pages[1], pages[3], pages[5]]
    )  # hits on pages 3 and 5; neighbours on 2, 4 and 6

    [source] = context.sources
    assert source.chunk_ids == tuple(report.id_of(o) for o in range(1, 6))
    assert source.cited_as == "Report (report.pdf, pp. 3\u20135)"


def test_a_sheets_citation_names_the_hits_rows() -> None:
    book = make_doc(60, external_id="book.xlsx", title=None)
    rows = [(2, 11), (12, 20), (21, 40)]
    chunks = [placed(book, o, PageSpan(2, 2, "sheet", "Q3", rows[o])) for o in range(3)]

    context = assemble([chunks[1]], neighbours=[chunks[0], chunks[2]])

    [source] = context.sources
    assert source.cited_as == 'book.xlsx, sheet "Q3", rows 12\u201320'
    assert source_from_json(source_to_json(source)) == source  # as the prompt cache keeps it


def test_weak_hits_next_to_strong_ones_are_context_not_citations() -> None:
    # The 8 best chunks of a small deck are all of its slides: the weak ones join the strong
    # ones' passage, and add their text, not their slides.
    deck = make_doc(60, external_id="deck.pptx", title=None)
    report = make_doc(40, external_id="report.pdf", title=None)
    scores = {2: 0.9, 3: 0.8, 1: 0.2, 4: 0.1}
    hits = [placed(deck, o - 1, PageSpan(o, o, "slide"), s) for o, s in scores.items()]
    hits.append(placed(report, 1, PageSpan(7, 7), 0.15))  # a weak hit, and its passage's best

    context = assemble(sorted(hits, key=lambda hit: -hit.score))

    first, second = context.sources
    assert first.chunk_ids == tuple(deck.id_of(o) for o in range(4))  # every slide's text
    assert (first.cited_as, second.cited_as) == ("deck.pptx, slides 2\u20133", "report.pdf, p. 7")


def test_hits_about_as_strong_are_all_cited() -> None:
    report = make_doc(60, external_id="report.pdf", title=None)
    hits = [placed(report, o, PageSpan(o + 1, o + 1), 0.5) for o in (2, 3, 4)]

    [source] = assemble(hits).sources

    assert source.cited_as == "report.pdf, pp. 3\u20135"


def test_a_hit_without_pages_is_cited_without_its_neighbours_pages() -> None:
    report = make_doc(60, external_id="report.pdf", title=None)
    context = assemble([report.hit(2)], neighbours=[placed(report, 1, PageSpan(1, 1))])

    [source] = context.sources
    assert len(source.chunk_ids) == 2 and (source.pages, source.cited_as) == (None, "report.pdf")


def test_a_neighbour_repeating_a_hit_is_the_hit() -> None:
    doc = make_doc(60)

    context = assemble([doc.hit(2, 0.7)], neighbours=[doc.hit(2, 0.0), doc.hit(3)])

    [source] = context.sources
    assert source.chunk_ids == (doc.id_of(2), doc.id_of(3))
    assert source.score == 0.7


# --------------------------------------------------------------------------- answers


def test_citation_markers_in_order_of_first_use() -> None:
    assert citation_markers("See [2] and [1]; also [2][3] and [1, 4].") == [2, 1, 3, 4]


def test_citation_markers_ignore_what_cannot_be_a_source() -> None:
    text = "In [2023] [0] said [3], [a] [ ] [5] [2, 9]"

    assert citation_markers(text, source_count=3) == [3, 2]
    assert citation_markers(text) == [2023, 3, 5, 2, 9]
    assert citation_markers("no sources here") == []


def test_extractive_answer_cites_the_best_sources_in_order() -> None:
    a = make_doc(12, size=12, external_id="a")
    b = make_doc(12, size=12, external_id="b")
    c = make_doc(12, size=12, external_id="c")
    context = assemble([a.hit(0), b.hit(0), c.hit(0)])
    flat = [" ".join(s.text.split()) for s in context.sources]

    assert extractive_answer(context) == f"{flat[0]} [1]\n\n{flat[1]} [2]\n\n{flat[2]} [3]"
    assert extractive_answer(context, max_sources=1) == f"{flat[0]} [1]"
    assert citation_markers(extractive_answer(context, max_sources=2)) == [1, 2]


def test_extractive_answer_of_nothing_is_empty() -> None:
    assert extractive_answer(assemble([])) == ""
    with pytest.raises(ValueError, match="max_sources"):
        extractive_answer(assemble([]), max_sources=0)


def test_a_hit_left_out_is_not_brought_back_as_a_neighbour() -> None:
    # A long title makes a header cost 12 words, so [5, 6, 7] as one passage would fit where
    # [7] as a source of its own did not; growth still stops at the left-out hit.
    doc = make_doc(120, size=10, overlap=3, title=" ".join(["T"] * 10))
    filler = make_doc(10, size=10, external_id="filler", title=None)
    hits = [doc.hit(5), filler.hit(0), doc.hit(7)]

    context = assemble(hits, budget=50, neighbours=[doc.hit(6), doc.hit(7)])

    assert [s.chunk_ids for s in context.sources] == [
        (doc.id_of(5), doc.id_of(6)),
        (filler.id_of(0),),
    ]
    assert context.dropped == 1


def test_a_passage_inside_a_table_shows_its_header_once() -> None:
    header = "| city | people |\n| --- | --- |"
    rows = [f"| town {i} | {i * 1000} |" for i in range(1, 9)]
    text = "# Towns\n\n" + header + "\n" + "\n".join(rows)
    spans = [(text.index(rows[0]) - len(header) - 1 - 9, text.index(rows[3]) - 1)]
    spans += [(text.index(rows[4]), text.index(rows[5]) + len(rows[5]))]
    spans += [(text.index(rows[6]), len(text))]
    doc = Doc(uuid.uuid4(), text, spans, "towns.xlsx", None)

    def table_hit(ordinal: int, score: float) -> SearchHit:
        hit = doc.hit(ordinal, score)
        if ordinal == 0:
            return hit
        meta = {"table_header": header}
        return replace(hit, text=header + "\n" + hit.text, chunk_metadata=meta)

    alone = assemble([table_hit(1, 0.9)])
    assert alone.sources[0].text == header + "\n" + rows[4] + "\n" + rows[5]
    joined = assemble([table_hit(1, 0.9), table_hit(2, 0.8)])
    [source] = joined.sources
    assert source.text.count(header) == 1  # not again between the two chunks' rows
    assert source.text.endswith(rows[5] + "\n" + rows[6] + "\n" + rows[7])
    assert (source.start_char, source.end_char) == (spans[1][0], len(text))
    tight = assemble([table_hit(1, 0.9)], budget=20)  # the cut keeps the header and a row
    assert tight.sources[0].text.startswith(header + "\n| town 5")
