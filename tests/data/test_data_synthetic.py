"""Synthetic Markov text: the analytic entropy rate matches empirical estimates."""

import numpy as np
import pytest

from muonlab.data.synthetic import MarkovText, SyntheticSource


@pytest.fixture(scope="module")
def chain() -> MarkovText:
    return MarkovText.random(n_words=512, branching=8, seed=0)


@pytest.fixture(scope="module")
def sample(chain) -> np.ndarray:
    return chain.sample(n_docs=2000, doc_words=200, rng=np.random.default_rng(123))


def test_vocabulary_is_prefix_free_under_spaces(chain):
    assert len(set(chain.words)) == 512
    assert all(w and w.isascii() and w.isalpha() and w.islower() for w in chain.words)


def test_stationary_distribution(chain):
    pi = chain.stationary()
    P = chain.transition_matrix()
    assert np.allclose(P.sum(axis=1), 1.0)
    assert pi.min() > 0 and abs(pi.sum() - 1) < 1e-12
    assert np.allclose(pi @ P, pi, atol=1e-12)


def test_render_parse_round_trip(chain, sample):
    for ids in sample[:50]:
        text = chain.render(ids)
        assert chain.parse(text) == ids.tolist()
        assert len(text.encode("utf-8")) == sum(len(chain.words[i]) for i in ids) + len(ids) - 1


def test_analytic_rate_matches_empirical(chain, sample):
    H, E = chain.bits_per_word(), chain.bytes_per_word()
    assert chain.entropy_bits_per_byte() == pytest.approx(H / E)
    prev, nxt = sample[:, :-1].ravel(), sample[:, 1:].ravel()  # 398k transitions from pi
    N = len(prev)

    # 1) Log-loss of the sample under the true chain: an unbiased estimate of H.
    P = chain.transition_matrix()
    nll = -np.log2(P[prev, nxt])
    assert abs(nll.mean() - H) < 5 * nll.std() / np.sqrt(N)

    # 2) Plug-in conditional entropy from transition counts (bias ~ edges/(2N ln 2) ~ 0.4%).
    counts = np.zeros_like(P)
    np.add.at(counts, (prev, nxt), 1)
    joint = counts / N
    cond = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    plug_in = -np.sum(joint[counts > 0] * np.log2(cond[counts > 0]))
    assert plug_in == pytest.approx(H, rel=0.02)

    # 3) Bytes per word (word + one separator), and the rate in bits per byte.
    lengths = chain.word_lengths()
    empirical_bytes = lengths[nxt].mean() + 1
    assert empirical_bytes == pytest.approx(E, rel=0.01)
    assert plug_in / empirical_bytes == pytest.approx(chain.entropy_bits_per_byte(), rel=0.02)


def test_document_entropy_accounts_for_the_first_word(chain):
    pi = chain.stationary()
    L = 200
    h_pi = -np.sum(pi * np.log2(pi))
    expected = (h_pi + (L - 1) * chain.bits_per_word()) / (L * (pi @ chain.word_lengths()) + L - 1)
    assert chain.doc_entropy_bits_per_byte(L) == pytest.approx(expected)
    assert chain.doc_entropy_bits_per_byte(L) > chain.entropy_bits_per_byte()  # H(pi) > H
    assert chain.doc_entropy_bits_per_byte(10**7) == pytest.approx(chain.entropy_bits_per_byte(), rel=1e-4)


def test_source_is_deterministic_and_sized():
    a = SyntheticSource(200_000, seed=1, n_words=128, branching=4, doc_words=64)
    b = SyntheticSource(200_000, seed=1, n_words=128, branching=4, doc_words=64)
    c = SyntheticSource(200_000, seed=2, n_words=128, branching=4, doc_words=64)
    docs = a.documents()
    assert docs == b.documents() and docs != c.documents()
    total = sum(len(t) for _, t in docs)
    assert 190_000 < total < 215_000
    assert all(len(t.split(" ")) == 64 for _, t in docs)
    meta = a.meta()
    assert 0 < meta["entropy_bits_per_byte"] < meta["doc_entropy_bits_per_byte"] < 8
