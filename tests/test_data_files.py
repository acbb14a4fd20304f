"""Data files that travel: the packaged GSM8K train split and benchmarks, the lookup order (data folder,
package, user cache, download), the checksum-checked download from a local stand-in for
the Hugging Face Hub and GitHub, the not-found message, and the ``entr-data`` command."""

import dataclasses
import gzip
import hashlib
import http.server
import json
import os
import pathlib
import subprocess
import sys
import threading

import pytest

from entr_jax.data import files, registry, sources
from entr_jax.data.cli import main as entr_data

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE_DATA = REPO / "entr_jax" / "assets" / "data"
TRAIN = registry.FILES["gsm8k/train.jsonl"]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No data folder, an empty private cache, downloads allowed; returns the cache path."""
    for var in ("ENTR_DATA_DIR", "ENTR_DATA_OFFLINE", "HF_HUB_OFFLINE", "HF_ENDPOINT",
                registry.ENV_GITHUB_RAW):
        monkeypatch.delenv(var, raising=False)
    cache = tmp_path / "cache"
    monkeypatch.setenv("ENTR_DATA_CACHE", str(cache))
    return cache


# ---- the packaged GSM8K training split ----------------------------------------------------


def test_packaged_gsm8k_train_checksums_rows_and_license():
    stored = PACKAGE_DATA / "gsm8k" / "train.jsonl.gz"
    raw = stored.read_bytes()
    assert len(raw) == 1_338_335 and sha(raw) == TRAIN.packaged_sha256 == (
        "a8df3fbbe2e2c003bce980d68e16fb03ff69fc92c306c4029d126b967c5ec53b")
    data = gzip.decompress(raw)
    assert len(data) == TRAIN.size == 4_166_206
    assert sha(data) == TRAIN.sha256 == "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465"
    rows = sources.read_jsonl(stored)
    assert len(rows) == TRAIN.rows == 7473 and set(rows[0]) == {"question", "answer"}
    assert rows[0]["answer"].endswith("#### 72")
    license_text = (PACKAGE_DATA / "gsm8k" / "LICENSE").read_bytes()
    assert sha(license_text) == "86bbb73e855821d7c401912fd4bf82e34313e6e3b6fd6f909f2b6cc9e209a53b"
    assert license_text.startswith(b"MIT License\n\nCopyright (c) 2021 OpenAI")


# every benchmark ships too (gsm8k test, MATH-500, AIME24, AMC23): stored bytes, original
# bytes, rows and the license or notice beside it
BENCHMARKS = {
    "gsm8k/test.jsonl": (241_754, "4e82068434a2229599bc7a7de5196b4547a4c51762b01402b390735511fd280f",
                         749_738, "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
                         1319, "gsm8k/LICENSE", b"MIT License\n\nCopyright (c) 2021 OpenAI"),
    "math500/test.jsonl": (126_014, "a189eda6d3efdafb3d8654f086b0b964480be73b9fd29b48b057d4d4043f254c",
                           446_564, "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
                           500, "math500/LICENSE", b"MIT License\n\nCopyright (c) 2023 OpenAI"),
    "aime24/test.jsonl": (44_709, "b85a29e827fdc2da05b920638daabd26eeb4129ba9c4f06dd1d4b495bc276998",
                          156_944, "af2b8bd2aa911b6333ad0df32f3ca05c7ae8ed10f1731f4372c8ae26990bf7ac",
                          30, "aime24/NOTICE", b"AIME 2024 (American Invitational Mathematics"),
    "amc23/test.jsonl": (4_980, "2fb353bb0c56c90ffa8c5ceadfec75ef0c92833577da22051c4a1fab77430c77",
                         27_631, "43707e1ca784602d8479de24ee8ce36609dbebc46dd152b0b12a46611aa898a4",
                         40, "amc23/NOTICE", b"AMC 2023 (American Mathematics Competitions"),
}


@pytest.mark.parametrize("key", sorted(BENCHMARKS))
def test_packaged_benchmark_checksums_rows_and_license(key):
    stored_size, stored_sha, size, sha256, rows, license_file, license_head = BENCHMARKS[key]
    entry = registry.FILES[key]
    assert entry.packaged == key + ".gz"
    raw = (PACKAGE_DATA / entry.packaged).read_bytes()
    assert (len(raw), sha(raw)) == (stored_size, stored_sha) and entry.packaged_sha256 == stored_sha
    data = gzip.decompress(raw)
    assert (len(data), sha(data)) == (size, sha256) == (entry.size, entry.sha256)
    assert len(sources.read_jsonl(PACKAGE_DATA / entry.packaged)) == rows == entry.rows
    assert (PACKAGE_DATA / license_file).read_bytes().startswith(license_head)


def test_assets_readme_records_the_registry_numbers():
    text = (PACKAGE_DATA / "README.md").read_text()
    for entry in registry.FILES.values():
        stored = (PACKAGE_DATA / entry.packaged).stat().st_size
        for value in (entry.sha256, entry.packaged_sha256, str(entry.size), str(entry.rows),
                      str(stored), f"`{entry.key}.gz`"):
            assert value in text, (entry.key, value)
    assert TRAIN.remote.revision in text and TRAIN.remote.repo in text


def test_every_benchmark_loads_offline_from_the_package(clean_env, monkeypatch):
    """README's test command on a fresh machine: no data folder, an empty cache, no network."""
    monkeypatch.setenv("ENTR_DATA_OFFLINE", "1")
    for key in BENCHMARKS:
        found = files.locate(key)
        assert found == files.Found(PACKAGE_DATA / (key + ".gz"), "package"), key
    assert [len(sources.load_source(name, **kw)) for name, kw in (
        ("gsm8k", {"split": "test"}), ("math500", {}), ("aime24", {}), ("amc23", {}))] == [
        1319, 500, 30, 40]
    assert not clean_env.exists()  # nothing was written to the cache


