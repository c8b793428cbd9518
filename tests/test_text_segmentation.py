"""Text normalisation, sentence segmentation in many forms and scripts, the length cap, ranking."""

import pytest
import torch
import torch.nn.functional as F

from inference.text.normalise import normalise_text
from inference.text.rank import RankerSettings, encoder_can_read, pacsum_centrality, rank_sentences
from inference.text.segment import (
    WINDOW_CHARS,
    WINDOW_WORDS,
    LengthCap,
    fit_summary,
    fit_to_cap,
    is_unspaced,
    join_sentences,
    measure,
    sentence_spans,
    split_sentences,
    truncate,
    within_cap,
)
from inference.text.topics import topic_label

TOKENISED = (
    "-lrb- cnn -rrb- the palestinian authority officially became the 123rd member of the "
    "international criminal court on wednesday , a step that gives the court jurisdiction . "
    "the formal accession was marked with a ceremony at the hague , in the netherlands . "
    "mr. smith , of the u.s. state department , said `` we are disappointed . '' "
    "the vote was 3.5 to 1 ."
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            TOKENISED,
            [
                "-lrb- cnn -rrb- the palestinian authority officially became the 123rd member of "
                "the international criminal court on wednesday , a step that gives the court "
                "jurisdiction .",
                "the formal accession was marked with a ceremony at the hague , in the "
                "netherlands .",
                "mr. smith , of the u.s. state department , said `` we are disappointed . ''",
                "the vote was 3.5 to 1 .",
            ],
        ),
        (
            "Mr. Brown met Dr. Lee in the U.S. capital on Monday. They discussed e.g. trade "
            "and rates of 3.5 per cent. Prof. J. R. Hale agreed. No. 10 said nothing.",
            [
                "Mr. Brown met Dr. Lee in the U.S. capital on Monday.",
                "They discussed e.g. trade and rates of 3.5 per cent.",
                "Prof. J. R. Hale agreed.",
                "No. 10 said nothing.",
            ],
        ),
        ("He said no. Then he left.", ["He said no.", "Then he left."]),
        (
            "lower case prose. with no capitals at all. still split",
            [
                "lower case prose.",
                "with no capitals at all.",
                "still split",
            ],
        ),  # fmt: skip
        ("今天天气很好。我们去公园吧！你来吗？", ["今天天气很好。", "我们去公园吧！", "你来吗？"]),
        (
            "東京は晴れです。「明日は雨でしょう。」と彼は言った。",
            [
                "東京は晴れです。",
                "「明日は雨でしょう。」",
                "と彼は言った。",
            ],
        ),  # fmt: skip
        (
            "오늘은 날씨가 좋다. 우리는 공원에 갔다? 정말 즐거웠다!",
            [
                "오늘은 날씨가 좋다.",
                "우리는 공원에 갔다?",
                "정말 즐거웠다!",
            ],
        ),  # fmt: skip
        (
            "Заседание началось в 10 часов. Министр выступил первым.",
            [
                "Заседание началось в 10 часов.",
                "Министр выступил первым.",
            ],
        ),  # fmt: skip
    ],
)
def test_split_sentences_in_many_forms_and_scripts(text, expected):
    assert split_sentences(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        TOKENISED,
        'He said "the flights help." "they are not enough," she said. iPhone sales rose. '
        "eBay fell.",
        "what changes: fares fall. season tickets in the app.\n\nThe council agreed. it "
        "meets again in May.",
        "<p>Heading</p><p>First line. second line.</p><ul><li>one item</li><li>two</li></ul>",
        " ".join(f"word{i}" for i in range(300)) + ". Then a sentence.",
        "今天天气很好。我们去公园吧！" * 30,
    ],
    ids=["tokenised", "quotes-iphone", "list-paragraphs", "html", "windows", "unspaced"],
)
def test_sentence_spans_locate_every_sentence_in_the_normalised_text(text):
    flat = normalise_text(text)
    spans = sentence_spans(flat)
    assert [flat[a:b] for a, b in spans] == split_sentences(text)
    assert all(a < b for a, b in spans)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(spans, spans[1:], strict=False))


def test_lower_case_starts_stay_inside_their_sentence_in_cased_prose():
    # In cased prose a lower-case word after a period does not open a sentence: the cut is
    # where a capital, digit or quote-and-capital follows, so the spans never split "iPhone".
    text = 'Sales rose in May. iPhone demand was "strong." eBay said so. They agreed.'
    assert split_sentences(text) == [
        'Sales rose in May. iPhone demand was "strong." eBay said so.',
        "They agreed.",
    ]


