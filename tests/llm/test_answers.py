"""Answer extraction and equivalence on real references from the five math datasets.

Every reference below is read from the shipped jsonl file (through the dataset loaders), never typed
in, so the tests also pin each dataset's answer format. Predictions are written the way a model writes
them: equivalent-but-different forms (fractions vs decimals, ``\\dfrac``, units, ``x = 3`` vs ``3``,
scientific notation, reordered sets) must score as correct, and near misses as wrong.
"""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("math_verify")

from tests.conftest import SHARED_ASSETS  # noqa: E402
from zerosiam.llm.answers import (  # noqa: E402
    extract_answer,
    is_equivalent,
    last_boxed,
    latex_number_forms,
    score,
)
from zerosiam.llm.math_data import COLLEGE_MATH_SAMPLE, load_problems  # noqa: E402

if not (SHARED_ASSETS / "math" / "math500_test.jsonl").is_file():
    pytest.skip("the math datasets are not in the local mirror", allow_module_level=True)


@functools.cache
def references(dataset: str) -> dict[str, str]:
    return {p.id: p.reference for p in load_problems(dataset, mirror=SHARED_ASSETS)}


def boxed(answer: str) -> str:
    return f"Let me work through it step by step.\nSo the final result is $\\boxed{{{answer}}}$."


# (row index in the file, model output, correct?)
MATH500 = [
    (0, boxed(r"(3, \frac{\pi}{2})"), True),
    (0, boxed(r"(3, \pi)"), False),
    (1, boxed("p-q"), True),
    (1, boxed("q - p"), False),
    (2, boxed(r"\dfrac{14}{3}"), True),
    (2, boxed("14/3"), True),
    (2, boxed(r"\frac{3}{14}"), False),
    (3, "The final answer is 9.", True),
    (3, boxed("9.0"), True),
    (4, boxed(r"\text{Evelyn}"), True),
    (4, boxed("Evelyn"), True),
    (4, boxed(r"\text{Bob}"), False),
    (5, boxed(r"42 \text{ inches}"), True),
    (7, boxed("90"), True),
    (7, boxed(r"90^{\circ}"), True),
    (8, boxed(r"\sqrt{117}"), True),
    (8, boxed(r"3\sqrt{12}"), False),
    (11, boxed("3/56"), True),
    (15, boxed("6-5i"), True),
    (15, boxed("6+5i"), False),
    (16, boxed("50"), False),
    (17, boxed("3.14"), False),
    (23, boxed("5"), True),
    (25, boxed("-2, 1"), True),
    (31, boxed(r"11\sqrt{2}"), True),
    (33, boxed("0.3888"), True),
    (36, boxed("7, 5, 3"), True),
    (16, "I could not solve this problem.", False),
]

COLLEGE = [
    (1577, boxed(r"\frac{35}{3}"), True),
    (1577, boxed("11.67"), False),
    (165, boxed("2"), True),
    (2094, boxed(r"\frac{8abc}{3\sqrt3}"), True),
    (2094, boxed(r"\frac{8\sqrt{3}abc}{9}"), True),
    (1990, boxed("(-3, 3)"), True),
    (1990, boxed("[-3,3]"), False),
    (1658, boxed(r"(x^2-2)\sin x + 2x\cos x + C"), True),
    (1466, boxed("-12"), True),
    (1466, boxed("12"), False),
    (894, boxed(r"x \geq 16"), True),
    (2067, boxed(r"\text{No}"), True),
    (2067, boxed(r"\text{Yes}"), False),
    (570, boxed(r"\frac{14}{3}"), True),
    (1154, boxed(r"(-\infty,\infty)"), True),
    (572, boxed("(8u-7v)(2u+3v)"), True),
    (388, boxed("1.5"), True),
    (601, boxed(r"40 \text{ kg}"), True),
    (404, boxed(r"\sqrt[3]{750}"), True),
    (412, boxed("0.25"), True),
    (412, boxed(r"\frac{1}{3}"), False),
    (1778, "The series converges. " + boxed(r"\text{converges}"), True),
    (1778, boxed(r"\text{diverges}"), False),
    (837, boxed(r"\frac{4}{3}a^2"), True),
    (2135, boxed("0.5"), True),
    (2561, boxed("2e^{-x^2}"), True),
    (257, boxed(r"\sqrt{72}"), True),
]

MINERVA = [
    (0, boxed(r"1.6 \text{ cm}"), True),
    (0, boxed("16"), False),
    (1, boxed(r"4.5 \times 10^{33}"), True),
    (2, boxed("41.8"), True),
    (3, boxed("20.39"), True),
    (4, boxed(r"6 \times 10^{-3}"), True),
    (7, boxed("100"), True),
    (10, boxed(r"3.83\times10^{35}"), True),
    (10, boxed(r"3.83\times10^{36}"), False),
    (13, boxed(r"8.7 \times 10^8"), True),
    (15, boxed(r"4 \times 10^{33}"), True),
    (22, boxed("3000000"), True),
    (29, boxed(r"\frac{7}{4}"), True),
    (44, boxed("10^{-5}"), True),
    (46, boxed("15625"), True),
    (49, boxed("-1.5"), True),
    (67, boxed(r"1 + i\sqrt{3}"), True),
    (74, boxed(r"\frac{e^t}{3}"), True),
    (77, boxed(r"\frac{-1}{\omega^2-4}"), True),
    (79, boxed(r"-\frac{1}{5}"), True),
    (79, boxed("0.2"), False),
]

