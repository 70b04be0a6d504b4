"""posenc.families.arithmetic: the position ids of randomized positions, Abacus, coupling, hints.

Each scheme is checked on its paper's own worked example (ids computed by hand from
the paper's rule), then by properties over random layouts of numbers.
"""

from __future__ import annotations

import itertools
import math
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.families.arithmetic import (
    AFTER_NUMBER,
    OUTSIDE,
    abacus_positions,
    coupled_positions,
    index_hints,
    random_offsets,
    randomized_positions,
)

# 653 + 49 = 702 in Cho et al.'s format: "6 5 3 + 0 4 9 = 2 0 7 0" (operands zero-padded,
# most significant digit first; the answer zero-padded to 4 digits and reversed)
CHO_SIGNIFICANCE = [2, 1, 0, -1, 2, 1, 0, -1, 0, 1, 2, 3]
# by hand: width 4, start 1 -> a digit of significance j gets 1 + 4 - 1 - j = 4 - j, and the
# token after a number 1 + 4 = 5 (the reference: end = start + max_len + 1 = 5, id = end - 1 - j)
CHO_IDS = [2, 3, 4, 5, 2, 3, 4, 5, 4, 3, 2, 1]
# 123 + 456 = 579 in McLeish et al.'s format: every number reversed, "3 2 1 + 6 5 4 = 9 7 5"
ABACUS_SIGNIFICANCE = [0, 1, 2, -1, 0, 1, 2, -1, 0, 1, 2]
ABACUS_IDS = [1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3]


def test_coupled_positions_match_the_papers_example() -> None:
    assert coupled_positions(torch.tensor(CHO_SIGNIFICANCE)).tolist() == CHO_IDS
    # a start shifts every placed id, and leaves 0 for tokens outside the numbers
    sig = torch.tensor([OUTSIDE, *CHO_SIGNIFICANCE, OUTSIDE])
    assert coupled_positions(sig, 7).tolist() == [0, *(i + 6 for i in CHO_IDS), 0]


def test_coupled_positions_of_a_product_match_the_reference_rule() -> None:
    # 12 x 34 = 408, Cho et al. 2024b's N x M: "1 2 x 3 4 = 8 0 4 0" (answer padded to 4
    # digits, reversed). The reference: end = start + len(a) + len(b) = 5, id = end - 1 - j.
    sig = torch.tensor([1, 0, -1, 1, 0, -1, 0, 1, 2, 3])
    assert coupled_positions(sig).tolist() == [3, 4, 5, 3, 4, 5, 4, 3, 2, 1]


def test_abacus_positions_match_the_papers_example() -> None:
    assert abacus_positions(torch.tensor(ABACUS_SIGNIFICANCE)).tolist() == ABACUS_IDS
    # the training offset k is added to every digit's id, never to the others' 0
    assert abacus_positions(torch.tensor(ABACUS_SIGNIFICANCE), 10).tolist() == [
        i + 10 if i else 0 for i in ABACUS_IDS
    ]


def test_abacus_counts_digits_in_written_order_whatever_their_significance() -> None:
    # an operand written most significant digit first still counts 1, 2, 3 from its first
    assert abacus_positions(torch.tensor([2, 1, 0, -1, 0, -2])).tolist() == [1, 2, 3, 0, 1, 0]


def test_index_hints_name_each_digits_place() -> None:
    # 42 + 39 = 81, zero-padded to 3 digits and reversed: "2 4 0 + 9 3 0 = 1 8 0"
    sig = torch.tensor([0, 1, 2, -1, 0, 1, 2, -1, 0, 1, 2])
    assert index_hints(sig).tolist() == [0, 1, 2, -1, 0, 1, 2, -1, 0, 1, 2]
    assert index_hints(sig, 5).tolist() == [5, 6, 7, -1, 5, 6, 7, -1, 5, 6, 7]


def test_coupled_positions_are_per_row_in_a_batch_of_widths() -> None:
    # 653 + 49 = 702 (width 4) beside 12 + 34 = 46, "1 2 + 3 4 = 6 4 0" (width 3, padded
    # with tokens outside the numbers): each row's columns are its own. By hand, width 3,
    # start 1: a digit of significance j gets 3 - j, the token after a number 4
    narrow = [1, 0, AFTER_NUMBER, 1, 0, AFTER_NUMBER, 0, 1, 2]
    sig = torch.tensor([CHO_SIGNIFICANCE, narrow + [OUTSIDE] * 3])
    ids = coupled_positions(sig)
    assert ids[0].tolist() == CHO_IDS
    assert ids[1].tolist() == [2, 3, 4, 2, 3, 4, 3, 2, 1, 0, 0, 0]