def test_a_caption_run_into_the_next_sentence_is_cut_before_its_opener():
    # Scraped text loses line ends: a caption or heading runs into the sentence after it. A
    # capitalised opener straight after a word starts a sentence; a dateline, a list number,
    # a quote opened after a colon and a name ("The Times") do not.
    text = (
        "Rachel Smith at the launch in London on Friday The event raised money for charity. "
        "Washington (CNN) The senator spoke. 5 After a break, play resumed. "
        "He said: ' They played well.' She reads The Times every day."
    )
    assert split_sentences(text) == [
        "Rachel Smith at the launch in London on Friday",
        "The event raised money for charity.",
        "Washington (CNN) The senator spoke.",
        "5 After a break, play resumed.",
        "He said: ' They played well.'",
        "She reads The Times every day.",
    ]
    # Tokenised lower-case text has no capitals to go by: nothing changes there.
    lower = "the launch in london on friday the event raised money ."
    assert split_sentences(lower) == [lower]


def test_text_without_punctuation_falls_back_to_bounded_windows():
    words = " ".join(f"word{i}" for i in range(2000))
    windows = split_sentences(words)
    assert len(windows) == 2000 // WINDOW_WORDS + (2000 % WINDOW_WORDS > 0)
    assert all(len(w.split()) <= WINDOW_WORDS for w in windows)
    assert " ".join(windows) == words
    # Scripts without spaces are cut by characters, never inside a combined character.
    for text in ("中" * 2000, "🎉" * 700, "👍🏽" * 300, "é" * 900):
        pieces = split_sentences(text)
        assert len(pieces) > 1 and all(len(p) <= WINDOW_CHARS for p in pieces)
        assert "".join(pieces) == normalise_text(text)
    assert all(p.startswith("👍🏽") for p in split_sentences("👍🏽" * 300))
    # One token longer than a window (a URL, base64) inside prose is cut too.
    long_token = "x" * 1000
    assert max(len(p) for p in split_sentences(f"See {long_token} for details.")) <= WINDOW_CHARS


def test_html_becomes_plain_text_without_markup():
    page = (
        "<!DOCTYPE html><html><head><title>Ignored</title><style>p {color: red}</style>"
        "<script>var tracking = '<p>not text</p>';</script></head><body>"
        "<h1>Fire at the docks</h1><p>Crews fought the fire for six hours &amp; saved two "
        "ships.</p><p>No one was hurt&nbsp;&mdash; police said.<br>Investigators arrive "
        "today.</p><!-- a comment --></body></html>"
    )
    text = normalise_text(page)
    assert text == (
        "Fire at the docks\n\nCrews fought the fire for six hours & saved two ships.\n\n"
        "No one was hurt \u2014 police said.\n\nInvestigators arrive today."
    )
    assert "<" not in text and "tracking" not in text and "color" not in text
    assert split_sentences(page) == [
        "Fire at the docks",
        "Crews fought the fire for six hours & saved two ships.",
        "No one was hurt \u2014 police said.",
        "Investigators arrive today.",
    ]


def test_normalisation_is_nfc_and_whitespace_and_leaves_prose_entities_alone():
    decomposed = "Cafe\u0301 opens.\u00a0\u00a0Tom &amp; Jerry\u200b came.\r\n\r\n\tAT&T &notice"
    text = normalise_text(decomposed)
    assert text == "Café opens. Tom & Jerry came.\n\nAT&T &notice"
    assert normalise_text("  one\nline   wrapped  ") == "one line wrapped"
    assert normalise_text(None) == "" and normalise_text("   ") == ""


def test_unspaced_detection():
    assert is_unspaced("今天天气很好。我们去公园吧！")
    assert is_unspaced("我们使用 Python 和 TensorFlow 进行开发和测试工作。")
    assert is_unspaced("🎉" * 40)
    assert not is_unspaced("오늘은 날씨가 좋다. 우리는 공원에 갔다.")
    assert not is_unspaced("An ordinary English sentence.")


