"""The search task: questions answered by one or two look-ups in a small local corpus (BM25).

The corpus is generated from the seed: `num_entities` made-up names, each with one document
"kabo is in tarn and knows mirel" (a place, and a friend who is another entity). A question is
one hop ("where is kabo?": search kabo, read the place) or two ("where is the friend of
kabo?": search kabo, read the friend, search mirel, read the place). The tool `search` returns
the best document by BM25; the policy writes `<<search kabo>>` and, at the end, the place.
Reward 1 for the exact place.

Retrieval is `bm25s` (an actively maintained BM25 library on numpy / scipy sparse matrices,
Lucene's scoring); each document is indexed with its entity's name as a title (weighted twice),
so a name's own document ranks above the documents that mention it as a friend. Ties are broken
by document order, so a query always returns the same document.

`SearchEnv.predict_calls` is the task's own predictor for speculative prefetch: the first call
searches the entity of the question, a second one the friend just read (used only when the
sampled call matches exactly).
"""
from __future__ import annotations

import dataclasses
import functools
import threading

import numpy as np

from jaxrl_sys.tasks.base import Problem
from jaxrl_sys.tasks.env import ToolEnv
from jaxrl_sys.tasks.tools.base import Tool, ToolCall
from jaxrl_sys.tasks.tools.parsers import PlainParser

_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"


def _names(rng: np.random.Generator, count: int, taken: set[str]) -> list[str]:
  out = []
  while len(out) < count:
    name = "".join(rng.choice(list(_CONSONANTS)) + rng.choice(list(_VOWELS)) for _ in range(2))
    if name not in taken:
      taken.add(name)
      out.append(name)
  return out


@functools.lru_cache(maxsize=8)
def make_corpus(num_entities: int, seed: int) -> tuple[tuple[str, str, str], ...]:
  """`(name, place, friend)` per entity, deterministic in the arguments (friends form one
  cycle, so every entity is somebody's friend)."""
  rng = np.random.default_rng([seed, num_entities, 41])
  taken: set[str] = set()
  names = _names(rng, num_entities, taken)
  places = _names(rng, max(num_entities // 4, 2), taken)
  order = rng.permutation(num_entities)
  friend = {names[order[i]]: names[order[(i + 1) % num_entities]] for i in range(num_entities)}
  return tuple((n, places[int(rng.integers(len(places)))], friend[n]) for n in names)


def document(entry: tuple[str, str, str]) -> str:
  name, place, friend = entry
  return f"{name} is in {place} and knows {friend}"


class Bm25Index:
  """BM25 over documents with titles (`bm25s`); `search(query)` -> the best document's text."""

  def __init__(self, titles: list[str], docs: list[str]):
    import bm25s  # pylint: disable=import-outside-toplevel
    self._bm25s, self.docs = bm25s, docs
    tokens = bm25s.tokenize([f"{t} {t} {d}" for t, d in zip(titles, docs)], stopwords=None,
                            show_progress=False)
    self._index = bm25s.BM25()
    self._index.index(tokens, show_progress=False)
    self._lock = threading.Lock()  # retrieve is called from several tool threads

  def scores(self, query: str) -> np.ndarray:
    """BM25 score of every document for `query` -> `[num_docs]` float32."""
    q = self._bm25s.tokenize([query], stopwords=None, show_progress=False, return_ids=False)
    with self._lock:
      return np.asarray(self._index.get_scores(q[0]), np.float32)

  def search(self, query: str) -> str:
    s = self.scores(query)
    if not s.size or s.max() <= 0:
      return "no result"
    return self.docs[int(np.argmax(s))]  # argmax: the first of equal scores


@functools.lru_cache(maxsize=8)
def corpus_index(num_entities: int, seed: int) -> Bm25Index:
  entries = make_corpus(num_entities, seed)
  return Bm25Index([e[0] for e in entries], [document(e) for e in entries])


@dataclasses.dataclass(frozen=True)
class SearchTask:
  """Questions over a generated corpus (module docstring).

  Attributes:
    num_entities: entities (documents) in the corpus.
    hops: 1 (look-ups of one name), 2 (the friend's place) or 0 (an even mix).
    seed: data seed.
  """
  num_entities: int = 256
  hops: int = 0
  seed: int = 0
  name: str = "search"

  alphabet = "abcdefghijklmnopqrstuvwxyz ?<>\n"
  tool_style = "plain"

  def __post_init__(self):
    if self.num_entities < 4:
      raise ValueError(f"SearchTask: num_entities must be >= 4, got {self.num_entities}")
    if self.hops not in (0, 1, 2):
      raise ValueError(f"SearchTask: hops must be 0 (mixed), 1 or 2, got {self.hops}")

  @property
  def corpus(self) -> tuple[tuple[str, str, str], ...]:
    return make_corpus(self.num_entities, self.seed)

  def problem(self, index: int) -> Problem:
    rng = np.random.default_rng([self.seed, index, 43])
    entries = self.corpus
    who = entries[int(rng.integers(len(entries)))]
    hops = self.hops or int(rng.integers(1, 3))
    by_name = {e[0]: e for e in entries}
    if hops == 1:
      return Problem(f"where is {who[0]}?", who[1], {"hops": 1, "names": [who[0]]})
    friend = by_name[who[2]]
    return Problem(f"where is the friend of {who[0]}?", friend[1],
                   {"hops": 2, "names": [who[0], friend[0]]})

  def reward(self, problem: Problem, completion: str) -> float:
    return float(completion.strip() == problem.answer)

  def demonstration(self, index: int) -> list[tuple[str, bool]]:
    """An expert episode as `(text, is_policy_turn)` pieces."""
    p = self.problem(index)
    index_ = corpus_index(self.num_entities, self.seed)
    out = [(p.prompt, False)]
    for name in p.meta["names"]:
      out += [(f"<<search {name}>>", True), (index_.search(name), False)]
    return out + [(p.answer, True)]

  def make_env(self) -> "SearchEnv":
    return SearchEnv(self)


class SearchEnv(ToolEnv):
  """The search episode: `search` calls answered from the corpus, the place scored."""
  parser = PlainParser()

  def __init__(self, task: SearchTask | None = None):
    self.task = task or SearchTask()
    index = corpus_index(self.task.num_entities, self.task.seed)
    search = Tool("search", index.search, "the best document of the corpus for a query (BM25)",
                  read_only=True, parameters={"type": "object", "properties": {
                      "query": {"type": "string"}}, "required": ["query"]})
    super().__init__(tools=(search,))

  def score(self, problem: Problem, answer: str) -> float:
    return self.task.reward(problem, answer)

  def predict_calls(self, observations: list[str], partial: str) -> list[ToolCall]:
    """The calls this episode's next action will likely make (speculative prefetch): the
    question's entity first, then the friend named by the last result."""
    del partial
    if self.problem is None:
      return []
    if not observations:
      name = self.problem.prompt.rstrip("?").split()[-1]
    else:
      words = observations[-1].split()
      if len(words) < 2 or words[-2] != "knows":
        return []
      name = words[-1]
    return [ToolCall("search", name, f"<<search {name}>>")]