def test_offsets_per_row() -> None:
    sig = torch.tensor([CHO_SIGNIFICANCE, CHO_SIGNIFICANCE])
    ids = coupled_positions(sig, torch.tensor([1, 3]))
    assert ids[0].tolist() == CHO_IDS
    assert ids[1].tolist() == [i + 2 for i in CHO_IDS]
    ab = abacus_positions(torch.tensor([ABACUS_SIGNIFICANCE] * 2), torch.tensor([0, 4]))
    assert ab[1].tolist() == [i + 4 if i else 0 for i in ABACUS_IDS]


def test_randomized_positions_are_a_sorted_subset_and_seeded() -> None:
    a = randomized_positions(10, 50, torch.Generator().manual_seed(3))
    b = randomized_positions(10, 50, torch.Generator().manual_seed(3))
    c = randomized_positions(10, 50, torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.dtype == torch.int64 and bool((a[1:] > a[:-1]).all())
    assert 0 <= int(a.min()) and int(a.max()) < 50
    # all of them when length equals the range
    full = randomized_positions(7, 7, torch.Generator().manual_seed(0))
    assert full.tolist() == list(range(7))


def test_random_offsets_are_seeded_and_in_range() -> None:
    one = random_offsets(5, torch.Generator().manual_seed(1))
    assert isinstance(one, int) and 0 <= one <= 5
    rows = random_offsets(3, torch.Generator().manual_seed(1), rows=200)
    again = random_offsets(3, torch.Generator().manual_seed(1), rows=200)
    assert torch.equal(rows, again)
    assert set(rows.tolist()) == {0, 1, 2, 3}  # every value of 0 .. high, and no other


def chi_square_bound(cells: int, alpha: float = 1e-9) -> float:
    """A bound Pearson's statistic over ``cells`` equally likely cells exceeds with
    probability below ``alpha`` (draws many times the cells, as here: the statistic then
    follows chi-square with ``k = cells - 1`` degrees of freedom).

    Laurent and Massart (2000), lemma 1: ``P(X - k >= 2 sqrt(k t) + 2 t) <= exp(-t)``;
    ``t = ln(1 / alpha)``. The draws here are seeded, so each test sees one fixed sample;
    the bound says any seed passes but once in a billion.
    """
    k, t = cells - 1, math.log(1 / alpha)
    return k + 2 * math.sqrt(k * t) + 2 * t


def chi_square(counts: list[int]) -> float:
    """Pearson's statistic of ``counts`` against equal cells."""
    expected = sum(counts) / len(counts)
    return sum((c - expected) ** 2 for c in counts) / expected


@pytest.mark.parametrize("high", [0, 1, 5, 99])
def test_random_offsets_draw_every_value_of_the_range_uniformly(high: int) -> None:
    # both paths (one int per call, and one per row) draw each of 0 .. high, high included,
    # with frequencies that fit the uniform law: 200 draws per value expected
    n = 200 * (high + 1)
    gen = torch.Generator().manual_seed(11)
    singles = [random_offsets(high, gen) for _ in range(n)]
    rows = random_offsets(high, torch.Generator().manual_seed(12), rows=n).tolist()
    for draws in (singles, rows):
        counts = [draws.count(v) for v in range(high + 1)]
        assert sum(counts) == n  # no value outside 0 .. high
        assert min(counts) > 0, counts  # every value, the last included
        assert chi_square(counts) <= chi_square_bound(high + 1), counts


def test_randomized_positions_are_uniform_subsets() -> None:
    # Ruoss et al.: a uniform random subset of 0 .. max_positions - 1, sorted. Every one of
    # the C(8, 3) = 56 subsets, those holding the last position included, is drawn, and their
    # frequencies fit the uniform law (200 draws per subset expected)
    subsets = list(itertools.combinations(range(8), 3))
    gen = torch.Generator().manual_seed(13)
    draws = [tuple(randomized_positions(3, 8, gen).tolist()) for _ in range(200 * len(subsets))]
    counts = [draws.count(s) for s in subsets]
    assert sum(counts) == len(draws)  # sorted, distinct, in range: one of the subsets
    assert min(counts) > 0, counts
    assert sum(7 in d for d in draws) > 0  # the last position
    assert chi_square(counts) <= chi_square_bound(len(subsets)), counts


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: coupled_positions([1, 0]), TypeError, "significance"),
        (lambda: coupled_positions(torch.tensor([1.0])), TypeError, "significance"),
        (lambda: coupled_positions(torch.tensor(3)), ValueError, "sequence axis"),
        (lambda: coupled_positions(torch.tensor([1, 0]), 0), ValueError, "start"),
        (lambda: coupled_positions(torch.tensor([1, 0]), 1.5), TypeError, "start"),
        (lambda: abacus_positions(torch.tensor([1, 0]), -1), ValueError, "offset"),
        (lambda: abacus_positions(torch.tensor([[1, 0]]), torch.tensor([1, 2, 3])),
         ValueError, "one per row"),
        (lambda: index_hints(torch.tensor([0, 1]), -2), ValueError, "start"),
        (lambda: randomized_positions(8, 4, torch.Generator()), ValueError, "max_positions"),
        (lambda: randomized_positions(2, 4, None), TypeError, "generator"),
        (lambda: random_offsets(-1, torch.Generator()), ValueError, "high"),
        (lambda: random_offsets(3, 7), TypeError, "generator"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_by_name(call, error, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        call()


def test_an_id_beyond_the_table_is_a_clear_error() -> None:
    sig = torch.tensor(CHO_SIGNIFICANCE)
    assert coupled_positions(sig, max_positions=6).tolist() == CHO_IDS  # largest id 5
    with pytest.raises(ValueError, match="covers"):
        coupled_positions(sig, max_positions=5)
    with pytest.raises(ValueError, match="covers"):
        abacus_positions(torch.tensor(ABACUS_SIGNIFICANCE), 2, max_positions=5)
    with pytest.raises(ValueError, match="hint tokens"):
        index_hints(torch.tensor([0, 1, 2]), 2, hints=4)


@st.composite
def layouts(draw: st.DrawFn) -> tuple[list[int], list[list[int]]]:
    """A random sum's significance: operands (each MSD or LSD first) and an answer."""
    width = draw(st.integers(1, 12))
    operands = draw(st.integers(2, 4))
    sig: list[int] = [OUTSIDE]
    numbers: list[list[int]] = []
    for k in range(operands + 1):
        digits = draw(st.integers(1, width)) if k < operands else width
        order = list(range(digits))
        if draw(st.booleans()):
            order.reverse()
        numbers.append(order)
        sig += order + ([AFTER_NUMBER] if k < operands else [OUTSIDE])
    return sig, numbers


@settings(max_examples=60, deadline=None)
@given(layouts(), st.integers(1, 20))
def test_coupling_gives_equal_significance_one_id(layout, start) -> None:  # type: ignore[no-untyped-def]
    sig, _ = layout
    t = torch.tensor(sig)
    ids = coupled_positions(t, start)
    for j in set(sig):
        chosen = ids[t == j]
        assert len(set(chosen.tolist())) == 1  # one id per significance
    # higher significance, smaller id; the highest column at start
    digits = t >= 0
    assert int(ids[digits][t[digits] == t.max()][0]) == start
    assert bool((ids[~(t >= AFTER_NUMBER)] == 0).all())


@settings(max_examples=60, deadline=None)
@given(layouts(), st.integers(0, 20))
def test_abacus_numbers_count_from_one_within_each_number(layout, k) -> None:  # type: ignore[no-untyped-def]
    sig, numbers = layout
    ids = abacus_positions(torch.tensor(sig), k).tolist()
    found = [i for i in ids if i]
    expected = [k + 1 + i for number in numbers for i in range(len(number))]
    assert found == expected


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(layouts(), st.integers(1, 9)), min_size=2, max_size=4))
def test_coupled_positions_of_a_batch_are_each_rows_alone(rows) -> None:  # type: ignore[no-untyped-def]
    # rows of any widths, padded to one length: each row's ids are those it gets alone
    length = max(len(sig) for (sig, _), _ in rows)
    sig = torch.tensor([s + [OUTSIDE] * (length - len(s)) for (s, _), _ in rows])
    start = torch.tensor([st_ for _, st_ in rows])
    ids = coupled_positions(sig, start)
    for i, ((alone, _), first) in enumerate(rows):
        assert (
            ids[i, : len(alone)].tolist() == coupled_positions(torch.tensor(alone), first).tolist()
        )
        assert bool((ids[i, len(alone) :] == 0).all())


def test_the_functions_survive_pickle() -> None:
    assert pickle.loads(pickle.dumps(coupled_positions)) is coupled_positions


def test_huge_draws_fail_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    from posenc.core import checks

    monkeypatch.setattr(checks, "MAX_ELEMENTS", 1000)
    with pytest.raises(ValueError, match="max_positions=5000"):
        randomized_positions(3, 5000, torch.Generator())