def test_length_cap_counts_sentences_words_or_characters():
    cap = LengthCap(max_sentences=3, max_words=100, max_chars=300)
    long_summary = " ".join(["word"] * 753) + "."
    assert measure(long_summary).words == 753 and not within_cap(long_summary, cap)
    # Punctuation tokens of tokenised text are not words.
    assert measure("a , b `` c '' .").words == 3
    assert not within_cap("One. Two. Three. Four.", cap)
    assert within_cap("One. Two. Three.", cap)
    assert not within_cap("中" * 301, cap) and within_cap("中" * 300, cap)
    assert measure("中文。" * 10).unspaced
    with pytest.raises(ValueError, match=">= 1"):
        LengthCap(max_words=0)


def test_truncate_and_fit_always_end_within_the_cap():
    cap = LengthCap(max_sentences=3, max_words=20, max_chars=50)
    assert truncate(" ".join(["w"] * 300), cap) == " ".join(["w"] * 20)
    assert truncate("中" * 500, cap) == "中" * 50
    assert within_cap(truncate("🎉" * 500, cap), cap)
    sentences = ["First one is here.", "Second is a bit longer than that.", "Third."]
    # By rank: "Third." and "First..." fit 10 words; "Second..." would pass them.
    assert fit_to_cap(sentences, [2, 0, 1], LengthCap(3, 10, 50)) == [0, 2]
    assert fit_summary(" ".join(["Word"] * 30) + ". Next.", cap) == " ".join(["Word"] * 20)
    assert fit_summary("One. Two. Three. Four.", cap) == "One. Two. Three."


def test_joined_sentences_split_back_into_themselves():
    windows = split_sentences(" ".join(f"w{i}" for i in range(300)))
    for picked in ([windows[0], windows[2]], ["Heading without a stop", "Body text."]):
        joined = join_sentences(picked)
        assert split_sentences(joined) == picked
    assert join_sentences(["One.", "Two."]) == "One. Two."
    assert join_sentences(["今天很好。", "你来吗？"]) == "今天很好。 你来吗？"


def _unit(rows: list[list[float]]) -> torch.Tensor:
    return F.normalize(torch.tensor(rows), dim=1)


def test_pacsum_centrality_is_directed():
    # Sentence 0 anticipates sentences 1 and 2; sentence 3 repeats them afterwards.
    vectors = _unit([[1, 1, 0], [1, 0.9, 0], [1, 1.1, 0], [1, 1, 0.05], [0, 0, 1]])
    forward_only = pacsum_centrality(vectors, lambda1=0.0, lambda2=1.0, beta=0.0)
    assert int(torch.argmax(forward_only)) == 0
    penalised = pacsum_centrality(vectors, lambda1=-2.0, lambda2=1.0, beta=0.0)
    assert penalised[3] < penalised[0] and penalised[3] <= 0
    assert pacsum_centrality(vectors[:1], -2.0, 1.0, 0.6).tolist() == [0.0]


def test_rank_sentences_lead_centrality_and_repeats():
    vectors = _unit([[1, 0, 0], [0, 1, 0], [0, 1, 0.001], [0, 0, 1], [0.5, 0.5, 0.7]])
    sentences = [f"Sentence number {i} of the text." for i in range(5)]
    assert rank_sentences(vectors, sentences, RankerSettings(method="lead")) == [0, 1, 2, 3, 4]
    assert rank_sentences(None, sentences, RankerSettings()) == [0, 1, 2, 3, 4]
    pacsum = RankerSettings(method="pacsum", lead_weight=0.0, beta=0.0, lambda1=0.0)
    order = rank_sentences(vectors, sentences, pacsum)
    assert order.index(2) == 4  # a near copy of sentence 1 goes last
    with pytest.raises(ValueError, match="unknown ranking"):
        RankerSettings(method="random")


def test_encoder_reads_latin_script_only():
    assert encoder_can_read("The council voted on Tuesday.")
    assert not encoder_can_read("오늘은 날씨가 좋다. 우리는 공원에 갔다.")
    assert not encoder_can_read("今天天气很好。")
    assert not encoder_can_read("🎉🎉🎉")


@pytest.mark.parametrize(
    ("keywords", "sentence", "expected"),
    [
        (["bridge", "council"], "x", "bridge, council"),
        ([], "오늘은 날씨가 좋다 정말 즐거웠다", "오늘은 날씨가 좋다 정말"),
        ([], "今天天气很好我们去公园吧你来吗今天天气很好", "今天天气很好我们去公园吧你来吗今"),
        ([], "🎉🎉🎉", "🎉🎉🎉"),
        ([""], "", "topic 3"),
    ],
)
def test_topic_labels_are_never_empty(keywords, sentence, expected):
    assert topic_label(keywords, sentence, topic_id=2) == expected
