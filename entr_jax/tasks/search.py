"""Local search task: a BM25 index over a seeded, procedurally generated multi-hop corpus.

A small, offline stand-in for BrowseComp-Plus-style browsing. `make_corpus(seed)` invents
regions, cities, people and companies whose attributes chain (company -> founder ->
birth city -> region), writes one document per entity, and asks questions that need
2-3 hops, e.g. "In which city was the founder of Zorvex Labs born?".

Tools (syntax of `entr_jax.tasks.env`): ``<search>QUERY</search>`` returns the top-k
documents as lines ``[doc_id] title: snippet``; ``<open>DOC_ID</open>`` returns a full
document. The final answer is ``\\boxed{NAME}`` (or ``#### NAME``); reward 1 when it equals
the gold name after lower-casing and removing everything but letters and digits.
"""

from __future__ import annotations

import dataclasses
import random
import re
from typing import Any

from entr_jax.data.templates import PromptTemplate
from entr_jax.tasks.env import ToolEnv, ToolError
from entr_jax.tasks.rewards import extract_answer

SEARCH_INSTRUCTION = (
    "Use the tools to find the answer. <search>QUERY</search> searches the documents; "
    "<open>DOC_ID</open> shows one document. Give the final answer as \\boxed{NAME}."
)
_SYLLABLES = ("ka", "lo", "mi", "ren", "tor", "vex", "zan", "qui", "bel", "dra", "fen",
              "gor", "hal", "ith", "jun", "mor", "nes", "pra", "sol", "tek", "ul", "wyn")
_WORD_RE = re.compile(r"[a-z0-9]+")


@dataclasses.dataclass(frozen=True)
class Document:
    """A corpus entry: ``doc_id`` (``"doc-<i>"``), ``title`` and ``text``."""

    doc_id: str
    title: str
    text: str


def _unique_name(rng: random.Random, used: set[str], parts: int) -> str:
    while True:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()
        if name not in used:
            used.add(name)
            return name


def make_corpus(
    seed: int, num_regions: int = 4, num_cities: int = 12, num_people: int = 20,
    num_companies: int = 16,
) -> tuple[list[Document], list[dict[str, Any]]]:
    """Generates ``(documents, examples)`` deterministically from ``seed``.

    Examples have ``id``, ``question``, ``answer`` (an entity name), ``hops`` (2 or 3) and
    ``source="local_search"``; there are ``2 * num_companies`` of them.
    """
    for name, value in (("num_regions", num_regions), ("num_cities", num_cities),
                        ("num_people", num_people), ("num_companies", num_companies)):
        if value < 1:
            raise ValueError(f"make_corpus: {name} must be >= 1, got {value}")
    rng = random.Random(seed)
    used: set[str] = set()
    regions = [_unique_name(rng, used, 2) + " Province" for _ in range(num_regions)]
    cities = [(_unique_name(rng, used, 3), rng.choice(regions)) for _ in range(num_cities)]
    professions = ("chemist", "sailor", "architect", "painter", "engineer", "teacher")
    people = [
        (_unique_name(rng, used, 2) + " " + _unique_name(rng, used, 3), rng.choice(cities)[0],
         rng.choice(professions), rng.randrange(1900, 1990))
        for _ in range(num_people)
    ]
    companies = [
        (_unique_name(rng, used, 2) + " Labs", rng.choice(people)[0], rng.choice(cities)[0],
         rng.randrange(1950, 2020))
        for _ in range(num_companies)
    ]
    region_of = dict(cities)
    birth_city = {p[0]: p[1] for p in people}
    docs: list[Document] = []
    for region in regions:
        members = sorted(c for c, r in cities if r == region)
        text = f"{region} is a province. Its cities include {', '.join(members) or 'none'}."
        docs.append(Document("", region, text))
    for city, region in cities:
        docs.append(Document("", city, f"{city} is a city in {region}."))
    for name, city, job, year in people:
        docs.append(Document("", name, f"{name} was a {job} born in {city} in {year}."))
    for company, founder, hq, year in companies:
        text = f"{company} was founded by {founder} in {year}. Its headquarters are in {hq}."
        docs.append(Document("", company, text))
    rng.shuffle(docs)
    docs = [dataclasses.replace(d, doc_id=f"doc-{i}") for i, d in enumerate(docs)]
    examples = []
    for i, (company, founder, hq, _) in enumerate(companies):
        examples.append({
            "id": f"search/{seed}/{2 * i}", "question":
            f"In which city was the founder of {company} born?",
            "answer": birth_city[founder], "hops": 2, "source": "local_search"})
        examples.append({
            "id": f"search/{seed}/{2 * i + 1}", "question":
            f"In which province was the founder of {company} born?",
            "answer": region_of[birth_city[founder]], "hops": 3, "source": "local_search"})
    return docs, examples


