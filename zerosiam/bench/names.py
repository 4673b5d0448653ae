"""One table of display names and order, used by every report (image tables, language tables, plots).

Methods appear as the paper spells and orders them: the reference (NoAdapt) first, the baselines
roughly by date, the paper's method and its compositions last. A method not listed (a user's own
recipe) goes just before ZeroSiam, alphabetically.
"""

from __future__ import annotations

METHOD_ORDER: tuple[str, ...] = (
    "noadapt",
    "tent",
    "eta",
    "eata",
    "sar",
    "deyo",
    "come",
    "tlm",
    "zerosiam",
    "eata+zerosiam",
    "deyo+zerosiam",
)
METHOD_NAMES: dict[str, str] = {
    "noadapt": "NoAdapt",
    "tent": "Tent",
    "eta": "ETA",
    "eata": "EATA",
    "sar": "SAR",
    "deyo": "DeYO",
    "come": "COME",
    "tlm": "TLM",
    "zerosiam": "ZeroSiam",
}
DATASET_NAMES: dict[str, str] = {
    "cifar10c": "CIFAR-10-C",
    "cifar100c": "CIFAR-100-C",
    "imagenetc": "ImageNet-C",
    "math500": "Math-500",
    "collegemath": "CollegeMath",
    "aime24": "AIME24",
    "minerva": "Minerva",
    "gsm8k": "GSM8K",
}


def method_name(method: str) -> str:
    """The paper's spelling of a method name (``eata+zerosiam`` -> ``EATA+ZeroSiam``)."""
    return "+".join(METHOD_NAMES.get(part, part) for part in method.split("+"))


def method_rank(method: str) -> tuple[float, str]:
    """Sort key putting methods in :data:`METHOD_ORDER`, unknown ones just before ZeroSiam."""
    if method in METHOD_ORDER:
        return float(METHOD_ORDER.index(method)), method
    return METHOD_ORDER.index("zerosiam") - 0.5, method