def test_quickstart_data_loads_offline_from_the_package(clean_env, monkeypatch):
    monkeypatch.setenv("ENTR_DATA_OFFLINE", "1")
    found = files.locate("gsm8k/train.jsonl")
    assert found.origin == "package" and found.path.name == "train.jsonl.gz"
    train = sources.gsm8k_arithmetic("train", max_chars=4)
    held_out = sources.gsm8k_arithmetic("eval", max_chars=4)
    assert (len(train), len(held_out)) == (1404, 153)  # the quickstart's task
    assert not clean_env.exists()  # nothing was written to the cache


# ---- lookup order ----------------------------------------------------------------------------


def test_data_folder_first_then_package(clean_env, monkeypatch, tmp_path):
    env_dir, arg_dir = tmp_path / "env", tmp_path / "arg"
    for d, n in ((env_dir, 3), (arg_dir, 2)):
        (d / "gsm8k").mkdir(parents=True)
        (d / "gsm8k" / "train.jsonl").write_bytes(
            jsonl({"question": f"q{i}", "answer": f"<<1+{i}={1 + i}>> #### {i}"} for i in range(n)))
    monkeypatch.setenv("ENTR_DATA_DIR", str(env_dir))
    assert files.locate("gsm8k/train.jsonl") == files.Found(env_dir / "gsm8k" / "train.jsonl", "dir")
    assert len(sources.load_gsm8k("train")) == 3
    assert files.locate("gsm8k/train.jsonl", arg_dir).origin == "dir"  # --data.dir beats the env
    assert len(sources.load_source("gsm8k", split="train", data_dir=arg_dir)) == 2
    assert [e["question"] for e in sources.load_source("gsm8k_arithmetic", data_dir=arg_dir)] == ["1+0", "1+1"]
    # a folder without the file: the package comes next
    (tmp_path / "empty").mkdir()
    assert files.locate("gsm8k/train.jsonl", tmp_path / "empty").origin == "package"
    # a folder that does not exist (a typo) is refused, not read as "no file there"
    with pytest.raises(files.DataNotFoundError,
                       match="missing \\(--data.dir\\) is not a directory"):
        files.locate("gsm8k/train.jsonl", tmp_path / "missing")


@pytest.fixture
def toy(monkeypatch):
    """A registry entry ``toy/test.jsonl`` (2 rows) served by the stand-in hub."""
    data = jsonl([{"problem": "1+1", "answer": "2"}, {"problem": "2+3", "answer": "5"}])
    entry = registry.DataFile(
        key="toy/test.jsonl", dataset="toy", rows=2, size=len(data), sha256=sha(data),
        license="MIT", remote=registry.Remote("hf", "entr-test/toy", "a" * 40, "data/test.jsonl"))
    monkeypatch.setitem(registry.FILES, entry.key, entry)
    monkeypatch.setattr(registry, "DATASETS", registry.DATASETS + ("toy",))
    return entry, data


