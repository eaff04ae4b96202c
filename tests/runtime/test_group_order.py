"""A group's prompt is a function of its id: groups are created in id order, whichever
replica's assignment asks for one first (the data order every policy and replica count
trains, and what reproducible mode needs)."""

from __future__ import annotations

from types import SimpleNamespace

from bidirl.runtime.group_ids import GroupIds
from bidirl.runtime.group_store import GroupStore
from bidirl.runtime.rollout_driver import RolloutDriver


def _driver(offset: int = 0, store: GroupStore | None = None):
    store = store or GroupStore(n=2, max_new_tokens=4, temperature=1.0, seed=0)
    prompts = iter(range(1000))
    made = []

    def new_group(gid: int) -> None:
        p = next(prompts)  # the data cursor: the next prompt, in creation order
        made.append(gid)
        store.add(gid, f"u{p}", [p], "copy", str(p))

    ex = SimpleNamespace(spec=SimpleNamespace(n_units=2, n_replicas=2),
                         job=SimpleNamespace(store=store, new_group=new_group, ids=GroupIds(first_new=offset),
                                             version_offset=0))
    return RolloutDriver(ex), store, made


def test_groups_are_created_in_id_order_whatever_asks_first():
    d, store, made = _driver()
    d._create_through(2)  # replica 0 got [0, 2] first
    d._create_through(0)
    d._create_through(3)  # replica 1 got [1, 3]
    d._create_through(1)
    assert made == [0, 1, 2, 3]
    assert [store.groups[g].prompt_ids for g in range(4)] == [[0], [1], [2], [3]]


def test_a_resumed_store_continues_after_its_groups():
    store = GroupStore(n=2, max_new_tokens=4, temperature=1.0, seed=0)
    for g in (8, 9):  # buffered at the checkpoint; groups 0-7 were trained before it
        store.add(g, f"old{g}", [g], "copy", "1")
    d, _, made = _driver(offset=8, store=store)
    d._create_through(11)
    assert made == [10, 11]
