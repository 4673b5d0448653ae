"""The project's data and weights: what exists (the catalogue) and where it is, checked (the store).

It sits on the ground floor of the package, importing nothing else from ``zerosiam``, so that the dataset
readers, the corruptions, the zoo and the language-model code can all depend on it.

>>> from zerosiam import assets
>>> path = assets.fetch("resnet20")            # mirror, then cache, then download; sha256-checked

* :mod:`zerosiam.assets.catalogue`: ``ASSETS``, ``Asset``, ``AssetFile``, ``get_asset`` and the errors;
* :mod:`zerosiam.assets.store`: ``fetch``, ``resolve``, ``verify``, ``locate``, the mirror and cache folders;
* :mod:`zerosiam.assets.files`: ``sha256_file`` and the package's one atomic writer (``atomic_file``,
  ``atomic_write``).
"""

from zerosiam.assets.catalogue import (
    ASSETS,
    CACHE_ENV,
    MIRROR_ENV,
    Asset,
    AssetError,
    AssetFile,
    AssetMissingError,
    ChecksumMismatchError,
    UnknownAssetError,
    get_asset,
)
from zerosiam.assets.files import atomic_file, atomic_write, sha256_file
from zerosiam.assets.store import (
    MirrorArg,
    VerifyResult,
    cache_dir,
    default_mirror,
    fetch,
    locate,
    mirror_dirs,
    resolve,
    verify,
)

__all__ = [
    "ASSETS",
    "CACHE_ENV",
    "MIRROR_ENV",
    "Asset",
    "AssetError",
    "AssetFile",
    "AssetMissingError",
    "ChecksumMismatchError",
    "MirrorArg",
    "UnknownAssetError",
    "VerifyResult",
    "atomic_file",
    "atomic_write",
    "cache_dir",
    "default_mirror",
    "fetch",
    "get_asset",
    "locate",
    "mirror_dirs",
    "resolve",
    "sha256_file",
    "verify",
]