def test_cache_used_only_when_its_checksum_matches(clean_env, monkeypatch, toy):
    entry, data = toy
    monkeypatch.setenv("ENTR_DATA_OFFLINE", "1")
    cached = clean_env / "toy" / "test.jsonl"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(data)
    assert files.locate("toy/test.jsonl") == files.Found(cached, "cache")
    cached.write_bytes(data.replace(b"5", b"6"))
    with pytest.raises(files.DataNotFoundError) as e:
        files.locate("toy/test.jsonl")
    assert f"has sha256 {sha(data.replace(b'5', b'6'))}, expected {entry.sha256}" in str(e.value)


def test_not_found_names_the_variable_the_cache_and_the_command(clean_env, monkeypatch, tmp_path,
                                                               unpackaged):
    unpackaged("math500/test.jsonl", "aime24/test.jsonl")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError) as e:  # DataNotFoundError is a FileNotFoundError
        sources.load_math500()
    msg = str(e.value)
    for part in ("'math500/test.jsonl'", "ENTR_DATA_DIR", "--data.dir",
                 str(clean_env / "math500" / "test.jsonl"), "`entr-data fetch math500`",
                 "entr-data fetch math500 --dir DIR", "download: skipped",
                 "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132"):
        assert part in msg, part
    with pytest.raises(files.DataNotFoundError, match=r"data folder \(--data.dir\): .*aime24/test.jsonl does not exist"):
        sources.load_aime24(data_dir=tmp_path)


# ---- a local stand-in for the Hugging Face Hub and raw.githubusercontent.com ---------------