GSM8K_HAND = [
    (0, "She sells 9 eggs a day and makes 9 * 2 = $18 every day.", True),
    (0, "She makes 9 * 2 = 18 dollars. #### 18", True),
    (0, "The answer is 16.", False),
    (2, "His profit is $70,000.", True),
    (2, boxed(r"70{,}000"), True),
    (3, "He runs 540 meters a week. The answer is 540.00", True),
    (3, "He runs 3 * 60 = 180 meters per sprint.", False),
]


def _check(refs: dict[str, str], prefix: str, index: int, output: str, expected: bool) -> None:
    reference = refs[f"{prefix}-{index}"]
    prediction, correct = score(output, reference)
    assert correct is expected, f"{prediction!r} vs reference {reference!r}: expected {expected}"


@pytest.mark.parametrize(("index", "output", "expected"), MATH500)
def test_math500(index, output, expected):
    _check(references("math500"), "math500", index, output, expected)


@pytest.mark.parametrize(("index", "output", "expected"), COLLEGE)
def test_collegemath(index, output, expected):
    _check(references("collegemath"), "collegemath", index, output, expected)


@pytest.mark.parametrize(("index", "output", "expected"), MINERVA)
def test_minerva(index, output, expected):
    _check(references("minerva"), "minerva", index, output, expected)


@pytest.mark.parametrize(("index", "output", "expected"), GSM8K_HAND)
def test_gsm8k_hand_written(index, output, expected):
    _check(references("gsm8k"), "gsm8k", index, output, expected)


def test_gsm8k_first_rows_with_thousands_separators_and_off_by_one():
    problems = load_problems("gsm8k", mirror=SHARED_ASSETS)[:25]
    for problem in problems:
        value = int(problem.reference)
        assert score(f"In total that is ${value:,}.", problem.reference)[1], problem
        assert not score(f"In total that is {value + 1}.", problem.reference)[1], problem


def test_aime24_every_row_with_and_without_leading_zeros():
    problems = load_problems("aime24", mirror=SHARED_ASSETS)
    assert len(problems) == 30
    assert any(p.reference.startswith("0") for p in problems)  # e.g. '025': AIME answers are 000-999
    for problem in problems:
        value = int(problem.reference)
        assert score(boxed(str(value)), problem.reference)[1], problem
        assert score(f"The final answer is {value}", problem.reference)[1], problem
        assert not score(boxed(str(value + 1)), problem.reference)[1], problem


def test_loaders_read_each_dataset_answer_format():
    assert references("gsm8k")["gsm8k-0"] == "18"  # after '####'
    assert references("minerva")["minerva-0"] == "1.6"  # last \boxed{} of the solution
    assert references("math500")["math500-7"] == r"90^\circ"
    college = load_problems("collegemath", mirror=SHARED_ASSETS)
    assert len(college) == COLLEGE_MATH_SAMPLE == len({p.id for p in college})
    assert [p.id for p in college] == [p.id for p in load_problems("collegemath", mirror=SHARED_ASSETS)]
    wrapped = [p for p in college if p.reference.startswith("$") and p.reference.endswith("$")]
    assert all(p.reference.count("$") > 2 for p in wrapped)  # a single $…$ span is unwrapped


def test_seeded_subsets_are_reproducible_and_differ_by_seed():
    first = load_problems("math500", limit=20, seed=1, mirror=SHARED_ASSETS)
    assert [p.id for p in first] == [
        p.id for p in load_problems("math500", limit=20, seed=1, mirror=SHARED_ASSETS)
    ]
    assert [p.id for p in first] != [
        p.id for p in load_problems("math500", limit=20, seed=2, mirror=SHARED_ASSETS)
    ]
    with pytest.raises(ValueError, match="limit"):
        load_problems("math500", limit=0, mirror=SHARED_ASSETS)
    with pytest.raises(ValueError, match="unknown math dataset"):
        load_problems("math5000", mirror=SHARED_ASSETS)


def test_extraction_rules():
    assert last_boxed(r"first \boxed{1} then \boxed{\frac{1}{2}} end") == r"\frac{1}{2}"
    assert last_boxed(r"so \boxed 5.") == "5."
    assert last_boxed(r"truncated \boxed{\frac{1}{2") is None
    assert extract_answer(r"truncated \boxed{\frac{1}{2") == "2"  # falls back to the last number
    assert extract_answer("Thus, the final answer is: $x = 3$.") == "x = 3"
    assert extract_answer("costs 1,234 dollars") == "1234"
    assert extract_answer("no numbers here") is None
    with pytest.raises(TypeError):
        extract_answer(None)


def test_equivalence_edge_cases():
    assert is_equivalent("x=3", "3") and is_equivalent(r"\dfrac{1}{2}", "0.5")
    assert is_equivalent(r"4.5\times 10^{33}", "4.5e33") and not is_equivalent("4.5", "4.5e33")
    assert is_equivalent("-0.5", "-1./2") and latex_number_forms("2e-3") == r"2\times10^{-3}"
    assert not is_equivalent(None, "3") and not is_equivalent("  ", "3")
    with pytest.raises(ValueError, match="empty"):
        is_equivalent("3", "")
