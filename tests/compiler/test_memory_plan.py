"""Static memory planner: lifetimes from dispatch lists, greedy-by-size packing, and the independent checker.

Expected arenas are worked out by hand from the lifetimes (see the comments), not read back from the
planner; the property tests compare against brute-force bounds computed here.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_compiler.memory import (
    Lifetime,
    MemoryPlanError,
    MemoryReport,
    check_plan,
    lifetimes,
    memory_report,
    no_reuse_bytes,
    plan_memory,
    resolve_alias,
)


def by_name(lives):
    return {lt.name: lt for lt in lives}


def plan_and_check(lives, **kw):
    offsets, arena = plan_memory(lives, **kw)
    check_plan(lives, offsets, arena, alignment=kw.get("alignment", 64))
    return offsets, arena


# --------------------------------------------------------------------------------------------------
# Hand-made programs
# --------------------------------------------------------------------------------------------------

CHAIN = [(["x"], ["a"]), (["a"], ["b"]), (["b"], ["c"])]


def test_chain_lifetimes():
    lives = lifetimes(CHAIN, {"x": 100, "a": 200, "b": 300, "c": 50}, live_in=["x"], live_out=["c"])
    assert lives == [
        Lifetime("x", 100, -1, 0),  # graph input, read by step 0
        Lifetime("a", 200, 0, 1),
        Lifetime("b", 300, 1, 2),
        Lifetime("c", 50, 2, 3),  # graph output survives past the last step (len(steps) == 3)
    ]


def test_chain_reuses_dead_tensors():
    lives = lifetimes(CHAIN, {"x": 100, "a": 200, "b": 300, "c": 50}, live_in=["x"], live_out=["c"])
    offsets, arena = plan_and_check(lives, alignment=1)
    # Only neighbours in the chain are ever live together: step 0 needs x+a = 300, step 1 needs
    # a+b = 500, step 2 needs b+c = 350.  So 500 is a lower bound, and greedy reaches it:
    # b (largest) at 0; a overlaps b -> 300; x overlaps only a [300, 500) -> 0 (b is not born yet);
    # c overlaps only b [0, 300) -> 300 (a is dead by step 2).
    assert arena == 500
    assert offsets == {"b": 0, "a": 300, "x": 0, "c": 300}
    assert no_reuse_bytes(lives, alignment=1) == 650


def test_diamond():
    steps = [(["x"], ["a"]), (["a"], ["b"]), (["a"], ["c"]), (["b", "c"], ["d"])]
    lives = lifetimes(steps, dict.fromkeys("xabcd", 64), live_in=["x"], live_out=["d"])
    assert by_name(lives) == {
        "x": Lifetime("x", 64, -1, 0),
        "a": Lifetime("a", 64, 0, 2),  # read by both branches, so it lives until step 2
        "b": Lifetime("b", 64, 1, 3),  # waits for the join
        "c": Lifetime("c", 64, 2, 3),
        "d": Lifetime("d", 64, 3, 4),
    }
    offsets, arena = plan_and_check(lives)
    # Step 2 has a, b, c live (3 x 64) and step 3 has b, c, d: the peak is 192.  Equal sizes are placed
    # by first use: x@0, a@64 (meets x), b@0 (x is dead), c@128 (meets a and b), d@64 (meets b and c).
    assert arena == 192
    assert offsets == {"x": 0, "a": 64, "b": 0, "c": 128, "d": 64}


def test_live_in_and_live_out_span_the_whole_program():
    steps = [(["x"], ["a"]), (["a"], ["b"])]
    lives = by_name(lifetimes(steps, {"x": 8, "a": 8, "b": 8, "k": 8}, live_in=["x", "k"], live_out=["x", "b"]))
    assert lives["x"] == Lifetime("x", 8, -1, 2)  # input that is also an output: never reusable
    assert lives["k"] == Lifetime("k", 8, -1, -1)  # unused input still exists on entry
    assert lives["b"] == Lifetime("b", 8, 1, 2)


def test_tensors_without_size_are_ignored():
    steps = [(["x", "weight"], ["a"]), (["a", "bias"], ["b"])]
    lives = lifetimes(steps, {"x": 4, "a": 4, "b": 4}, live_in=["x"])
    assert {lt.name for lt in lives} == {"x", "a", "b"}


def test_written_but_never_read_occupies_its_step():
    lives = by_name(lifetimes([([], ["a"]), (["a"], ["b", "scratch"])], {"a": 4, "b": 4, "scratch": 4}))
    assert lives["scratch"] == Lifetime("scratch", 4, 1, 1)


def test_read_before_defined_is_rejected():
    with pytest.raises(MemoryPlanError, match="'x'.*step 0.*live_in"):
        lifetimes([(["x"], ["a"])], {"x": 4, "a": 4})


# --------------------------------------------------------------------------------------------------
# Aliases (views sharing their base's storage)
# --------------------------------------------------------------------------------------------------


def test_alias_extends_base_and_has_no_storage():
    # a -> v = reshape(a) -> b -> c.  v shares a's bytes, so a must live until v's last read (step 2).
    steps = [(["x"], ["a"]), (["a"], ["v"]), (["v"], ["b"]), (["b"], ["c"])]
    sizes = {"x": 64, "a": 128, "v": 128, "b": 64, "c": 64}
    lives = by_name(lifetimes(steps, sizes, live_in=["x"], live_out=["c"], aliases={"v": "a"}))
    assert "v" not in lives
    assert lives["a"] == Lifetime("a", 128, 0, 2)
    offsets, arena = plan_and_check(list(lives.values()))
    # The view's offset is its base's: callers resolve it through the aliases.
    assert offsets[resolve_alias("v", {"v": "a"})] == offsets["a"]
    # Step 2 holds a (128, through v) and b (64): 192.  Without the alias extension a would die at
    # step 1 and b could take its bytes while v is still being read.
    assert arena == 192


def test_alias_chain_resolves_to_root():
    steps = [([], ["a"]), (["a"], ["v1"]), (["v1"], ["v2"]), (["v2"], ["b"])]
    aliases = {"v1": "a", "v2": "v1"}
    lives = by_name(lifetimes(steps, dict.fromkeys(["a", "v1", "v2", "b"], 16), aliases=aliases, live_out=["v2"]))
    assert set(lives) == {"a", "b"}
    assert lives["a"] == Lifetime("a", 16, 0, 4)  # live_out through the view v2 keeps the root alive
    assert resolve_alias("v2", aliases) == "a"


def test_view_of_a_weight_is_ignored():
    lives = lifetimes([(["wv", "x"], ["y"])], {"x": 4, "y": 4, "wv": 4}, live_in=["x"], aliases={"wv": "W"})
    assert {lt.name for lt in lives} == {"x", "y"}


def test_alias_cycle_is_rejected():
    with pytest.raises(MemoryPlanError, match="cycle"):
        lifetimes([([], ["a"])], {"a": 4}, aliases={"a": "b", "b": "a"})


# --------------------------------------------------------------------------------------------------
# Planner details
# --------------------------------------------------------------------------------------------------


def test_zero_size_tensors_get_offset_zero():
    lives = [Lifetime("a", 64, 0, 2), Lifetime("z", 0, 0, 2), Lifetime("b", 64, 1, 2)]
    offsets, arena = plan_and_check(lives)
    assert offsets["z"] == 0
    assert arena == 128  # z occupies nothing even though it overlaps a in time and bytes


@pytest.mark.parametrize(("alignment", "second", "arena"), [(1, 10, 20), (16, 16, 32), (64, 64, 128)])
def test_alignment(alignment, second, arena):
    # Two 10-byte tensors live together: the second starts at the first aligned offset past 10 bytes,
    # and the arena rounds up to a whole number of alignment units.
    lives = [Lifetime("a", 10, 0, 1), Lifetime("b", 10, 0, 1)]
    offsets, got = plan_and_check(lives, alignment=alignment)
    assert offsets == {"a": 0, "b": second}
    assert got == arena


def test_small_tensor_fills_gap_between_placed_ones():
    # Largest first: a@0.  b meets a at step 1 -> 256.  c meets only b (a is dead after step 1), and
    # 128 bytes fit below b -> 0.  d meets b and c, which leave [128, 256) free -> 128.
    # The peak is step 1 (a + b = 384), so the arena is optimal.
    lives = [
        Lifetime("a", 256, 0, 1),
        Lifetime("b", 128, 1, 2),
        Lifetime("c", 128, 2, 3),
        Lifetime("d", 64, 2, 2),
    ]
    offsets, arena = plan_and_check(lives)
    assert offsets == {"a": 0, "b": 256, "c": 0, "d": 128}
    assert arena == 384


def test_naive_strategy_never_reuses():
    lives = lifetimes(CHAIN, {"x": 100, "a": 200, "b": 300, "c": 50}, live_in=["x"], live_out=["c"])
    offsets, arena = plan_and_check(lives, strategy="naive")
    assert arena == no_reuse_bytes(lives) == 128 + 256 + 320 + 64
    assert len(set(offsets.values())) == 4


def test_planner_is_deterministic():
    lives = [Lifetime(f"t{i}", 64 * (i % 3 + 1), i // 2, i // 2 + 2) for i in range(40)]
    assert plan_memory(lives) == plan_memory(list(reversed(lives)))


@pytest.mark.parametrize(
    ("lives", "kw", "match"),
    [
        ([Lifetime("a", 4, 0, 1)], {"strategy": "best"}, "unknown strategy"),
        ([Lifetime("a", 4, 0, 1)], {"alignment": 0}, "alignment"),
        ([Lifetime("a", 4, 0, 1), Lifetime("a", 4, 2, 3)], {}, "more than one"),
        ([Lifetime("a", -4, 0, 1)], {}, "negative"),
        ([Lifetime("a", 4, 2, 1)], {}, "empty lifetime"),
    ],
)
def test_planner_rejects_bad_input(lives, kw, match):
    with pytest.raises(MemoryPlanError, match=match):
        plan_memory(lives, **kw)


def test_report():
    lives = [Lifetime("a", 1024, 0, 1), Lifetime("b", 1024, 2, 3)]
    _, arena = plan_memory(lives)
    report = memory_report(lives, arena)
    assert (report.arena_bytes, report.no_reuse_bytes, report.ratio) == (1024, 2048, 0.5)
    assert str(report) == "arena 1.0 KiB for 2 tensors vs 2.0 KiB without reuse (50.0%)"
    assert "\n" not in str(report)
    assert MemoryReport(0, 0).ratio == 1.0


# --------------------------------------------------------------------------------------------------
# Checker
# --------------------------------------------------------------------------------------------------

PAIR = [Lifetime("a", 64, 0, 2), Lifetime("b", 64, 2, 3)]  # both live at step 2


def test_checker_accepts_good_plan():
    check_plan(PAIR, {"a": 0, "b": 64}, 128)


def test_checker_catches_overlap():
    with pytest.raises(
        MemoryPlanError, match=r"'a' \(steps \[0, 2\], bytes \[0, 64\)\).*'b' \(steps \[2, 3\], bytes \[0, 64\)\)"
    ):
        check_plan(PAIR, {"a": 0, "b": 0}, 128)


def test_checker_allows_reuse_when_lifetimes_are_disjoint():
    check_plan([Lifetime("a", 64, 0, 1), Lifetime("b", 64, 2, 3)], {"a": 0, "b": 0}, 64)


def test_checker_catches_overlap_hidden_behind_a_long_tensor():
    # c is live with a only; a big tensor spans both offsets.  Detection must not depend on order.
    lives = [Lifetime("big", 256, 0, 9), Lifetime("c", 64, 5, 6), Lifetime("d", 64, 0, 1)]
    with pytest.raises(MemoryPlanError, match="'big'.*'c'"):
        check_plan(lives, {"big": 0, "c": 128, "d": 256}, 320)


def test_checker_catches_out_of_arena():
    with pytest.raises(MemoryPlanError, match="'b'.*outside the arena of 100"):
        check_plan(PAIR, {"a": 0, "b": 64}, 100)


def test_checker_catches_misaligned():
    with pytest.raises(MemoryPlanError, match="'b'.*not aligned to 64"):
        check_plan(PAIR, {"a": 0, "b": 96}, 256)


def test_checker_catches_missing_offset():
    with pytest.raises(MemoryPlanError, match="'b' has no offset"):
        check_plan(PAIR, {"a": 0}, 256)


# --------------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------------


@st.composite
def programs(draw):
    """A random program: each step reads some existing tensors and writes one or two new ones; some
    outputs are views of an earlier tensor.  Returns the arguments of ``lifetimes``."""
    n_inputs = draw(st.integers(0, 3))
    available = [f"in{i}" for i in range(n_inputs)]
    sizes = {name: draw(st.integers(0, 300)) for name in available}
    aliases: dict[str, str] = {}
    steps = []
    for i in range(draw(st.integers(1, 25))):
        reads = draw(st.lists(st.sampled_from(available), max_size=3, unique=True)) if available else []
        writes = [f"t{i}_{j}" for j in range(draw(st.integers(1, 2)))]
        if reads and draw(st.booleans()):
            aliases[writes[0]] = reads[0]  # a reshape sharing its input's storage
        for name in writes:
            sizes[name] = draw(st.integers(0, 300))
        steps.append((reads, writes))
        available.extend(writes)
    live_out = draw(st.lists(st.sampled_from(available), max_size=3, unique=True))
    return steps, sizes, available[:n_inputs], live_out, aliases


def lower_bound(lives):
    """Peak of the bytes live at any one step: no correct plan can use less.

    A difference array over steps (+size where a tensor is born, -size after it dies), so the scale test
    can use it too.
    """
    base = min(lt.first for lt in lives)
    delta = [0] * (max(lt.last for lt in lives) - base + 2)
    for lt in lives:
        delta[lt.first - base] += lt.nbytes
        delta[lt.last - base + 1] -= lt.nbytes
    return max(itertools.accumulate(delta))


def brute_force_ok(lives, offsets):
    """O(n^2) reference for the checker's overlap rule."""
    for a, b in itertools.combinations(lives, 2):
        if a.nbytes and b.nbytes and a.first <= b.last and b.first <= a.last:
            if offsets[a.name] < offsets[b.name] + b.nbytes and offsets[b.name] < offsets[a.name] + a.nbytes:
                return False
    return True


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.sampled_from([1, 16, 64]), st.sampled_from(["greedy_by_size", "naive"]))
def test_property_plans_are_valid_and_bounded(program, alignment, strategy):
    steps, sizes, live_in, live_out, aliases = program
    lives = lifetimes(steps, sizes, live_in=live_in, live_out=live_out, aliases=aliases)
    assert not set(aliases) & {lt.name for lt in lives}  # views get no storage
    offsets, arena = plan_memory(lives, alignment=alignment, strategy=strategy)
    check_plan(lives, offsets, arena, alignment=alignment)
    assert brute_force_ok(lives, offsets)
    assert arena <= no_reuse_bytes(lives, alignment)
    if lives:
        assert arena >= lower_bound(lives)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(0, 5), st.integers(0, 3)),
        min_size=1,
        max_size=8,
    )
)
def test_property_checker_agrees_with_brute_force(rows):
    # Random (first, length, offset in units of 16, size in units of 16) plans, most of them broken.
    lives = [Lifetime(f"t{i}", 16 * size, first, first + length) for i, (first, length, _, size) in enumerate(rows)]
    offsets = {f"t{i}": 16 * off for i, (_, _, off, _) in enumerate(rows)}
    arena = max(offsets[lt.name] + lt.nbytes for lt in lives)
    if brute_force_ok(lives, offsets):
        check_plan(lives, offsets, arena, alignment=16)
    else:
        with pytest.raises(MemoryPlanError, match="share bytes"):
            check_plan(lives, offsets, arena, alignment=16)


# --------------------------------------------------------------------------------------------------
# Scale
# --------------------------------------------------------------------------------------------------


def test_scale_long_chain_with_skip_connections():
    # 5,000 tensors: each step reads the previous tensor, every 4th also a skip from 8 steps back.
    n = 5000
    steps = [([f"t{i - 1}"] if i else []) + ([f"t{i - 8}"] if i >= 8 and i % 4 == 0 else []) for i in range(n)]
    steps = [(reads, [f"t{i}"]) for i, reads in enumerate(steps)]
    sizes = {f"t{i}": 64 * (1 + i % 7) for i in range(n)}
    lives = lifetimes(steps, sizes, live_out=[f"t{n - 1}"])
    assert len(lives) == n
    offsets, arena = plan_memory(lives)
    check_plan(lives, offsets, arena)
    assert arena >= lower_bound(lives)
    assert arena < no_reuse_bytes(lives) / 100  # only a handful of tensors are ever live together