class Hub:
    """Serves ``{url path: bytes}`` over HTTP; HEAD answers with the Hub's metadata headers."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, body: bool):
                path = self.path.split("?")[0]
                hub.requests.append((self.command, path))
                data = hub.files.get(path)
                if data is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("ETag", f'"{sha(data)}"')
                self.send_header("X-Repo-Commit", "a" * 40)
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def do_HEAD(self):
                self._answer(body=False)

            def do_GET(self):
                self._answer(body=True)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def serve(self, remote: registry.Remote, data: bytes) -> None:
        prefix = f"/datasets/{remote.repo}/resolve" if remote.host == "hf" else f"/{remote.repo}"
        self.files[f"{prefix}/{remote.revision}/{remote.path}"] = data


@pytest.fixture
def hub(clean_env, monkeypatch):
    h = Hub()
    h.thread.start()
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.setenv(registry.ENV_GITHUB_RAW, h.url)
    yield h
    h.server.shutdown()
    h.server.server_close()


def test_hf_download_checked_into_cache_then_reused(hub, clean_env, toy):
    entry, data = toy
    hub.serve(entry.remote, data)
    found = files.locate("toy/test.jsonl")
    assert found == files.Found(clean_env / "toy" / "test.jsonl", "download")
    assert found.path.read_bytes() == data
    file_url = "/datasets/entr-test/toy/resolve/" + "a" * 40 + "/data/test.jsonl"
    assert [r for r in hub.requests if r[1] == file_url] == [("HEAD", file_url), ("GET", file_url)]
    n = len(hub.requests)
    assert files.locate("toy/test.jsonl").origin == "cache" and len(hub.requests) == n
    assert sorted(p.name for p in (clean_env / "toy").iterdir()) == ["test.jsonl"]  # no temp left


def test_github_download_of_the_real_pin(hub, clean_env):
    entry = dataclasses.replace(TRAIN, packaged=None, packaged_sha256=None)  # force a download
    hub.serve(entry.remote, gzip.decompress((PACKAGE_DATA / TRAIN.packaged).read_bytes()))
    path = files.fetch(entry, clean_env)
    assert path == clean_env / "gsm8k" / "train.jsonl" and files.sha256_of(path) == TRAIN.sha256
    assert hub.requests == [("GET", "/openai/grade-school-math/3101c7d5072418e28b9008a6636bde82a006892c"
                                    "/grade_school_math/data/train.jsonl")]


@pytest.mark.parametrize("host", ["hf", "github"])
def test_checksum_mismatch_is_refused_and_nothing_cached(hub, clean_env, toy, monkeypatch, host):
    entry, data = toy
    entry = dataclasses.replace(entry, remote=dataclasses.replace(entry.remote, host=host))
    monkeypatch.setitem(registry.FILES, entry.key, entry)
    tampered = data.replace(b"2+3", b"2+4")
    hub.serve(entry.remote, tampered)
    with pytest.raises(files.FetchError) as e:
        files.fetch(entry, clean_env)
    assert str(e.value) == (
        f"toy/test.jsonl: refused, nothing was cached; tried {entry.remote.describe()} "
        f"({entry.remote.url()}): does not match its pin: got sha256 {sha(tampered)} "
        f"({len(tampered)} bytes), expected {entry.sha256} ({len(data)} bytes)")
    assert not (clean_env / "toy" / "test.jsonl").exists()
    assert list((clean_env / "toy").iterdir()) == []  # the temporary copy is gone too
    with pytest.raises(files.DataNotFoundError, match="does not match its pin"):
        files.locate("toy/test.jsonl")


def test_download_failure_is_reported_with_the_source(hub, clean_env, toy):
    entry, _ = toy  # not served: the hub answers 404
    with pytest.raises(files.DataNotFoundError) as e:
        files.locate("toy/test.jsonl")
    msg = str(e.value)
    assert ("download: toy/test.jsonl: refused, nothing was cached; tried hf:entr-test/toy@"
            + "a" * 40 + ":data/test.jsonl (" + hub.url) in msg
    assert "download failed: " in msg
    assert "`entr-data fetch toy`" in msg and str(clean_env) in msg


@pytest.mark.parametrize("pinned_serves", [None, b"other bytes\n"])
def test_fallback_source_when_the_pinned_one_fails(hub, clean_env, toy, pinned_serves):
    entry, data = toy
    pinned = registry.Remote("github", "entr-test/toy", "b" * 40, "test.jsonl")
    fallback = registry.Remote("github", "entr-test/toy", "main", "test.jsonl")
    entry = dataclasses.replace(entry, remote=pinned, fallbacks=(fallback,))
    if pinned_serves is not None:
        hub.serve(pinned, pinned_serves)  # reachable, but other bytes: refused, next source
    hub.serve(fallback, data)
    assert files.fetch(entry, clean_env).read_bytes() == data
    assert hub.requests == [("GET", "/entr-test/toy/" + "b" * 40 + "/test.jsonl"),
                            ("GET", "/entr-test/toy/main/test.jsonl")]


# ---- the registry's pins ------------------------------------------------------------------


def test_registry_pins(clean_env, monkeypatch):
    assert registry.DATASETS == ("gsm8k", "math500", "aime24", "amc23")
    expected = {
        "gsm8k/train.jsonl": ("https://raw.githubusercontent.com/openai/grade-school-math/3101c7d5072418e28b9008a6636bde82a006892c/grade_school_math/data/train.jsonl", 7473),
        "gsm8k/test.jsonl": ("https://raw.githubusercontent.com/openai/grade-school-math/3101c7d5072418e28b9008a6636bde82a006892c/grade_school_math/data/test.jsonl", 1319),
        "math500/test.jsonl": ("https://huggingface.co/datasets/HuggingFaceH4/MATH-500/resolve/6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be/test.jsonl", 500),
        "aime24/test.jsonl": ("https://raw.githubusercontent.com/QwenLM/Qwen2.5-Math/e128aa06871c7a0eeedc2ab21b69459bcb24c4fb/evaluation/data/aime24/test.jsonl", 30),
        "amc23/test.jsonl": ("https://raw.githubusercontent.com/QwenLM/Qwen2.5-Math/e128aa06871c7a0eeedc2ab21b69459bcb24c4fb/evaluation/data/amc23/test.jsonl", 40),
    }
    assert {k: (f.remote.url(), f.rows) for k, f in registry.FILES.items()} == expected
    assert {k: [r.url() for r in f.fallbacks] for k, f in registry.FILES.items() if f.fallbacks} == {
        "aime24/test.jsonl": ["https://raw.githubusercontent.com/QwenLM/Qwen2.5-Math/main/evaluation/data/aime24/test.jsonl"],
        "amc23/test.jsonl": ["https://raw.githubusercontent.com/QwenLM/Qwen2.5-Math/main/evaluation/data/amc23/test.jsonl"],
    }
    assert all(len(f.sha256) == 64 and len(f.remote.revision) == 40 for f in registry.FILES.values())
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.example/")
    assert registry.FILES["math500/test.jsonl"].remote.url().startswith("http://mirror.example/datasets/")
    assert [f.key for f in registry.select(["gsm8k"])] == ["gsm8k/train.jsonl", "gsm8k/test.jsonl"]
    assert [f.key for f in registry.select(["amc23/test.jsonl", "amc23"])] == ["amc23/test.jsonl"]
    with pytest.raises(ValueError, match="unknown data name 'mat500'; datasets: gsm8k, math500"):
        registry.select(["mat500"])


@pytest.mark.skipif(not os.environ.get("ENTR_DATA_DIR"), reason="needs ENTR_DATA_DIR (CI sets it)")
def test_reference_copy_matches_every_pin():
    """The reference copy CI points ENTR_DATA_DIR at holds exactly the pinned bytes."""
    for entry in registry.FILES.values():
        path = pathlib.Path(os.environ["ENTR_DATA_DIR"]) / entry.key
        assert files.sha256_of(path) == entry.sha256 and path.stat().st_size == entry.size, entry.key
        assert len(sources.read_jsonl(path)) == entry.rows, entry.key


# ---- entr-data --------------------------------------------------------------------------------


def test_entr_data_fetch_and_list(hub, clean_env, toy, tmp_path, capsys, unpackaged):
    unpackaged("math500/test.jsonl")
    entry, data = toy
    hub.serve(entry.remote, data)
    folder = tmp_path / "prefetched"
    assert entr_data(["fetch", "toy", "gsm8k/train.jsonl", "--dir", str(folder)]) == 0
    assert (folder / "toy" / "test.jsonl").read_bytes() == data
    assert files.sha256_of(folder / "gsm8k" / "train.jsonl") == TRAIN.sha256  # unpacked from the package
    out = capsys.readouterr().out
    assert f"toy/test.jsonl: {folder / 'toy' / 'test.jsonl'} (2 rows, sha256 {entry.sha256} ok)" in out
    assert entr_data(["fetch", "gsm8k/train.jsonl"]) == 0  # to the cache: nothing to do
    assert "ships with the package" in capsys.readouterr().out and not clean_env.exists()
    assert entr_data(["fetch", "toy"]) == 0 and (clean_env / "toy" / "test.jsonl").is_file()
    capsys.readouterr()

    changed = data + b"\n"
    (folder / "toy" / "test.jsonl").write_bytes(changed)  # the folder's copy now differs
    assert entr_data(["list", "--dir", str(folder)]) == 1  # math500 missing / toy differs
    out = capsys.readouterr().out
    assert f"user cache:  {clean_env}" in out
    assert f"  user cache: {clean_env / 'toy' / 'test.jsonl'}\n    sha256 {entry.sha256} ok" in out
    assert f"sha256 {sha(changed)} DIFFERS from the pin" in out
    assert f"  package: {PACKAGE_DATA / 'gsm8k' / 'train.jsonl.gz'}\n    sha256 {TRAIN.sha256} ok" in out
    assert "  missing: `entr-data fetch math500` downloads it from hf:HuggingFaceH4/MATH-500@" in out


def test_entr_data_fetch_failure_exits_1(hub, clean_env, toy, capsys):
    entry, data = toy
    hub.serve(entry.remote, data[:-1])
    assert entr_data(["fetch", "toy"]) == 1
    assert "toy/test.jsonl: FAILED:" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        entr_data(["fetch", "nope"])
    assert e.value.code == 2


def test_python_dash_m_entr_jax_data(clean_env, tmp_path):
    env = {**os.environ, "ENTR_DATA_CACHE": str(tmp_path / "c"), "PYTHONPATH": str(REPO)}
    env.pop("ENTR_DATA_DIR", None)
    out = subprocess.run([sys.executable, "-m", "entr_jax.data", "list"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr  # every file ships with the package
    for entry in registry.FILES.values():
        assert (f"{entry.key} ({entry.rows} rows) pinned sha256 {entry.sha256}\n  package: "
                f"{PACKAGE_DATA / entry.packaged}\n    sha256 {entry.sha256} ok") in out.stdout


# ---- --data.dir reaches the task ------------------------------------------------------------


def test_data_dir_flag_reaches_the_task(clean_env, monkeypatch, tmp_path):
    from experiments.run.cli import parse
    from experiments.run.tasks import build_task

    cfg, _ = parse(["quickstart", "--data.dir", str(tmp_path)])
    assert cfg.data.dir == str(tmp_path)
    assert parse(["quickstart"])[0].data.dir == ""
    (tmp_path / "gsm8k").mkdir()
    for split, n in (("train", 3), ("test", 2)):
        (tmp_path / "gsm8k" / f"{split}.jsonl").write_bytes(
            jsonl({"question": f"{split} {i}", "answer": f"#### {i}"} for i in range(n)))
    spec = dataclasses.replace(cfg.task, name="gsm8k", template="chat", eval_examples=0)
    bundle = build_task(spec, data_dir=cfg.data.dir)
    assert [e["question"] for e in bundle.train] == ["train 0", "train 1", "train 2"]
    assert [e["answer"] for e in bundle.eval_sets["gsm8k"]] == ["0", "1"]
    monkeypatch.setenv("ENTR_DATA_OFFLINE", "1")  # a file the folder lacks: the package's copy
    assert files.locate("math500/test.jsonl", cfg.data.dir).origin == "package"
