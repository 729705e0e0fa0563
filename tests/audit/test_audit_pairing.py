"""Pairing two judges' assertions: exact texts first, then the most similar, the rest unpaired."""

from __future__ import annotations

from balcaprl.judge.audit import pair_assertions
from balcaprl.judge.audit.pairing import normalise, similarity


def test_normalise_and_similarity():
    assert normalise("  The RED square, on the left! ") == "the red square on the left"
    assert similarity("a red square", "a red square") == 1.0
    assert similarity("a red square", "a blue circle") == 2 * 1 / 6  # only "a" is shared
    assert similarity("", "") == 1.0


def test_same_texts_in_another_order_pair_fully():
    x = ["a red square", "a blue circle", "it is on the left"]
    y = ["It is on the left.", "A red square", "a blue circle"]
    p = pair_assertions(x, y)
    assert p.pairs == ((0, 1), (1, 2), (2, 0)) and p.unpaired_x == p.unpaired_y == ()


def test_duplicates_pair_in_order():
    p = pair_assertions(["a cat", "a cat", "a dog"], ["a cat", "a dog", "a cat"])
    assert p.pairs == ((0, 0), (1, 2), (2, 1))


def test_a_different_split_pairs_the_closest_and_counts_the_rest():
    x = ["a red square on the left", "a green triangle"]
    y = ["a red square", "the square is on the left", "a green triangle", "the mood is calm"]
    p = pair_assertions(x, y)
    # exact: x1 <-> y2. similar: x0 vs y0 "a red square": 3 shared words, dice 2*3/(6+3) = 2/3;
    # x0 vs y1 "the square is on the left": 4 shared (the, square, on, left), dice 2*4/(6+6) = 2/3;
    # a tie, so the nearer position (y0) wins; y3 shares nothing with x0.
    assert (
        similarity(normalise(x[0]), normalise(y[0])) == similarity(normalise(x[0]), normalise(y[1])) == 2 / 3
    )
    assert p.pairs == ((0, 0), (1, 2))
    assert p.unpaired_x == () and p.unpaired_y == (1, 3)


def test_ties_go_to_the_nearer_position_and_dissimilar_texts_stay_unpaired():
    p = pair_assertions(["a big red square"], ["a big red circle", "x", "a big red triangle"])
    assert p.pairs == ((0, 0),)  # equally similar: the nearer position wins
    q = pair_assertions(["a purple elephant"], ["the sky is clear"])
    assert q.pairs == () and q.unpaired_x == (0,) and q.unpaired_y == (0,)
