"""c-GDPO and GRPO advantages: hand-computed values, the pinned contract's edge cases, and agreement with the
deliberately simple loop implementation on random batches."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from balcaprl import c_gdpo_advantages, grpo_advantages
from balcaprl.testing.loop_advantages import loop_c_gdpo_advantages, loop_decoupled_sums, loop_grpo_advantages

NAN = float("nan")


def test_c_gdpo_hand_computed_single_group():
    # One group of 3, K = 2, weights 0.5/0.5, eps = 0 so every number is exact.
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.5, 1.0]], dtype=torch.float64)
    # Column a: mean 0.5, unbiased std 0.5 -> (1, -1, 0).
    # Column b: mean 1/3, unbiased std sqrt(1/3) -> (-1/sqrt3, -1/sqrt3, 2/sqrt3).
    s3 = math.sqrt(3)
    summed = [0.5 * (1 - 1 / s3), 0.5 * (-1 - 1 / s3), 0.5 * (2 / s3)]
    # Batch step: the mean is 0; unbiased std = sqrt(sum(x^2) / 2).
    std = math.sqrt(sum(x * x for x in summed) / 2)
    expected = torch.tensor([x / std for x in summed], dtype=torch.float64)
    got = c_gdpo_advantages(rewards, [7, 7, 7], [0.5, 0.5], eps=0.0)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx([0.29885849, -1.11535507, 0.81649658], abs=1e-8)


def test_grpo_hand_computed_single_group():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.5, 1.0]], dtype=torch.float64)
    # s = (0.5, 0, 0.75): mean 5/12, deviations (1/12, -5/12, 4/12), unbiased var 0.1458333.
    s = [0.5, 0.0, 0.75]
    mean = sum(s) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in s) / 2)
    expected = torch.tensor([(x - mean) / std for x in s], dtype=torch.float64)
    torch.testing.assert_close(grpo_advantages(rewards, [0, 0, 0], [0.5, 0.5], eps=0.0), expected)


def test_default_eps_is_added_to_std():
    rewards = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    # Group: mean 0.5, unbiased std sqrt(0.5); a = +-0.5 / (sqrt(0.5) + 1e-6).
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(
        grpo_advantages(rewards, [0, 0], [1.0]), torch.tensor([-a, a], dtype=torch.float64)
    )


def test_single_rollout_group_contributes_zero():
    rewards = torch.tensor([[0.9, 0.1], [0.2, 0.3], [0.4, 0.8], [0.6, 0.5]])
    groups = [0, 1, 1, 1]  # group 0 has one rollout
    assert grpo_advantages(rewards, groups, [1.0, 1.0])[0] == 0.0
    # Its decoupled sum is 0 and the batch mean of per-group-normalised sums is 0 -> exactly 0.
    assert c_gdpo_advantages(rewards, groups, [1.0, 1.0])[0].abs() < 1e-7


def test_zero_variance_reward_contributes_zero_and_no_nan():
    rewards = torch.tensor([[0.5, 0.1], [0.5, 0.4], [0.5, 0.9]])
    only_b = c_gdpo_advantages(rewards[:, 1:], [0, 0, 0], [1.0])
    both = c_gdpo_advantages(rewards, [0, 0, 0], [1.0, 1.0])
    assert torch.isfinite(both).all()
    torch.testing.assert_close(both, only_b)
    # All rewards constant: every advantage is exactly 0, not NaN.
    flat = torch.full((4, 3), 0.7)
    assert c_gdpo_advantages(flat, [0, 0, 1, 1], [0.1, 0.3, 0.3]).eq(0).all()
    assert grpo_advantages(flat, [0, 0, 1, 1], [0.1, 0.3, 0.3]).eq(0).all()


def test_all_nan_rollout_gets_zero_and_leaves_others_unchanged():
    rewards = torch.tensor([[0.1, 0.9], [0.5, 0.4], [NAN, NAN], [0.8, 0.2], [0.3, 0.3], [0.6, 0.7]])
    groups = [0, 0, 0, 1, 1, 1]
    with_failure = c_gdpo_advantages(rewards, groups, [0.5, 0.5])
    assert with_failure[2] == 0.0
    keep = [0, 1, 3, 4, 5]
    without = c_gdpo_advantages(rewards[keep], [groups[i] for i in keep], [0.5, 0.5])
    torch.testing.assert_close(with_failure[keep], without)


def test_partial_nan_is_left_out_of_that_rewards_group_stats_only():
    rewards = torch.tensor([[0.1, NAN], [0.5, 0.4], [0.9, 0.8]], dtype=torch.float64)
    got = c_gdpo_advantages(rewards, [0, 0, 0], [1.0, 1.0], eps=0.0)
    # Column a uses all three rollouts: (-1, 0, 1). Column b uses rollouts 2 and 3 only: (0, -1/sqrt2, 1/sqrt2).
    r = 1 / math.sqrt(2)
    summed = torch.tensor([-1.0, -r, 1 + r], dtype=torch.float64)
    expected = (summed - summed.mean()) / summed.std()
    torch.testing.assert_close(got, expected)


def test_grpo_any_nan_rollout_gets_zero():
    rewards = torch.tensor([[0.1, NAN], [0.5, 0.4], [0.9, 0.8]])
    got = grpo_advantages(rewards, [0, 0, 0], [0.0, 1.0])  # even with a zero weight on the NaN column
    assert got[0] == 0.0
    torch.testing.assert_close(got[1:], grpo_advantages(rewards[1:], [0, 0], [0.0, 1.0]))


def test_every_rollout_failed_gives_zeros():
    rewards = torch.full((4, 3), NAN)
    assert c_gdpo_advantages(rewards, [0, 0, 1, 1], [1, 1, 1]).eq(0).all()
    assert grpo_advantages(rewards, [0, 0, 1, 1], [1, 1, 1]).eq(0).all()


def test_group_labels_and_order_do_not_matter():
    torch.manual_seed(0)
    rewards = torch.rand(12, 3, dtype=torch.float64)
    groups = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 1])  # interleaved, unequal sizes
    base = c_gdpo_advantages(rewards, groups, [0.1, 0.3, 0.3])
    relabelled = c_gdpo_advantages(rewards, groups * 1000 - 7, [0.1, 0.3, 0.3])
    torch.testing.assert_close(base, relabelled)
    perm = torch.randperm(12)
    torch.testing.assert_close(c_gdpo_advantages(rewards[perm], groups[perm], [0.1, 0.3, 0.3]), base[perm])
    torch.testing.assert_close(
        grpo_advantages(rewards[perm], groups[perm], [0.1, 0.3, 0.3]),
        grpo_advantages(rewards, groups, [0.1, 0.3, 0.3])[perm],
    )


def test_batch_step_standardises_over_rollouts():
    torch.manual_seed(1)
    rewards = torch.rand(64, 3, dtype=torch.float64)
    adv = c_gdpo_advantages(rewards, torch.arange(8).repeat_interleave(8), [0.1, 0.3, 0.3], eps=0.0)
    assert adv.mean().abs() < 1e-12
    assert adv.std() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_is_preserved(dtype):
    rewards = torch.rand(16, 3, dtype=dtype)
    groups = torch.arange(4).repeat(4)
    assert c_gdpo_advantages(rewards, groups, [0.1, 0.3, 0.3]).dtype == dtype
    assert grpo_advantages(rewards, groups, [0.1, 0.3, 0.3]).dtype == dtype


def test_bad_inputs_say_what_is_wrong():
    rewards = torch.rand(4, 3)
    with pytest.raises(ValueError, match="weights must have K=3"):
        c_gdpo_advantages(rewards, [0, 0, 1, 1], [0.5, 0.5])
    with pytest.raises(ValueError, match="group_index must hold N=4"):
        c_gdpo_advantages(rewards, [0, 0, 1], [1, 1, 1])
    with pytest.raises(ValueError, match=r"shape \(N, K\)"):
        grpo_advantages(torch.rand(4), [0, 0, 1, 1], [1.0])
    with pytest.raises(TypeError, match="floating-point"):
        c_gdpo_advantages(torch.ones(4, 3, dtype=torch.long), [0, 0, 1, 1], [1, 1, 1])
    with pytest.raises(ValueError, match="integers"):
        c_gdpo_advantages(rewards, torch.tensor([0.0, 0.0, 1.0, 1.0]), [1, 1, 1])


@st.composite
def batches(draw):
    """Random batches: K = 1..8, 1..12 groups of sizes 1..9, interleaved, with NaN failures."""
    k = draw(st.integers(1, 8))
    sizes = draw(st.lists(st.integers(1, 9), min_size=1, max_size=12))
    groups = [g for g, size in enumerate(sizes) for _ in range(size)]
    order = draw(st.permutations(range(len(groups))))
    groups = [groups[i] * 3 + 11 for i in order]
    n = len(groups)
    value = st.one_of(st.floats(0, 1, allow_nan=False), st.sampled_from([0.0, 0.25, 1.0]))
    rows = draw(st.lists(st.lists(value, min_size=k, max_size=k), min_size=n, max_size=n))
    failed_rows = draw(st.sets(st.integers(0, n - 1), max_size=max(1, n // 4)))
    failed_cells = draw(st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, k - 1)), max_size=3))
    for r in failed_rows:
        rows[r] = [NAN] * k
    for r, c in failed_cells:
        rows[r][c] = NAN
    weights = draw(st.lists(st.floats(0, 1, allow_nan=False), min_size=k, max_size=k))
    return rows, groups, weights


@settings(max_examples=200, deadline=None)
@given(batches())
def test_vectorised_equals_simple_loop(batch):
    # float64: both implementations agree to 1e-9 on any batch (eps = 1e-6 bounds every amplification).
    rows, groups, weights = batch
    rewards = torch.tensor(rows, dtype=torch.float64)
    tol = dict(rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(
        c_gdpo_advantages(rewards, groups, weights), loop_c_gdpo_advantages(rewards, groups, weights), **tol
    )
    torch.testing.assert_close(
        grpo_advantages(rewards, groups, weights), loop_grpo_advantages(rewards, groups, weights), **tol
    )


@st.composite
def dyadic_batches(draw):
    """Batches whose float32 arithmetic is exact up to the division by the std: rewards on a grid of
    quarters and weights in {0.25, 0.5, 1}, so every weighted sum is exactly representable. Two rollouts
    that tie in exact arithmetic then tie bitwise in float32 too; with arbitrary floats, sums 3e-5 apart
    divided by a std of the same size turn float32 rounding into errors of order 1 (not a bug)."""
    rows, groups, _ = draw(batches())
    quarters = [[NAN if v != v else round(v * 4) / 4 for v in row] for row in rows]
    weights = draw(st.lists(st.sampled_from([0.25, 0.5, 1.0]), min_size=len(rows[0]), max_size=len(rows[0])))
    return quarters, groups, weights


@settings(max_examples=200, deadline=None)
@given(dyadic_batches())
def test_float32_matches_float64_where_float32_can(batch):
    rows, groups, weights = batch
    exact = torch.tensor(rows, dtype=torch.float64)
    single = exact.to(torch.float32)
    # GRPO: weighted sums are exact in float32, so each group's deviations are exact up to rounding of
    # the mean and std: relative error ~1e-6.
    torch.testing.assert_close(
        grpo_advantages(single, groups, weights),
        loop_grpo_advantages(exact, groups, weights).to(torch.float32),
        rtol=1e-4,
        atol=1e-4,
    )
    # c-GDPO's batch step divides by the std of sums of irrational-valued per-reward advantages. When
    # that std is about float32's resolution (~1e-7 x their size) the batch carries no signal and the
    # result is rounding noise divided by eps; compare only where the batch std is a real signal.
    reference = loop_c_gdpo_advantages(exact, groups, weights)
    result = c_gdpo_advantages(single, groups, weights)
    assert result.dtype == torch.float32 and torch.isfinite(result).all()
    judged = ~torch.isnan(exact).all(dim=1)
    decoupled = torch.tensor(loop_decoupled_sums(exact, groups, weights), dtype=torch.float64)[judged]
    if decoupled.numel() >= 2 and float(decoupled.std()) >= 1e-3:
        torch.testing.assert_close(result, reference.to(torch.float32), rtol=1e-4, atol=1e-4)


# Rewards as judges give them: fractions of assertion counts and mean 1-10 scores mapped to [0, 1].
judge_rewards = st.one_of(
    st.tuples(st.integers(0, 12), st.integers(1, 12)).map(lambda t: min(t) / t[1]),
    st.integers(0, 27).map(lambda k: k / 27),
)


@settings(max_examples=300, deadline=None)
@given(value=judge_rewards, size=st.integers(2, 16), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_a_reward_that_does_not_vary_in_its_group_gives_exactly_zero(value, size, dtype):
    # Float32 rounding of the group mean, divided by std 0 + eps, once gave up to +-0.1 here.
    rewards = torch.full((size, 1), value, dtype=dtype)
    assert torch.equal(grpo_advantages(rewards, [0] * size, [1.0]), torch.zeros(size, dtype=dtype))


@st.composite
def judged_batches(draw):
    """Groups of 8 whose linguistic reward is often the same for the whole group, as with a real judge."""
    rows, groups = [], []
    for group in range(draw(st.integers(2, 6))):
        constant = draw(st.one_of(st.none(), st.integers(0, 27).map(lambda k: k / 27)))
        for _ in range(8):
            ling = constant if constant is not None else draw(judge_rewards)
            rows.append([draw(judge_rewards), draw(judge_rewards), ling])
            groups.append(group)
    return rows, groups


@settings(max_examples=200, deadline=None)
@given(judged_batches())
def test_float32_rewards_give_the_float64_advantages(batch):
    """TRL hands over float32 rewards; the advantages must be those of the same rewards in float64."""
    rows, groups = batch
    single = torch.tensor(rows, dtype=torch.float32)
    exact = single.to(torch.float64)
    weights = [0.1, 0.3, 0.3]
    reference = loop_c_gdpo_advantages(exact, groups, weights)
    result = c_gdpo_advantages(single, groups, weights)
    assert result.dtype == torch.float32
    decoupled = torch.tensor(loop_decoupled_sums(exact, groups, weights), dtype=torch.float64)
    if float(decoupled.std()) >= 1e-3:
        torch.testing.assert_close(result, reference.to(torch.float32), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        grpo_advantages(single, groups, weights),
        loop_grpo_advantages(exact, groups, weights).to(torch.float32),
        rtol=1e-5,
        atol=1e-5,
    )
