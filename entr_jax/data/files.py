"""Where a data file is found: data folder, package, user cache, or a checked download.

`locate` looks for a file by its key (``gsm8k/test.jsonl``, see `entr_jax.data.registry`)
in this order and returns the first hit:

1. the **data folder**: the ``data_dir`` argument (``--data.dir``) or else
   ``$ENTR_DATA_DIR``, as ``<folder>/<key>``. Used as found (a folder you point at is
   yours: ``entr-data list`` reports whether its files match the pinned checksums);
2. the **package**: files shipped gzip-compressed in ``entr_jax/assets/data`` (the GSM8K
   training split the quickstart derives its task from, and the four benchmarks);
3. the **user cache**: ``$ENTR_DATA_CACHE`` or else the platform cache folder
   (``platformdirs.user_cache_path("entr-jax") / "data"``; on Linux
   ``$XDG_CACHE_HOME/entr-jax/data``, default ``~/.cache/entr-jax/data``), used when its
   sha256 matches the pin;
4. a **download** of the pinned upstream copy (then of its fallbacks, if any) into the
   user cache: the bytes are written to a temporary file, checked against the pinned
   sha256 and size, and only then moved into place (a mismatch is refused and nothing is
   cached). Skipped when
   ``$ENTR_DATA_OFFLINE`` or ``$HF_HUB_OFFLINE`` is set to 1/true/yes/on.

When all four fail, `DataNotFoundError` (a ``FileNotFoundError``) names, in its first
line, the ``entr-data fetch`` command that fills the cache (or a folder, with ``--dir``) on
a machine with internet, ``--data.dir`` / ``ENTR_DATA_DIR`` and the cache path, then says
what was tried. A data folder that is set but is not a directory is refused (a mistyped
path must not quietly switch to other data).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import pathlib
import shutil
import tempfile
from typing import Literal

from entr_jax.data.registry import FILES, DataFile

ENV_DATA_DIR = "ENTR_DATA_DIR"
ENV_CACHE = "ENTR_DATA_CACHE"
ENV_OFFLINE = "ENTR_DATA_OFFLINE"
_TRUE = {"1", "true", "yes", "on"}
_PACKAGE_DATA = pathlib.Path(__file__).resolve().parents[1] / "assets" / "data"

Origin = Literal["dir", "package", "cache", "download"]


class DataNotFoundError(FileNotFoundError):
    """A data file is in none of the places `locate` looks, and could not be downloaded."""


class FetchError(RuntimeError):
    """A download failed or its bytes did not match the pinned checksum (nothing cached)."""


@dataclasses.dataclass(frozen=True)
class Found:
    """Where `locate` found a file: ``path`` (a ``.gz`` path for packaged files) and
    ``origin`` (``dir``, ``package``, ``cache`` or ``download``)."""

    path: pathlib.Path
    origin: Origin


def data_folder(data_dir: str | os.PathLike | None = None) -> pathlib.Path | None:
    """The data folder: ``data_dir`` when given and non-empty, else ``$ENTR_DATA_DIR``
    when set and non-empty, else None."""
    if data_dir:
        return pathlib.Path(data_dir)
    env = os.environ.get(ENV_DATA_DIR)
    return pathlib.Path(env) if env else None


def cache_dir() -> pathlib.Path:
    """The user cache folder of data files (``$ENTR_DATA_CACHE`` or the platform's)."""
    env = os.environ.get(ENV_CACHE)
    if env:
        return pathlib.Path(env)
    import platformdirs

    return platformdirs.user_cache_path("entr-jax") / "data"


def offline() -> bool:
    """True when ``$ENTR_DATA_OFFLINE`` or ``$HF_HUB_OFFLINE`` is 1/true/yes/on."""
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in (ENV_OFFLINE, "HF_HUB_OFFLINE"))


def packaged_path(entry: DataFile) -> pathlib.Path | None:
    """Path of the packaged gzip copy of ``entry``, or None when it has none."""
    return None if entry.packaged is None else _PACKAGE_DATA / entry.packaged


