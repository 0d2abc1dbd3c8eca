"""Text sources for evaluation and calibration.

One function reads text, whatever its origin:

* ``"wikitext2"`` (aliases ``"wikitext-2"``, ``"wikitext2-raw"``, ``"Salesforce/wikitext"``): the Hugging Face hub
  dataset ``Salesforce/wikitext``, config ``wikitext-2-raw-v1``, the split asked for (``test`` for perplexity,
  ``train`` for calibration);
* ``"tiny"``: the held-out Shakespeare text shipped with the embedded ``tiny`` model (splits train, validation, test);
* ``"enwiki"``: English Wikipedia articles (the shortened 2016 dump in the ``gensim==4.4.0`` wheel's test data, markup
  stripped, split by article; built once into the user cache by :mod:`gac.fixtures.enwiki`, needs PyPI once);
* a local file: ``.txt`` (read line by line exactly as the hub's wikitext loader reads ``wiki.test.raw``: one row per
  line, whitespace-only lines become empty rows), ``.jsonl`` (one object per line with a ``"text"`` field) or
  ``.parquet`` (a ``text`` column, e.g. the hub's own ``test-00000-of-00001.parquet``).

Rows are joined with ``"\\n\\n"``, the protocol the compression papers use for WikiText-2 (GPTQ, SparseGPT, ASVD,
SVD-LLM): a local copy of ``wiki.test.raw`` gives the same text, hence the same perplexity, as the hub dataset.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

from gac import hub
from gac.errors import GacError, short_reason, unknown_name
from gac.io import missing_reason, path_kind
from gac.metrics import ENWIKI_ALIASES, TINY_ALIASES, WIKITEXT2_ALIASES

log = logging.getLogger(__name__)

WIKITEXT2_HUB = ("Salesforce/wikitext", "wikitext-2-raw-v1")
_WIKITEXT2_ALIASES = WIKITEXT2_ALIASES
_TINY_ALIASES = TINY_ALIASES
_ENWIKI_ALIASES = ENWIKI_ALIASES
SPLITS = ("train", "validation", "test")
_SUFFIXES = (".txt", ".raw", ".jsonl", ".parquet")
JOIN = "\n\n"
#: calibration by default, the ASVD / SVD-LLM protocol: 32 windows of 2048 tokens of WikiText-2's train split
CALIBRATION_SOURCE, CALIBRATION_SAMPLES, CALIBRATION_SEQ_LEN = "wikitext2", 32, 2048


def known_sources() -> list[str]:
    """The named sources :func:`load_text` accepts (besides local file paths)."""
    return [*_WIKITEXT2_ALIASES, *_TINY_ALIASES, *_ENWIKI_ALIASES]


def is_named_source(source: str) -> bool:
    return source in _WIKITEXT2_ALIASES or source in _TINY_ALIASES or source in _ENWIKI_ALIASES


def looks_like_source(x: object) -> bool:
    """True when ``x`` names a text source (a named source or a file path) rather than being the text itself."""
    if isinstance(x, os.PathLike):
        return True
    if not isinstance(x, str):
        return False
    if is_named_source(x) or (len(x) < 4096 and "\n" not in x and _is_file(x)):
        return True
    # a single token with no whitespace reads as a name or a path, never as text to score
    return len(x) < 1024 and not any(c.isspace() for c in x)


def _is_file(x: str) -> bool:
    try:
        return Path(x).expanduser().is_file()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte: not a file
        return False


def check_source(source: str | os.PathLike, split: str = "test", what: str = "text source") -> None:
    """A cheap check, before any model is loaded, that :func:`load_text` will be able to read ``source``: the hub
    answers (or holds WikiText-2 in the local cache) for ``wikitext2``; a local file exists, is a regular file and
    starts as its format says (UTF-8 text; a JSON line with ``text``; a parquet file with a ``text`` column). Reads at
    most 1 MiB."""
    s = str(source)
    if s in _TINY_ALIASES:
        return
    if s in _WIKITEXT2_ALIASES:
        why = hub.hub_unreachable()
        if why is not None and not hub.hub_dataset_cached(WIKITEXT2_HUB[0]):
            give = (lambda v: f"{what} {v}") if what.startswith("--") else (lambda v: f"{what}={v}")
            raise GacError(f"{what} {s!r} is WikiText-2 from the Hugging Face hub, which is not reachable here ({why}) "
                           f"and not in the local cache; give a local copy with {give('FILE')} (wiki.{split}.raw, its "
                           f"parquet file or a .jsonl with a 'text' field), or offline text shipped with gac: "
                           f"{give('enwiki')} (English Wikipedia) or {give('tiny')} (tiny's Shakespeare)")
        return
    path = Path(s).expanduser()
    if path.exists() and not path.is_file() and not path.is_dir():
        raise GacError(f"{what} {s!r} is not a regular file (a fifo, socket or device); pass a .txt, .jsonl or "
                       f".parquet file")
    if not path.is_file():
        load_rows(source, split)  # the missing-file, directory and unknown-name messages
        return
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 20)
    except OSError as e:
        raise GacError(f"cannot read {what} {s!r} ({e.strerror or e}); check its permissions") from None
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            names = pq.read_schema(path).names
        except Exception as e:  # noqa: BLE001 - pyarrow raises its own kinds for a file that is not parquet
            raise GacError(f"{what} {s!r} is not a readable parquet file ({type(e).__name__}); pass a .txt, .jsonl "
                           f"or .parquet file") from None
        if "text" not in names:
            raise GacError(f"{path} has no 'text' column (columns: {', '.join(names)})")
        return
    _decode(head, path, what, complete=len(head) < (1 << 20))
    if suffix == ".jsonl":
        first = next((ln for ln in head.decode("utf-8", errors="ignore").splitlines() if ln.strip()), None)
        if first is not None and (len(head) < (1 << 20) or "\n" in head.decode("utf-8", errors="ignore")):
            _jsonl_text(first, path, 1)


def _jsonl_text(line: str, path, i: int) -> str:
    """The ``"text"`` of line ``i`` of a .jsonl text file, or :class:`GacError` naming the line and the format."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise GacError(f"{path}:{i} is not valid JSON ({e.msg}); each line must be an object") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
        raise GacError(f'{path}:{i} has no string field "text"; each line must be {{"text": "..."}}')
    return obj["text"]


