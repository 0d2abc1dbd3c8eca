"""The one hash behind every key, cache name and fingerprint gac derives (:func:`digest`), a running hash for data
read in pieces (:func:`hasher`), and a file's sha256 (:func:`file_sha256`).
"""

from __future__ import annotations

import hashlib
import os

#: hex digits of a key gac derives from content (record and bench keys, cache names, recipe hashes): 64 bits
KEY_DIGITS = 16


def digest(data: str | bytes, digits: int | None = KEY_DIGITS, algorithm: str = "sha256") -> str:
    """The hex digest of ``data`` (text as UTF-8) cut to its first ``digits`` hex digits (None: all of them): the one
    hash behind every key, cache name and fingerprint gac derives. What is hashed (a canonical JSON, say) is each
    key's own definition; a name already stored keeps the length and algorithm it was written with, so it is
    still found (the kernel-table caches: sha1, 10 digits)."""
    h = hashlib.new(algorithm, data.encode() if isinstance(data, str) else data)
    return h.hexdigest() if digits is None else h.hexdigest()[:digits]


def hasher(algorithm: str = "sha256"):
    """A running hash (``update`` / ``hexdigest``) for data read in pieces (a file joined from chunks)."""
    return hashlib.new(algorithm)


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a file, read in 8 MiB chunks (weights files do not fit in memory twice)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
