"""The data files entr-jax reads: what each must hash to and where a pinned copy lives.

Every file is named by its *key*, its path inside a data folder (``gsm8k/test.jsonl``);
`entr_jax.data.files.locate` finds it (data folder, package, user cache, download) and
``entr-data`` (`entr_jax.data.cli`) fetches and lists them. The sha256 is of the file's
bytes as published (JSON lines, uncompressed); a copy whose sha256 differs is never
cached. Sources and licenses are listed in ``entr_jax/assets/data/README.md``.

Upstreams (each pinned to a commit):

* GSM8K (Cobbe et al. 2021, MIT): ``openai/grade-school-math`` on GitHub, the original
  JSON-lines files. The Hugging Face copy ``openai/gsm8k`` stores them as parquet, so its
  bytes cannot match these checksums; the GitHub files are the published ones.
* MATH-500 (Lightman et al. 2023, MIT): the Hugging Face dataset ``HuggingFaceH4/MATH-500``,
  whose ``test.jsonl`` is byte-identical to ``prm800k/math_splits/test.jsonl`` of
  ``openai/prm800k``.
* AIME 2024 and AMC 2023: the evaluation files of ``QwenLM/Qwen2.5-Math`` on GitHub
  (``evaluation/data/{aime24,amc23}/test.jsonl``), with the repository's ``main`` branch
  as a fallback; the Hub copies (``math-ai/aime24``, ``math-ai/amc23``) are parquet files
  with other fields.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Literal

HF_HUB = "https://huggingface.co"
GITHUB_RAW = "https://raw.githubusercontent.com"
ENV_GITHUB_RAW = "ENTR_GITHUB_RAW"
"""Environment variable: base URL replacing `GITHUB_RAW` (a mirror; the checksum still applies)."""


@dataclasses.dataclass(frozen=True)
class Remote:
    """A pinned upstream copy of a data file.

    Attributes:
      host: ``hf`` (a Hugging Face *dataset* repository, fetched with
        ``huggingface_hub.hf_hub_download``; ``HF_ENDPOINT`` selects a mirror) or
        ``github`` (a raw file of a GitHub repository, fetched over HTTPS with ``httpx``;
        ``$ENTR_GITHUB_RAW`` selects a mirror).
      repo: ``owner/name``.
      revision: the commit the file is read at (40 hex digits; a branch name only for a
        fallback, whose bytes the same checksum pins).
      path: the file's path inside the repository.
    """

    host: Literal["hf", "github"]
    repo: str
    revision: str
    path: str

    def url(self) -> str:
        """The URL the file is downloaded from (mirrors from the environment, read now)."""
        if self.host == "hf":
            base = os.environ.get("HF_ENDPOINT") or HF_HUB
            return f"{base.rstrip('/')}/datasets/{self.repo}/resolve/{self.revision}/{self.path}"
        base = os.environ.get(ENV_GITHUB_RAW) or GITHUB_RAW
        return f"{base.rstrip('/')}/{self.repo}/{self.revision}/{self.path}"

    def describe(self) -> str:
        """``hf:owner/name@commit:path`` or ``github:owner/name@commit:path``."""
        return f"{self.host}:{self.repo}@{self.revision}:{self.path}"


@dataclasses.dataclass(frozen=True)
class DataFile:
    """One data file.

    Attributes:
      key: path inside a data folder, e.g. ``gsm8k/test.jsonl``.
      dataset: the name ``entr-data fetch`` accepts for it (``gsm8k``, ``math500``, ...).
      rows: JSON lines in the file.
      size: bytes of the file.
      sha256: hex sha256 of the file's bytes (uncompressed).
      license: the license it is distributed under.
      remote: the pinned upstream copy.
      fallbacks: other upstream copies, tried in order when ``remote`` fails or gives
        other bytes (the same sha256 applies).
      packaged: path of a gzip copy inside ``entr_jax/assets/data`` shipped with the
        package, or None.
      packaged_sha256: hex sha256 of that gzip file (the stored bytes), or None.
    """

    key: str
    dataset: str
    rows: int
    size: int
    sha256: str
    license: str
    remote: Remote
    fallbacks: tuple[Remote, ...] = ()
    packaged: str | None = None
    packaged_sha256: str | None = None


_GSM8K = ("openai/grade-school-math", "3101c7d5072418e28b9008a6636bde82a006892c")
_QWEN_EVAL = ("QwenLM/Qwen2.5-Math", "e128aa06871c7a0eeedc2ab21b69459bcb24c4fb")
# The Qwen2.5-Math commit is a public pin of that repository's evaluation data that could
# not be resolved from an offline workspace; its default branch is the fallback.
_QWEN_MAIN = ("QwenLM/Qwen2.5-Math", "main")

FILES: dict[str, DataFile] = {
    f.key: f
    for f in (
        DataFile(
            key="gsm8k/train.jsonl", dataset="gsm8k", rows=7473, size=4_166_206,
            sha256="17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
            license="MIT",
            remote=Remote("github", *_GSM8K, "grade_school_math/data/train.jsonl"),
            packaged="gsm8k/train.jsonl.gz",
            packaged_sha256="a8df3fbbe2e2c003bce980d68e16fb03ff69fc92c306c4029d126b967c5ec53b",
        ),
        DataFile(
            key="gsm8k/test.jsonl", dataset="gsm8k", rows=1319, size=749_738,
            sha256="3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
            license="MIT",
            remote=Remote("github", *_GSM8K, "grade_school_math/data/test.jsonl"),
            packaged="gsm8k/test.jsonl.gz",
            packaged_sha256="4e82068434a2229599bc7a7de5196b4547a4c51762b01402b390735511fd280f",
        ),
        DataFile(
            key="math500/test.jsonl", dataset="math500", rows=500, size=446_564,
            sha256="35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
            license="MIT",
            remote=Remote("hf", "HuggingFaceH4/MATH-500",
                          "6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be", "test.jsonl"),
            packaged="math500/test.jsonl.gz",
            packaged_sha256="a189eda6d3efdafb3d8654f086b0b964480be73b9fd29b48b057d4d4043f254c",
        ),
        DataFile(
            key="aime24/test.jsonl", dataset="aime24", rows=30, size=156_944,
            sha256="af2b8bd2aa911b6333ad0df32f3ca05c7ae8ed10f1731f4372c8ae26990bf7ac",
            license="public competition problems (MAA AIME 2024)",
            remote=Remote("github", *_QWEN_EVAL, "evaluation/data/aime24/test.jsonl"),
            fallbacks=(Remote("github", *_QWEN_MAIN, "evaluation/data/aime24/test.jsonl"),),
            packaged="aime24/test.jsonl.gz",
            packaged_sha256="b85a29e827fdc2da05b920638daabd26eeb4129ba9c4f06dd1d4b495bc276998",
        ),
        DataFile(
            key="amc23/test.jsonl", dataset="amc23", rows=40, size=27_631,
            sha256="43707e1ca784602d8479de24ee8ce36609dbebc46dd152b0b12a46611aa898a4",
            license="public competition problems (MAA AMC 2023)",
            remote=Remote("github", *_QWEN_EVAL, "evaluation/data/amc23/test.jsonl"),
            fallbacks=(Remote("github", *_QWEN_MAIN, "evaluation/data/amc23/test.jsonl"),),
            packaged="amc23/test.jsonl.gz",
            packaged_sha256="2fb353bb0c56c90ffa8c5ceadfec75ef0c92833577da22051c4a1fab77430c77",
        ),
    )
}

DATASETS: tuple[str, ...] = tuple(dict.fromkeys(f.dataset for f in FILES.values()))
"""Dataset names in registry order: ``gsm8k``, ``math500``, ``aime24``, ``amc23``."""


def select(names: list[str] | tuple[str, ...] | None = None) -> list[DataFile]:
    """The files named by dataset names or file keys (all files when ``names`` is empty).

    Raises:
      ValueError: a name is neither a dataset nor a key; the message lists both.
    """
    if not names:
        return list(FILES.values())
    out: dict[str, DataFile] = {}
    for name in names:
        if name in FILES:
            out[name] = FILES[name]
        elif name in DATASETS:
            out.update({f.key: f for f in FILES.values() if f.dataset == name})
        else:
            raise ValueError(f"unknown data name {name!r}; datasets: {', '.join(DATASETS)}; "
                             f"files: {', '.join(FILES)}")
    return list(out.values())
