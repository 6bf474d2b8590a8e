"""English number words -> French number words: the translation task the package generates itself.

A genuine sequence-to-sequence problem (word order, agreement and the vigesimal French tens
change between languages) that needs no download, so every recipe, test and benchmark has data
offline, and a tiny T5 learns it on a CPU in minutes. French follows the traditional spelling:
hyphens only below one hundred, "et un" / "et onze", "quatre-vingts" and "deux cents" take an
"s" only at the end of the number, "mille" never does, "millions" does. Needs ``datasets`` (the
``recipes`` extra), like the recipes that use it.
"""

import random

from datasets import Dataset, DatasetDict

MAX_NUMBER = 999_999_999

_EN_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen"
).split()
_EN_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_FR_ONES = (
    "zéro un deux trois quatre cinq six sept huit neuf dix onze douze treize quatorze quinze seize "
    "dix-sept dix-huit dix-neuf"
).split()
_FR_TENS = "_ _ vingt trente quarante cinquante soixante".split()


def _check_range(n: int) -> None:
    if not 0 <= n <= MAX_NUMBER:
        raise ValueError(f"number must be in [0, {MAX_NUMBER}], got {n}")


def _english_below_1000(n: int) -> str:
    hundreds, rest = divmod(n, 100)
    words = [f"{_EN_ONES[hundreds]} hundred"] if hundreds else []
    if rest >= 20:
        tens, ones = divmod(rest, 10)
        words.append(_EN_TENS[tens] + (f"-{_EN_ONES[ones]}" if ones else ""))
    elif rest:
        words.append(_EN_ONES[rest])
    return " ".join(words)


def english_words(n: int) -> str:
    """``n`` in English words, American style: 342 -> "three hundred forty-two"."""
    _check_range(n)
    if n == 0:
        return _EN_ONES[0]
    millions, rest = divmod(n, 1_000_000)
    thousands, units = divmod(rest, 1000)
    words = []
    for count, scale in ((millions, " million"), (thousands, " thousand"), (units, "")):
        if count:
            words.append(_english_below_1000(count) + scale)
    return " ".join(words)


def _french_below_100(n: int, final: bool) -> str:
    if n < 20:
        return _FR_ONES[n]
    tens, ones = divmod(n, 10)
    if tens >= 7:  # 70-99 count in twenties: soixante-dix, quatre-vingt(s), quatre-vingt-dix
        base, rest = ("soixante", n - 60) if tens == 7 else ("quatre-vingt", n - 80)
        if rest == 0:
            return base + ("s" if final else "")
        if rest == 11 and tens == 7:
            return "soixante et onze"
        return f"{base}-{_FR_ONES[rest]}"
    if ones == 0:
        return _FR_TENS[tens]
    if ones == 1:
        return f"{_FR_TENS[tens]} et un"
    return f"{_FR_TENS[tens]}-{_FR_ONES[ones]}"


def _french_below_1000(n: int, final: bool) -> str:
    """``final`` is False when "mille" follows, which drops the plural s of cents / quatre-vingts."""
    hundreds, rest = divmod(n, 100)
    if hundreds == 0:
        return _french_below_100(rest, final)
    head = "cent" if hundreds == 1 else f"{_FR_ONES[hundreds]} cent"
    if rest == 0:
        return head + ("s" if hundreds > 1 and final else "")
    return f"{head} {_french_below_100(rest, final)}"


def french_words(n: int) -> str:
    """``n`` in French words, traditional spelling: 342 -> "trois cent quarante-deux"."""
    _check_range(n)
    if n == 0:
        return _FR_ONES[0]
    millions, rest = divmod(n, 1_000_000)
    thousands, units = divmod(rest, 1000)
    words = []
    if millions:
        words.append("un million" if millions == 1 else f"{_french_below_1000(millions, True)} millions")
    if thousands:
        words.append("mille" if thousands == 1 else f"{_french_below_1000(thousands, False)} mille")
    if units:
        words.append(_french_below_1000(units, True))
    return " ".join(words)


def _sample_numbers(count: int, max_number: int, rng: random.Random) -> list[int]:
    """``count`` distinct numbers in [0, max_number]: a digit count uniformly, then a number of it.

    Drawing the length first keeps short numbers as frequent as long ones, so the data covers
    "sept" as well as "sept cent mille sept".
    """
    buckets = {}
    for digits in range(1, len(str(max_number)) + 1):
        low = 0 if digits == 1 else 10 ** (digits - 1)
        buckets[digits] = (low, min(10**digits - 1, max_number))
    used: set[int] = set()
    taken = dict.fromkeys(buckets, 0)
    numbers = []
    while len(numbers) < count:
        open_buckets = [d for d, (low, high) in buckets.items() if taken[d] <= high - low]
        digits = rng.choice(open_buckets)
        n = rng.randint(*buckets[digits])
        if n not in used:
            used.add(n)
            taken[digits] += 1
            numbers.append(n)
    return numbers


def number_words_dataset(
    train_size: int = 20_000, eval_size: int = 500, seed: int = 0, max_number: int = 999_999
) -> DatasetDict:
    """Deterministic "train" / "validation" splits of English -> French number words.

    Rows follow the Hugging Face translation convention, ``{"translation": {"en": ..., "fr": ...}}``;
    no number appears in both splits. The same arguments always give the same data.
    """
    if not 1 <= max_number <= MAX_NUMBER:
        raise ValueError(f"max_number must be in [1, {MAX_NUMBER}], got {max_number}")
    if train_size < 1 or eval_size < 1:
        raise ValueError(f"train_size and eval_size must be >= 1, got {train_size} and {eval_size}")
    if train_size + eval_size > max_number + 1:
        raise ValueError(
            f"train_size + eval_size ({train_size + eval_size}) exceeds the {max_number + 1} distinct "
            f"numbers in [0, max_number={max_number}]"
        )
    numbers = _sample_numbers(train_size + eval_size, max_number, random.Random(seed))

    def split(chunk: list[int]) -> Dataset:
        rows = [{"en": english_words(n), "fr": french_words(n)} for n in chunk]
        return Dataset.from_dict({"translation": rows})

    return DatasetDict(train=split(numbers[:train_size]), validation=split(numbers[train_size:]))
