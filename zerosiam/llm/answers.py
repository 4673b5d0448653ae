"""Pull the final answer out of a model's text and decide whether it equals the reference.

Extraction follows the convention the prompts ask for (``\\boxed{...}``, the last one wins) and then
the usual fallbacks for models that ignore it: a "final answer is ..." line, then the last number.
Equivalence is delegated to ``math-verify`` (a maintained LaTeX/sympy comparer that knows fractions
vs decimals, ``\\dfrac``, units, ``x = 3`` vs ``3``, sets of tuples, percentages, ...) because
hand-written comparers are exactly where benchmark numbers quietly go wrong. Answers it cannot parse
as mathematics (e.g. "all real numbers") are compared as normalised strings.
"""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")
_FINAL_LINE = re.compile(
    r"(?:final answer|the answer)\s*(?:is|:)?\s*[:=]?\s*(.+?)\s*(?:$|\n)", re.IGNORECASE | re.MULTILINE
)
# math-verify's default 5 s limits are hit on a saturated CPU, which silently scores an answer wrong
PARSE_TIMEOUT_S = 60
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox``), braces balanced; ``\\boxed 5`` also works.

    Returns None when there is none or its braces never close (a truncated generation).
    """
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    start = matches[-1].end()
    if start >= len(text):
        return None
    if text[start] != "{":
        token = re.match(r"[^\s$]+", text[start:])
        return token.group(0) if token else None
    depth = 0
    for index in range(start, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : index].strip()
    return None


def final_answer_line(text: str) -> str | None:
    """The text after the last "final answer is" / "the answer is", trimmed of ``$`` and a final dot."""
    matches = list(_FINAL_LINE.finditer(text))
    if not matches:
        return None
    answer = re.sub(r"[.\s]+$", "", matches[-1].group(1)).strip().strip("$").strip()
    answer = re.sub(r"[.\s]+$", "", answer)
    return answer or None


def last_number(text: str) -> str | None:
    """The last number in the text, thousands separators removed (GSM8K-style fallback)."""
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def extract_answer(text: str) -> str | None:
    """The model's final answer: last ``\\boxed{}``, else a final-answer line, else the last number."""
    if not isinstance(text, str):
        raise TypeError(f"extract_answer needs a string, not {type(text).__name__}")
    return last_boxed(text) or final_answer_line(text) or last_number(text)


def reference_from_solution(solution: str) -> str:
    """The reference answer of a dataset that only ships worked solutions (Minerva): its last box."""
    answer = last_boxed(solution)
    if answer is None:
        raise ValueError(f"solution has no \\boxed{{}} answer: {solution[:80]!r}")
    return answer


def normalise_text(answer: str) -> str:
    """Lower case, no ``$``/``\\text``/spacing and no trailing dot: for answers that are words."""
    answer = re.sub(r"\\(?:text|mathrm|textbf|mbox)\s*\{([^{}]*)\}", r"\1", answer)
    answer = answer.replace("$", "").replace("\\!", "").replace("\\,", "").replace("\\ ", "")
    return re.sub(r"\s+", " ", answer).strip().rstrip(".").lower()


_E_NOTATION = re.compile(r"^(-?\d+(?:\.\d*)?)[eE]([+-]?\d+)$")
_BARE_DOT = re.compile(r"(\d)\.(?!\d)")


def latex_number_forms(answer: str) -> str:
    """Rewrite programming-style numbers that LaTeX parsers misread: ``4.5e33`` → ``4.5\\times10^{33}``
    (else read as 4.5·e·33) and ``-1./3`` → ``-1/3`` (Minerva writes both)."""
    text = answer.strip()
    match = _E_NOTATION.match(text)
    if match:
        return f"{match.group(1)}\\times10^{{{int(match.group(2))}}}"
    return _BARE_DOT.sub(r"\1", text)


def _parse(answer: str) -> list:
    from math_verify import parse

    text = latex_number_forms(answer)
    if not (text.startswith("$") or "\\boxed" in text):
        text = f"${text}$"
    return parse(text, parsing_timeout=PARSE_TIMEOUT_S)


def is_equivalent(prediction: str | None, reference: str) -> bool:
    """True when the predicted answer equals the reference mathematically (math-verify), or, for
    answers that are not mathematics, as normalised strings. A missing prediction is wrong."""
    if prediction is None or not prediction.strip():
        return False
    if not reference or not reference.strip():
        raise ValueError("the reference answer is empty")
    if normalise_text(prediction) == normalise_text(reference):
        return True
    from math_verify import verify

    gold, guess = _parse(reference), _parse(prediction)
    if not gold or not guess:
        return False
    return bool(verify(gold, guess, timeout_seconds=PARSE_TIMEOUT_S))


def score(text: str, reference: str) -> tuple[str | None, bool]:
    """(extracted answer, correct?) for one generation."""
    prediction = extract_answer(text)
    return prediction, is_equivalent(prediction, reference)
