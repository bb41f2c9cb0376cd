"""The `synthetic` corpus: text from a word-level Markov chain with a known entropy rate.

A fixed vocabulary of distinct lowercase words and a seeded sparse transition matrix
P define a first-order chain. Documents are `L` words joined by single spaces; words
contain no spaces, so the bytes determine the words and byte entropy = word entropy.

For the stationary distribution pi of the (irreducible, aperiodic) chain:
  H = -sum_i pi_i sum_j P_ij log2 P_ij            bits per word (entropy rate)
  E = sum_j pi_j (len(word_j) + 1)                 bytes per word, separator included
  rate = H / E bits per byte                       (renewal-reward, exact in the limit)
Each document starts from a state drawn from pi, so the exact entropy of a document
is H(pi) + (L-1) H over an expected L*(E-1) + L-1 bytes; `doc_entropy_bits_per_byte`
is that ratio, the floor for a model that sees each document on its own.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

GENERATOR_VERSION = 1
_LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))


@dataclass
class MarkovText:
    words: list[str]
    successors: np.ndarray  # int [V, K]: successor word ids of each word
    probs: np.ndarray  # float64 [V, K]: their probabilities (rows sum to 1)
    _pi: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def random(cls, n_words: int, branching: int, seed: int) -> "MarkovText":
        rng = np.random.default_rng([seed, GENERATOR_VERSION])
        words: list[str] = []
        seen: set[str] = set()
        while len(words) < n_words:  # distinct words of 1..8 letters, short ones likelier
            length = int(rng.integers(1, 9)) if rng.random() < 0.5 else int(rng.integers(2, 6))
            word = "".join(rng.choice(_LETTERS, size=length))
            if word not in seen:
                seen.add(word)
                words.append(word)
        V, K = n_words, branching + 1
        successors = np.empty((V, K), dtype=np.int64)
        for i in range(V):
            # The edge i -> i+1 makes the chain irreducible; the rest are random.
            nxt = (i + 1) % V
            others = rng.choice(np.delete(np.arange(V), nxt), size=branching, replace=False)
            successors[i] = np.concatenate(([nxt], others))
        if 0 not in successors[0]:
            successors[0, -1] = 0  # a self-loop makes it aperiodic
        probs = rng.dirichlet(np.full(K, 0.5), size=V)
        probs = np.maximum(probs, 1e-6)  # keep every listed edge alive
        probs /= probs.sum(axis=1, keepdims=True)
        return cls(words, successors, probs)

    # --- analytic quantities ------------------------------------------------------
    def transition_matrix(self) -> np.ndarray:
        V = len(self.words)
        P = np.zeros((V, V))
        np.add.at(P, (np.repeat(np.arange(V), self.successors.shape[1]), self.successors.ravel()), self.probs.ravel())
        return P

    def stationary(self) -> np.ndarray:
        if self._pi is None:  # solved once: every quantity below needs it
            self._pi = self._solve_stationary()
        return self._pi.copy()

    def _solve_stationary(self) -> np.ndarray:
        P = self.transition_matrix()
        V = P.shape[0]
        A = P.T - np.eye(V)
        A[-1] = 1.0  # replace one (redundant) balance equation by sum(pi) = 1
        b = np.zeros(V)
        b[-1] = 1.0
        pi = np.linalg.solve(A, b)
        return np.clip(pi, 0.0, None) / np.clip(pi, 0.0, None).sum()

    def bits_per_word(self) -> float:
        pi = self.stationary()
        row_entropy = -(self.probs * np.log2(self.probs)).sum(axis=1)
        return float(pi @ row_entropy)

    def word_lengths(self) -> np.ndarray:
        return np.array([len(w) for w in self.words], dtype=np.float64)

    def bytes_per_word(self) -> float:
        return float(self.stationary() @ (self.word_lengths() + 1.0))

    def entropy_bits_per_byte(self) -> float:
        return self.bits_per_word() / self.bytes_per_word()

    def doc_entropy_bits_per_byte(self, doc_words: int) -> float:
        pi = self.stationary()
        first = -float(np.sum(pi[pi > 0] * np.log2(pi[pi > 0])))
        bits = first + (doc_words - 1) * self.bits_per_word()
        nbytes = doc_words * float(pi @ self.word_lengths()) + (doc_words - 1)
        return bits / nbytes

    # --- sampling -----------------------------------------------------------------
    def sample(self, n_docs: int, doc_words: int, rng: np.random.Generator) -> np.ndarray:
        """Word ids [n_docs, doc_words]; each document starts from pi. Docs advance together."""
        cum = np.cumsum(self.probs, axis=1)
        cum[:, -1] = 1.0
        start_cum = np.cumsum(self.stationary())
        start_cum[-1] = 1.0
        out = np.empty((n_docs, doc_words), dtype=np.int64)
        state = np.searchsorted(start_cum, rng.random(n_docs), side="right")
        out[:, 0] = state
        for t in range(1, doc_words):
            u = rng.random(n_docs)
            k = (cum[state] <= u[:, None]).sum(axis=1)
            state = self.successors[state, k]
            out[:, t] = state
        return out

    def render(self, ids: np.ndarray) -> str:
        return " ".join(self.words[i] for i in ids)

    def parse(self, text: str) -> list[int]:
        """Inverse of render: split on single spaces and look words up."""
        index = {w: i for i, w in enumerate(self.words)}
        return [index[w] for w in text.split(" ")]


class SyntheticSource:
    name = "synthetic"

    def __init__(self, total_bytes: int, seed: int, n_words: int, branching: int, doc_words: int):
        self.total_bytes, self.seed, self.doc_words = total_bytes, seed, doc_words
        self.n_words, self.branching = n_words, branching

    @functools.cached_property
    def chain(self) -> MarkovText:
        """Made when a corpus is built, not where one is reused (its identity needs no chain: ~30 ms a run)."""
        return MarkovText.random(self.n_words, self.branching, self.seed)

    def identity(self) -> dict:
        return {
            "bytes": self.total_bytes,
            "seed": self.seed,
            "words": self.n_words,
            "branching": self.branching,
            "doc_words": self.doc_words,
            "generator": GENERATOR_VERSION,
        }

    def documents(self) -> list[tuple[str, str]]:
        doc_bytes = self.doc_words * self.chain.bytes_per_word() - 1
        n_docs = max(3, math.ceil(self.total_bytes / doc_bytes))
        rng = np.random.default_rng([self.seed, GENERATOR_VERSION, 1])
        ids = self.chain.sample(n_docs, self.doc_words, rng)
        return [(f"{i:08d}", self.chain.render(row)) for i, row in enumerate(ids)]

    def meta(self) -> dict:
        return {
            "entropy_bits_per_byte": self.chain.entropy_bits_per_byte(),
            "doc_entropy_bits_per_byte": self.chain.doc_entropy_bits_per_byte(self.doc_words),
            "bits_per_word": self.chain.bits_per_word(),
            "bytes_per_word": self.chain.bytes_per_word(),
        }