def sha256_of(path: str | os.PathLike, decompress: bool = False) -> str:
    """Hex sha256 of a file's bytes (of its gunzipped content with ``decompress``)."""
    h = hashlib.sha256()
    opener = gzip.open if decompress else open
    with opener(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_command(entry: DataFile) -> str:
    """The shell command that puts ``entry`` into the user cache."""
    return f"entr-data fetch {entry.dataset}"


def locate(key: str, data_dir: str | os.PathLike | None = None, download: bool = True) -> Found:
    """Finds data file ``key`` (see the module docstring for the order).

    Args:
      key: path inside a data folder, e.g. ``"math500/test.jsonl"``; a key the registry
        does not know is looked up in the data folder only.
      data_dir: the data folder (``--data.dir``); None or empty: ``$ENTR_DATA_DIR``.
      download: try the pinned download when the file is nowhere else.

    Returns:
      `Found`; read it with `entr_jax.data.sources.read_jsonl` (handles ``.gz``).

    Raises:
      DataNotFoundError: the data folder is set but not a directory; or the file is not
        found and not downloaded: the message's first line names the fetch command,
        ``--data.dir`` / ``ENTR_DATA_DIR`` and the cache path, then lists every place tried.
    """
    tried: list[str] = []
    folder = data_folder(data_dir)
    if folder is not None:
        how = "--data.dir" if data_dir else ENV_DATA_DIR
        if not folder.is_dir():  # a typo must not quietly switch to other data
            raise DataNotFoundError(
                f"the data folder {folder} ({how}) is not a directory: fix the path, or "
                f"{'leave out --data.dir' if data_dir else f'unset {ENV_DATA_DIR}'} to read "
                "the packaged and cached files")
        path = folder / key
        if path.is_file():
            return Found(path, "dir")
        tried.append(f"data folder ({how}): {path} does not exist")
    else:
        tried.append(f"data folder: not set (--data.dir DIR or {ENV_DATA_DIR}=DIR)")
    entry = FILES.get(key)
    if entry is None:
        raise DataNotFoundError(
            f"data file {key!r} not found and not a known file (known: {', '.join(FILES)}); "
            + "; ".join(tried))
    packaged = packaged_path(entry)
    if packaged is not None and packaged.is_file():
        return Found(packaged, "package")
    cached = cache_dir() / key
    if cached.is_file():
        actual = sha256_of(cached)
        if actual == entry.sha256:
            return Found(cached, "cache")
        tried.append(f"user cache: {cached} has sha256 {actual}, expected {entry.sha256} "
                     "(a download replaces it)")
    else:
        tried.append(f"user cache: {cached} does not exist")
    if not download:
        tried.append("download: not attempted")
    elif offline():
        tried.append(f"download: skipped ({ENV_OFFLINE} or HF_HUB_OFFLINE is set)")
    else:
        try:
            return Found(fetch(entry, cache_dir()), "download")
        except FetchError as e:
            tried.append(f"download: {e}")
    raise DataNotFoundError(_not_found_message(entry, tried))


def _not_found_message(entry: DataFile, tried: list[str]) -> str:
    lines = [f"data file {entry.key!r} ({entry.rows} rows, sha256 {entry.sha256}) was not "
             f"found: run `{fetch_command(entry)}` on a machine with internet (it fills the "
             f"user cache {cache_dir()}), or pass --data.dir DIR / set {ENV_DATA_DIR}=DIR to a "
             f"folder holding {entry.key}."]
    lines += [f"  tried {t}" for t in tried]
    lines += [
        "  fix, one of:",
        f"  - on a machine with internet: `{fetch_command(entry)}` (fills the user cache "
        f"{cache_dir()}), or `{fetch_command(entry)} --dir DIR` and then "
        f"{ENV_DATA_DIR}=DIR or --data.dir DIR on the machine that trains;",
        f"  - copy the file to DIR/{entry.key} and set {ENV_DATA_DIR}=DIR or pass --data.dir DIR.",
    ]
    return "\n".join(lines)


def fetch(entry: DataFile, root: str | os.PathLike, force: bool = False) -> pathlib.Path:
    """Puts a verified copy of ``entry`` at ``<root>/<key>`` and returns that path.

    A present file whose sha256 matches is kept (unless ``force``). A packaged file is
    decompressed from the package; any other is downloaded from ``entry.remote``, then
    from each of ``entry.fallbacks``, into a temporary file next to the destination,
    checked (size and sha256) and moved into place atomically; the first source that
    gives the pinned bytes wins.

    Raises:
      FetchError: no source gave the pinned bytes (the message lists each source with
        the failure or both checksums); nothing is written to ``<root>/<key>``.
    """
    dest = pathlib.Path(root) / entry.key
    if dest.is_file() and not force and sha256_of(dest) == entry.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    packaged = packaged_path(entry)
    sources = [None] if packaged is not None and packaged.is_file() else [entry.remote, *entry.fallbacks]
    errors = []
    for source in sources:
        where = f"the package ({packaged})" if source is None else f"{source.describe()} ({source.url()})"
        with tempfile.TemporaryDirectory(prefix=".entr-fetch-", dir=dest.parent) as tmp:
            try:
                got = _retrieve(entry, source, pathlib.Path(tmp))
            except Exception as e:  # any transport/hub error: recorded, next source
                errors.append(f"{where}: download failed: {type(e).__name__}: {e}")
                continue
            size, actual = got.stat().st_size, sha256_of(got)
            if actual == entry.sha256 and size == entry.size:
                os.replace(got, dest)
                return dest
            errors.append(f"{where}: does not match its pin: got sha256 {actual} ({size} bytes), "
                          f"expected {entry.sha256} ({entry.size} bytes)")
    raise FetchError(f"{entry.key}: refused, nothing was cached; tried " + "; ".join(errors))


def _retrieve(entry: DataFile, source, tmp: pathlib.Path) -> pathlib.Path:
    """The file's bytes from ``source`` (a `Remote`, or None: the package) in a new file
    under ``tmp`` (unverified)."""
    out = tmp / "file"
    if source is None:
        with gzip.open(packaged_path(entry), "rb") as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
        return out
    if source.host == "hf":
        from huggingface_hub import hf_hub_download

        return pathlib.Path(hf_hub_download(
            source.repo, source.path, repo_type="dataset", revision=source.revision,
            local_dir=tmp / "hf", endpoint=os.environ.get("HF_ENDPOINT") or None))
    import httpx

    with httpx.stream("GET", source.url(), follow_redirects=True,
                      timeout=httpx.Timeout(60.0, connect=10.0)) as response:
        response.raise_for_status()
        with open(out, "wb") as f:
            for chunk in response.iter_bytes():
                f.write(chunk)
    return out
