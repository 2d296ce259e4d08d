"""Slab layout and allocator invariants (property-based)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_saria.storage.allocator import SlotAllocator
from sglang_saria.storage.layout import SlabLayout

UNIT = 4096


@settings(max_examples=200, deadline=None)
@given(
    ndirs=st.integers(1, 4),
    units_per_dir=st.integers(1, 4),
    size=st.integers(1, 200_000),
    gap=st.integers(0, 3),
    data=st.data(),
)
def test_plan_covers_each_object_byte_once_within_its_own_slots(ndirs, units_per_dir, size, gap, data):
    layout = SlabLayout(tuple(f"/d{j}" for j in range(ndirs)), UNIT * units_per_dir * ndirs, 10_000)
    n = layout.slots_for(size)
    first = data.draw(st.integers(0, 100))
    slots = [first]
    for i in range(1, n):  # runs of adjacent slots broken by gaps, as after evictions
        slots.append(slots[-1] + 1 + (gap if i % 2 else 0))
    subs = layout.plan(slots, size)
    covered = sorted(r for sub in subs for r in sub.ranges)
    assert covered[0][0] == 0 and covered[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))  # no gap, no overlap
    for sub in subs:
        # Each run stays inside the object's own slots on its drive.
        for k, (lo, hi) in enumerate(sub.ranges):
            slot = (sub.file_offset // layout.unit) + k
            assert slot in slots and hi - lo <= layout.unit
            assert (lo // layout.slot_bytes) == slots.index(slot)
            assert (lo % layout.slot_bytes) // layout.unit == sub.dir_idx
        assert sub.file_offset % UNIT == 0


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 5)), max_size=60))
def test_allocator_never_hands_out_a_slot_twice(ops):
    alloc = SlotAllocator(32)
    held: list[list[int]] = []
    for take, n in ops:
        if take and alloc.free_slots >= n:
            got = alloc.take(n)
            assert got == sorted(got)
            held.append(got)
        elif held:
            alloc.release(held.pop(0))
        in_use = [s for h in held for s in h]
        assert len(in_use) == len(set(in_use)) and alloc.free_slots == 32 - len(in_use)
    # Reopen from the used set (recovery) and keep going without collisions.
    again = SlotAllocator(32, used=[s for h in held for s in h])
    fresh = again.take(again.free_slots)
    assert not set(fresh) & {s for h in held for s in h}