@contextlib.contextmanager
def _utf8(path: Path):
    """``open(path, encoding="utf-8")`` whose decoding error (a binary file, another encoding) is a GacError."""
    with open(path, encoding="utf-8") as f:
        try:
            yield f
        except UnicodeDecodeError as e:
            raise GacError(f"text file {str(path)!r} is not UTF-8 text ({e.reason} at byte {e.start} of a chunk); "
                           f"pass a text file (.txt, .jsonl or .parquet), or convert it: iconv -t UTF-8") from None


def _decode(raw: bytes, path: Path, what: str = "text file", complete: bool = True) -> str:
    """``raw`` as UTF-8, or a GacError naming the first bad byte (a binary file, another encoding)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        if not complete and e.start >= len(raw) - 3:  # a character cut by the 1 MiB read
            return raw[: e.start].decode("utf-8")
        raise GacError(f"{what} {str(path)!r} is not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r}); "
                       f"pass a text file (.txt, .jsonl or .parquet), or convert it: iconv -t UTF-8") from None


def load_rows(source: str | os.PathLike, split: str = "test") -> list[str]:
    """The rows of a text source, before joining (see the module docstring for the sources)."""
    if split not in SPLITS:
        raise unknown_name("split", split, SPLITS)
    if isinstance(source, str) and source in _WIKITEXT2_ALIASES:
        return _hub_wikitext2_rows(split)
    if isinstance(source, str) and source in _TINY_ALIASES:
        from gac.fixtures import tiny_paths

        return _file_rows(tiny_paths().wikitext[split])
    if isinstance(source, str) and source in _ENWIKI_ALIASES:
        from gac.fixtures.enwiki import enwiki_paths

        return _file_rows(enwiki_paths()[split])
    path = Path(source).expanduser()
    if path.is_file():
        return _file_rows(path)
    if path.exists() and not path.is_dir():
        raise GacError(f"text source {str(source)!r} is not a regular file (a fifo, socket or device); pass a .txt, "
                       f".jsonl or .parquet file")
    if path.is_dir():
        raise GacError(
            f"text source {str(source)!r} is a directory; pass one file (.txt, .jsonl or .parquet), e.g. "
            f"{path / 'wiki.test.raw'}"
        )
    looks_like_path = os.sep in str(source) or str(source).endswith(_SUFFIXES)
    if looks_like_path or path_kind(path):
        raise GacError(f"text file {str(source)!r} {missing_reason(path)}; check the path")
    err = unknown_name("text source", str(source), known_sources())
    raise GacError(f"{err}; or pass a path to a local .txt, .jsonl or .parquet file")


def load_text(source: str | os.PathLike, split: str = "test") -> str:
    """The text of ``source`` with its rows joined by ``"\\n\\n"`` (the WikiText-2 perplexity protocol).

    ``split`` chooses the split of a named source (``"test"`` for perplexity, ``"train"`` for calibration); a local
    file is read whole, whatever ``split`` says.
    """
    rows = load_rows(source, split)
    text = JOIN.join(rows)
    if not text.strip():
        raise GacError(
            f"text source {str(source)!r} ({split}) is empty; point at a file that holds the evaluation text "
            f"(.txt, or .jsonl with a 'text' field)"
        )
    return text


def _file_rows(path: Path) -> list[str]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows = []
        with _utf8(path) as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                rows.append(_jsonl_text(line, path, i))
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises its own kinds for a file that is not parquet
            raise GacError(f"{path} is not a readable parquet file ({type(e).__name__}); pass a .txt, .jsonl or "
                           f".parquet file") from None
        if "text" not in table.column_names:
            raise GacError(f"{path} has no 'text' column (columns: {', '.join(table.column_names)})")
        rows = [r if r is not None else "" for r in table.column("text").to_pylist()]
    else:
        # the hub's wikitext loader: one row per line, newline kept, whitespace-only lines become ""
        with _utf8(path) as f:
            rows = [line if line.strip() else "" for line in f]
    if not any(r.strip() for r in rows):
        raise GacError(
            f"text file {path} is empty; it must hold the evaluation text (.txt: raw text such as wiki.test.raw; "
            f'.jsonl: one {{"text": ...}} per line)'
        )
    return rows


def _hub_wikitext2_rows(split: str) -> list[str]:
    name, config = WIKITEXT2_HUB
    hint = (
        f"to use a local copy, download {name} ({config}) where the hub is reachable and pass the file instead of "
        f"'wikitext2': the raw text (wiki.{'valid' if split == 'validation' else split}.raw), its parquet file "
        f"({config}/{split}-00000-of-00001.parquet) or a .jsonl with a 'text' field, e.g. "
        + ("`gac compress MODEL ... --calib /path/wiki.train.raw` (a job: model.calibration_source=FILE)"
           if split == "train" else
           f"`gac evaluate MODEL --ppl --ppl-data /path/wiki.{split}.raw` (a job: model.ppl_source=FILE)")
    )
    try:
        import datasets

        ds = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # no network, offline mode, missing cache: all end here
        raise GacError(f"could not load WikiText-2 ({name}, {config}, {split}) from the hub ({short_reason(e)}); {hint}") from None
    return list(ds["text"])


def tokenize_text(tokenizer, text: str):
    """Token ids of ``text`` as one 1-D LongTensor, tokenized once (special tokens as the tokenizer adds them)."""
    import torch

    enc = tokenizer(text, return_attention_mask=False, verbose=False)
    ids = enc["input_ids"]
    return torch.tensor(ids, dtype=torch.long)


def calibration_batches(tokenizer, source: str | os.PathLike = CALIBRATION_SOURCE, n_samples: int = CALIBRATION_SAMPLES,
                        seq_len: int = CALIBRATION_SEQ_LEN, seed: int = 0, split: str = "train"):
    """``n_samples`` random windows of ``seq_len`` tokens from the calibration text, as a LongTensor ``[n, seq_len]``.

    The GPTQ / ASVD / SVD-LLM protocol: the whole split is tokenized once and each sample starts at a uniformly
    random offset (a ``torch.Generator`` seeded with ``seed``, so the same arguments give the same batches).
    """
    import torch

    if n_samples < 1 or seq_len < 1:
        raise GacError(f"calibration needs n_samples >= 1 and seq_len >= 1 (got {n_samples}, {seq_len})")
    ids = tokenize_text(tokenizer, load_text(source, split))
    if ids.numel() < seq_len + 1:
        raise GacError(
            f"calibration text {str(source)!r} ({split}) has {ids.numel()} tokens, fewer than one window of "
            f"seq_len={seq_len}; use a smaller seq_len or a longer text"
        )
    g = torch.Generator().manual_seed(int(seed))
    starts = torch.randint(0, ids.numel() - seq_len, (n_samples,), generator=g)
    batch = torch.stack([ids[s : s + seq_len] for s in starts.tolist()])
    log.debug("calibration: %d x %d tokens from %s (%s), seed %d", n_samples, seq_len, source, split, seed)
    return batch
