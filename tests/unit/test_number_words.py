"""The built-in English -> French number-words data: spelling rules, determinism, splits."""

import random
import re

import pytest

from hf_flexdemo.seq2seq.number_words import MAX_NUMBER, english_words, french_words, number_words_dataset

SPELLINGS = [
    (0, "zero", "zéro"),
    (1, "one", "un"),
    (16, "sixteen", "seize"),
    (17, "seventeen", "dix-sept"),
    (21, "twenty-one", "vingt et un"),
    (22, "twenty-two", "vingt-deux"),
    (61, "sixty-one", "soixante et un"),
    (70, "seventy", "soixante-dix"),
    (71, "seventy-one", "soixante et onze"),
    (72, "seventy-two", "soixante-douze"),
    (79, "seventy-nine", "soixante-dix-neuf"),
    (80, "eighty", "quatre-vingts"),
    (81, "eighty-one", "quatre-vingt-un"),
    (90, "ninety", "quatre-vingt-dix"),
    (91, "ninety-one", "quatre-vingt-onze"),
    (99, "ninety-nine", "quatre-vingt-dix-neuf"),
    (100, "one hundred", "cent"),
    (101, "one hundred one", "cent un"),
    (180, "one hundred eighty", "cent quatre-vingts"),
    (200, "two hundred", "deux cents"),
    (201, "two hundred one", "deux cent un"),
    (280, "two hundred eighty", "deux cent quatre-vingts"),
    (342, "three hundred forty-two", "trois cent quarante-deux"),
    (1000, "one thousand", "mille"),
    (1001, "one thousand one", "mille un"),
    (2000, "two thousand", "deux mille"),
    (21_000, "twenty-one thousand", "vingt et un mille"),
    (80_000, "eighty thousand", "quatre-vingt mille"),
    (80_080, "eighty thousand eighty", "quatre-vingt mille quatre-vingts"),
    (200_000, "two hundred thousand", "deux cent mille"),
    (200_200, "two hundred thousand two hundred", "deux cent mille deux cents"),
    (1_000_000, "one million", "un million"),
    (2_000_000, "two million", "deux millions"),
    (80_000_000, "eighty million", "quatre-vingts millions"),
    (200_000_000, "two hundred million", "deux cents millions"),
    (
        999_999_999,
        "nine hundred ninety-nine million nine hundred ninety-nine thousand nine hundred ninety-nine",
        "neuf cent quatre-vingt-dix-neuf millions neuf cent quatre-vingt-dix-neuf mille "
        "neuf cent quatre-vingt-dix-neuf",
    ),
]


@pytest.mark.parametrize(("n", "english", "french"), SPELLINGS)
def test_spelling(n: int, english: str, french: str) -> None:
    assert english_words(n) == english
    assert french_words(n) == french


def _numbers_to_check() -> list[int]:
    rng = random.Random(1)
    return list(range(0, 3000)) + [rng.randint(0, MAX_NUMBER) for _ in range(3000)]


def test_french_agreement_rules_hold_everywhere() -> None:
    for n in _numbers_to_check():
        words = french_words(n).split()
        text = " ".join(words)
        for i, word in enumerate(words):
            following = words[i + 1] if i + 1 < len(words) else None
            # "cents" and "quatre-vingts" are plural only at the end of the number or before "millions".
            if word == "cents" or word.endswith("quatre-vingts"):
                assert following in (None, "millions"), (n, text)
            if following is None:  # a multiplied "cent" and a final "quatre-vingt" must take the s
                assert word != "cent" or i == 0 or words[i - 1] in ("mille", "million", "millions"), (n, text)
                assert not word.endswith("quatre-vingt"), (n, text)
            if word in ("mille", "cent") and i > 0 and words[i - 1] == "un":  # 1000 is "mille", not "un mille"
                assert word == "mille" and i >= 2 and words[i - 2] not in ("million", "millions"), (n, text)
        assert "milles" not in words, (n, text)
        for match in re.finditer(r"(\S+) et (\S+)", text):
            assert match.group(1) in ("vingt", "trente", "quarante", "cinquante", "soixante"), (n, text)
            assert match.group(2) in ("un", "onze"), (n, text)
        assert ("million" in words) == (n // 1_000_000 == 1), (n, text)


def test_english_has_no_and_and_hyphenates_below_one_hundred() -> None:
    for n in _numbers_to_check():
        text = english_words(n)
        assert " and " not in text
        for word in text.split():
            if "-" in word:
                tens, ones = word.split("-")
                assert tens.endswith("ty") and ones in "one two three four five six seven eight nine".split()


@pytest.mark.parametrize("n", [-1, MAX_NUMBER + 1])
def test_out_of_range_number_is_refused(n: int) -> None:
    with pytest.raises(ValueError, match="number must be in"):
        english_words(n)
    with pytest.raises(ValueError, match="number must be in"):
        french_words(n)


def test_dataset_is_deterministic_and_disjoint() -> None:
    first = number_words_dataset(train_size=500, eval_size=100, seed=3, max_number=99_999)
    again = number_words_dataset(train_size=500, eval_size=100, seed=3, max_number=99_999)
    other = number_words_dataset(train_size=500, eval_size=100, seed=4, max_number=99_999)
    assert first["train"]["translation"] == again["train"]["translation"]
    assert first["validation"]["translation"] == again["validation"]["translation"]
    assert first["train"]["translation"] != other["train"]["translation"]
    assert (len(first["train"]), len(first["validation"])) == (500, 100)
    train = {row["en"] for row in first["train"]["translation"]}
    validation = {row["en"] for row in first["validation"]["translation"]}
    assert len(train) == 500 and len(validation) == 100 and not train & validation


def test_dataset_rows_follow_the_translation_convention() -> None:
    data = number_words_dataset(train_size=50, eval_size=10, max_number=999)
    assert data["train"].column_names == ["translation"]
    row = data["validation"][0]["translation"]
    assert set(row) == {"en", "fr"}
    words_to_number = {english_words(n): n for n in range(1000)}
    assert row["fr"] == french_words(words_to_number[row["en"]])


def test_short_numbers_are_as_frequent_as_long_ones() -> None:
    data = number_words_dataset(train_size=2000, eval_size=10, max_number=99_999)
    numbers = {english_words(n): n for n in range(100_000)}
    lengths = [len(str(numbers[row["en"]])) for row in data["train"]["translation"]]
    per_length = [lengths.count(d) for d in range(1, 6)]
    assert per_length[:2] == [10, 90]  # every one- and two-digit number, though they are 0.1% of the range
    assert min(per_length[2:]) > 400


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_number": 0}, "max_number must be in"),
        ({"max_number": MAX_NUMBER + 1}, "max_number must be in"),
        ({"train_size": 0}, "train_size and eval_size must be >= 1"),
        ({"eval_size": 0}, "train_size and eval_size must be >= 1"),
        ({"train_size": 95, "eval_size": 10, "max_number": 99}, "exceeds the 100 distinct numbers"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        number_words_dataset(**kwargs)


def test_every_number_of_a_small_range_can_be_drawn() -> None:
    data = number_words_dataset(train_size=90, eval_size=10, max_number=99)
    numbers = {row["en"] for split in data.values() for row in split["translation"]}
    assert numbers == {english_words(n) for n in range(100)}