def _words(text: str) -> list[str]:
    return _WORD_RE.findall(text.lower())


class BM25Index:
    """BM25 (Okapi, ``rank_bm25``) over ``title + text`` of the documents (lower-case words)."""

    def __init__(self, documents: list[Document], snippet_chars: int = 80):
        from rank_bm25 import BM25Okapi

        if not documents:
            raise ValueError("BM25Index: documents must not be empty")
        self.documents = list(documents)
        self.by_id = {d.doc_id: d for d in self.documents}
        if len(self.by_id) != len(self.documents):
            raise ValueError("BM25Index: doc_id values must be unique")
        self.snippet_chars = snippet_chars
        self._bm25 = BM25Okapi([_words(d.title + " " + d.text) for d in self.documents])

    def search_ids(self, query: str, k: int) -> list[str]:
        """The ``k`` best doc ids (score descending, ties by corpus order)."""
        words = _words(query)
        if not words:
            raise ToolError("empty search query")
        scores = self._bm25.get_scores(words)
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        return [self.documents[i].doc_id for i in order[:k]]

    def search(self, query: str, k: int = 3) -> str:
        """Tool output: one line ``[doc_id] title: snippet`` per hit."""
        lines = []
        for doc_id in self.search_ids(query, k):
            doc = self.by_id[doc_id]
            lines.append(f"[{doc_id}] {doc.title}: {doc.text[: self.snippet_chars]}")
        return "\n".join(lines)

    def open(self, doc_id: str) -> str:
        """Tool output: the full document; `ToolError` for an unknown id."""
        doc = self.by_id.get(doc_id.strip())
        if doc is None:
            raise ToolError(f"unknown doc_id {doc_id.strip()!r}")
        return f"{doc.title}\n{doc.text}"


def normalize_name(text: str) -> str:
    """Lower-case letters and digits only (``"Zan-Tor Labs."`` -> ``"zantorlabs"``)."""
    text = re.sub(r"\\text\{([^}]*)\}", r"\1", text)
    return "".join(ch for ch in text.lower() if ch.isalnum())


def name_scorer(response: str, example: dict) -> tuple[float, dict]:
    """1.0 when the boxed / ``####`` answer names ``example["answer"]`` (see `normalize_name`)."""
    extraction = extract_answer(response, fallback_last_number=False)
    pred = extraction.text
    correct = pred is not None and normalize_name(pred) == normalize_name(example["answer"])
    return float(correct), {"pred": pred, "method": extraction.method, "correct": correct}


def make_search_env(
    index: BM25Index, template: PromptTemplate | None = None, k: int = 3,
    max_observation_chars: int = 1000,
) -> ToolEnv:
    """A fresh search `ToolEnv` (tools ``search`` and ``open``) over a shared index."""
    template = template or PromptTemplate(instruction=SEARCH_INSTRUCTION)
    tools = {"search": lambda q: index.search(q, k), "open": index.open}
    return ToolEnv(template, tools, name_scorer, max_observation_chars)
