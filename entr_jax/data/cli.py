"""``entr-data``: fetch the benchmark files ahead of time and list where each is found.

::

    entr-data fetch [NAMES ...] [--dir DIR] [--force]
    entr-data list [--dir DIR]

``NAMES`` are dataset names (``gsm8k``, ``math500``, ``aime24``, ``amc23``) or file keys
(``gsm8k/test.jsonl``); none means all. ``fetch`` downloads every named file from its
pinned upstream, checks its sha256 and puts it into the user cache, or with ``--dir``
into ``DIR/<key>`` (then use ``ENTR_DATA_DIR=DIR`` or ``--data.dir DIR``: the way to
prepare data on a login node for compute nodes without internet). Files that ship with
the package are written only with ``--dir`` (so that folder is complete). ``list`` prints,
for every file and every place it is present (data folder, package, user cache), the
path, its sha256 and whether that matches the pin. Exit status 1 when a fetch failed or
(``list``) a file is present nowhere or differs from its pin. Also runnable as
``python -m entr_jax.data``.
"""

from __future__ import annotations

import argparse
import sys

from entr_jax.data import files
from entr_jax.data.registry import DATASETS, FILES, DataFile, select


def _fetch(entries: list[DataFile], folder: str | None, force: bool) -> int:
    status = 0
    root = folder if folder else files.cache_dir()
    for entry in entries:
        packaged = files.packaged_path(entry)
        if folder is None and packaged is not None and packaged.is_file():
            print(f"{entry.key}: ships with the package ({packaged}); nothing to fetch")
            continue
        try:
            path = files.fetch(entry, root, force=force)
        except files.FetchError as e:
            print(f"{entry.key}: FAILED: {e}", file=sys.stderr)
            status = 1
            continue
        print(f"{entry.key}: {path} ({entry.rows} rows, sha256 {entry.sha256} ok)")
    return status


def _places(entry: DataFile, folder: str | None) -> list[tuple[str, object, bool]]:
    """``(place, path, compressed)`` for every place that holds ``entry``."""
    out = []
    data_folder = files.data_folder(folder)
    if data_folder is not None and (data_folder / entry.key).is_file():
        out.append(("data folder", data_folder / entry.key, False))
    packaged = files.packaged_path(entry)
    if packaged is not None and packaged.is_file():
        out.append(("package", packaged, True))
    cached = files.cache_dir() / entry.key
    if cached.is_file():
        out.append(("user cache", cached, False))
    return out


def _list(folder: str | None) -> int:
    data_folder = files.data_folder(folder)
    print(f"data folder: {data_folder if data_folder is not None else 'not set'}"
          f"{'' if folder else ' (ENTR_DATA_DIR)'}")
    print(f"user cache:  {files.cache_dir()}")
    status = 0
    for entry in FILES.values():
        places = _places(entry, folder)
        print(f"{entry.key} ({entry.rows} rows) pinned sha256 {entry.sha256}")
        if not places:
            print(f"  missing: `{files.fetch_command(entry)}` downloads it from {entry.remote.describe()}")
            status = 1
        for place, path, compressed in places:
            actual = files.sha256_of(path, decompress=compressed)
            ok = actual == entry.sha256
            status |= 0 if ok else 1
            print(f"  {place}: {path}\n    sha256 {actual} {'ok' if ok else 'DIFFERS from the pin'}")
    return status


def main(argv: list[str] | None = None) -> int:
    """Runs ``entr-data``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="entr-data", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help="download files (checksum-checked) into the cache or --dir")
    p_fetch.add_argument("names", nargs="*", metavar="NAME",
                         help=f"dataset ({', '.join(DATASETS)}) or file key; default: all")
    p_fetch.add_argument("--dir", default=None, help="write DIR/<key> instead of the user cache")
    p_fetch.add_argument("--force", action="store_true", help="download even when a verified copy exists")
    p_list = sub.add_parser("list", help="where each file is found, with its sha256")
    p_list.add_argument("--dir", default=None, help="data folder to inspect (default: $ENTR_DATA_DIR)")
    args = parser.parse_args(argv)
    if args.command == "fetch":
        try:
            entries = select(args.names)
        except ValueError as e:
            parser.error(str(e))
        return _fetch(entries, args.dir, args.force)
    return _list(args.dir)


if __name__ == "__main__":
    sys.exit(main())
