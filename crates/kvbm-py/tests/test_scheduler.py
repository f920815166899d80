"""The scheduler driven as an engine drives it: submit, step, run, apply."""

import pytest

import kvbm

SYSTEM = list(range(64))  # a shared system prompt: four 16-token blocks


def run_to_completion(scheduler, token=7, max_steps=100_000):
    """Steps until idle with a stand-in engine; returns the finished list."""
    finished = []
    for _ in range(max_steps):
        if scheduler.is_idle:
            return finished
        plan = scheduler.step()
        finished += plan.finished
        report = scheduler.apply(plan.sample_all(token))
        finished += report.finished
    raise AssertionError("the scheduler did not go idle")


def test_a_synthetic_workload_runs_to_completion_with_prefix_hits():
    scheduler = kvbm.Scheduler(512, 16, max_running=16, token_budget=1024)
    for i in range(100):
        scheduler.submit(i, SYSTEM + [1000 + i] * (i % 20 + 1), 1 + i % 9)
    finished = run_to_completion(scheduler)
    assert sorted(f.request_id for f in finished) == list(range(100))
    assert all(f.reason == "max_tokens" for f in finished)
    by_id = {f.request_id: f for f in finished}
    assert by_id[10].generated_tokens == 2
    census = scheduler.audit()
    assert census["submitted"] == census["finished"] == 100
    assert census["generated_tokens"] == sum(1 + i % 9 for i in range(100))
    assert census["prefix_hit_tokens"] > 0
    metrics = scheduler.metrics()
    assert metrics["prefix_cache_hits"] > 0
    assert metrics["num_requests_running"] == 0
    assert metrics["kv_cache_usage"] == 0.0


def test_a_plan_is_an_object_with_work_items():
    scheduler = kvbm.Scheduler(64, 16)
    scheduler.submit(1, SYSTEM + [5, 6], 3)
    plan = scheduler.step()
    assert plan.step == 0 and len(plan) == 1 and not plan.is_empty
    (work,) = list(plan)
    assert isinstance(work, kvbm.PrefillWork)
    assert (work.request_id, work.start, work.num_tokens) == (1, 0, 66)
    assert work.emits_token and work.resumed
    assert len(work.new_blocks) == 5
    assert plan.request_ids == [1] and plan.num_tokens == 66
    assert scheduler.block_table(1) == work.new_blocks
    report = scheduler.apply({1: 42})
    assert report.first_tokens == [1] and report.generated_tokens == 1
    assert scheduler.tokens(1)[-1] == 42
    plan = scheduler.step()
    (decode,) = plan.decode
    assert isinstance(decode, kvbm.DecodeWork)
    assert decode.position == 66
    assert "StepPlan(step=1" in repr(plan)
    assert "DecodeWork(request_id=1" in repr(decode)
    report = scheduler.apply({1: 43}, stop=[1])
    assert report.finished == [report.finished[0]]
    assert report.finished[0].reason == "stop"
    assert scheduler.is_idle


def test_preemption_under_a_small_pool_still_finishes_everyone():
    scheduler = kvbm.Scheduler(24, 16, max_running=8, watermark_blocks=0, reserve=0)
    for i in range(12):
        scheduler.submit(i, [i] * 40, 60)
    finished = run_to_completion(scheduler)
    assert len(finished) == 12
    census = scheduler.audit()
    assert census["preemptions"] > 0
    assert census["finished"] == 12


def test_cancel_and_abort():
    scheduler = kvbm.Scheduler(64, 16)
    for i in range(3):
        scheduler.submit(i, SYSTEM, 50)
    scheduler.apply(scheduler.step().sample_all(1))
    assert scheduler.is_running(0)
    assert scheduler.cancel(0)
    assert not scheduler.cancel(99)
    aborted = scheduler.abort(1)
    assert (aborted.request_id, aborted.reason) == (1, "aborted")
    plan = scheduler.step()
    report = scheduler.apply(plan.sample_all(1))
    assert [(f.request_id, f.reason) for f in report.finished] == [(0, "cancelled")]
    with pytest.raises(kvbm.SchedulerError, match="not waiting or running"):
        scheduler.abort(1)
    census = scheduler.census()
    assert census["aborted"] == 2 and census["running"] == 1
    run_to_completion(scheduler)
    assert scheduler.audit()["finished"] == 1


def test_speculative_outputs_are_lists():
    scheduler = kvbm.Scheduler(64, 16, speculative_tokens=2)
    scheduler.submit(7, SYSTEM, 20)
    scheduler.apply(scheduler.step().sample_all(1))
    plan = scheduler.step()
    (decode,) = plan.decode
    assert decode.draft_tokens == 2
    report = scheduler.apply({7: [11, 12, 13]})  # both drafts accepted, then 13
    assert report.generated_tokens == 3
    assert report.verified_draft_tokens == 2 and report.accepted_draft_tokens == 2
    plan = scheduler.step()
    report = scheduler.apply({7: [21]})  # every draft rejected
    assert report.accepted_draft_tokens == 0
    assert isinstance(report.rolled_back, dict)


def test_speculative_steps_with_kv_groups_roll_back_every_groups_tail():
    scheduler = kvbm.Scheduler(64, 16, groups="sliding_window:32:1,full:1", speculative_tokens=3)
    scheduler.submit(7, SYSTEM[:62], 20)
    scheduler.apply(scheduler.step().sample_all(1))
    plan = scheduler.step()
    (decode,) = plan.decode
    # Slots 62 to 65: the drafts reach a fifth block in each group.
    assert decode.position == 62 and decode.draft_tokens == 3
    assert [len(new) for _, new in decode.groups] == [1, 1]
    report = scheduler.apply({7: [21]})  # every draft rejected
    assert report.accepted_draft_tokens == 0
    groups = report.rolled_back_groups[7]
    assert groups == [new for _, new in decode.groups]
    assert report.rolled_back[7] == groups[0]
    run_to_completion(scheduler)
    assert scheduler.audit()["finished"] == 1


def test_refusals_change_nothing():
    scheduler = kvbm.Scheduler(16, 16)
    scheduler.submit(1, [1, 2, 3], 4)
    with pytest.raises(kvbm.SchedulerError, match="already"):
        scheduler.submit(1, [1, 2, 3], 4)
    with pytest.raises(kvbm.InvalidArgumentError):
        scheduler.submit(2, [], 4)
    with pytest.raises(kvbm.SchedulerError, match="blocks"):
        scheduler.submit(3, list(range(16 * 17)), 4)
    with pytest.raises(kvbm.SchedulerError, match="no step is pending"):
        scheduler.apply({})
    plan = scheduler.step()
    with pytest.raises(kvbm.SchedulerError, match="not applied"):
        scheduler.step()
    with pytest.raises(kvbm.SchedulerError, match="no engine output"):
        scheduler.apply({})
    with pytest.raises(kvbm.SchedulerError, match="did not schedule"):
        scheduler.apply({1: 5, 99: 5})
    with pytest.raises(kvbm.InvalidArgumentError):
        scheduler.apply({1: []})
    with pytest.raises(TypeError):
        scheduler.apply({1: "token"})
    with pytest.raises(kvbm.InvalidArgumentError):
        scheduler.apply({1: -5})
    with pytest.raises(kvbm.InvalidArgumentError, match="stop names"):
        scheduler.apply({1: 5}, stop=[2])
    scheduler.apply(plan.sample_all(5))  # the plan is still pending and applies
    assert scheduler.census()["generated_tokens"] == 1


def test_events_and_pool_metrics():
    scheduler = kvbm.Scheduler(64, 16, events=True)
    scheduler.submit(1, SYSTEM, 2)
    run_to_completion(scheduler)
    kinds = [e["type"] for e in scheduler.take_events()]
    assert kinds[0] == "resync" and "stored" in kinds
    assert scheduler.pool_metrics()["inactive_blocks"] == 4
    assert "Scheduler(num_blocks=64" in repr(scheduler)
    with pytest.raises(kvbm.SchedulerError, match="events=True"):
        kvbm.Scheduler(8).take_events()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_running": 0},
        {"token_budget": 0},
        {"chunk_size": 0},
        {"preemption": "sometimes"},
        {"eviction": "fifo"},
        {"reserve": "most"},
        {"reserve": -1},
    ],
)
def test_bad_configurations_are_value_errors(kwargs):
    with pytest.raises(ValueError):
        kvbm.Scheduler(16, 16, **kwargs)


WINDOW_MODEL = "sliding_window:32:2,full:2"  # two groups, a 32-token window


def test_kv_groups_give_a_table_per_group_that_the_plans_describe():
    scheduler = kvbm.Scheduler(256, 16, groups=WINDOW_MODEL, max_running=4, chunk_size=64)
    assert scheduler.kv_groups == [("full", None, 2), ("sliding_window", 32, 2)]
    for i in range(6):
        scheduler.submit(i, SYSTEM + [1000 + i] * (40 + 9 * i), 40)
    # An engine's tables, kept only from the plans' group updates.
    tables = {}
    unchanged = 0
    for _ in range(10_000):
        if scheduler.is_idle:
            break
        plan = scheduler.step()
        for work in list(plan.prefill) + list(plan.decode):
            if not work.groups:
                assert not work.resumed and work.new_blocks == []
                unchanged += 1
                continue
            assert len(work.groups) == 2
            assert work.groups[0][1] == work.new_blocks
            if work.resumed or work.request_id not in tables:
                tables[work.request_id] = [(first, []) for first, _ in work.groups]
            for table, (_, blocks) in zip(tables[work.request_id], work.groups):
                table[1].extend(blocks)
        # What the engine runs this step with is the scheduler's tables
        # (after an apply that deduplicated a block, the next plan sends
        # the whole table again).
        for request_id in plan.request_ids:
            for group, (first, engine) in enumerate(tables[request_id]):
                held_first, held = scheduler.group_block_table(request_id, group)
                assert first <= held_first
                assert engine[held_first - first:] == held
        scheduler.apply(plan.sample_all(7))
        for request_id in scheduler.running_ids:
            # The window group holds the blocks of its last 32 tokens and
            # the tail's: at most 3 blocks of 16 tokens and 1 ahead.
            assert len(scheduler.group_block_table(request_id, 1)[1]) <= 4
        assert len(scheduler.held_blocks_by_group()) == 2
    assert scheduler.is_idle
    assert unchanged > 0
    census = scheduler.audit()
    assert census["finished"] == 6
    assert scheduler.group_block_table(0, 0) is None


def test_kv_groups_of_a_preset_and_refusals():
    scheduler = kvbm.Scheduler(64, 16, model="gpt-oss-20b")
    assert [kind for kind, _, _ in scheduler.kv_groups] == ["full", "sliding_window"]
    assert kvbm.Scheduler(64, 16).kv_groups is None
    for kwargs in [
        {"model": "gpt-9"},
        {"model": "gpt-oss-20b", "groups": "full:2"},
        {"groups": "sliding_window:20:2,full:2"},  # not a multiple of 16
        {"groups": "diagonal:2"},
        {"groups": ""},
    ]:
        with pytest.raises(kvbm.InvalidArgumentError):
            kvbm.Scheduler(64, 16, **kwargs)


def test_priorities_and_salts():
    scheduler = kvbm.Scheduler(64, 16, max_running=1)
    scheduler.submit(1, SYSTEM, 1, priority="low")
    scheduler.submit(2, SYSTEM, 1, priority="critical", salt="tenant")
    plan = scheduler.step()
    assert plan.request_ids == [2]
    with pytest.raises(kvbm.InvalidArgumentError, match="priority"):
        scheduler.submit(3, SYSTEM, 1, priority="urgent")


def test_decodes_in_place_match_step_and_apply():
    """Two schedulers, one stepping every step, one running decodes in
    place wherever it can: same tokens, same finishes, same step numbers."""

    def workload():
        scheduler = kvbm.Scheduler(256, 16, max_running=8, token_budget=512)
        for i in range(12):
            scheduler.submit(i, SYSTEM + [2000 + i] * (i % 5 + 1), 20 + i)
        return scheduler

    plain, fast = workload(), workload()
    plain_finished, fast_finished = [], []
    in_place = 0
    for _ in range(10_000):
        if fast.is_idle:
            break
        steps, requests = fast.run_decodes_in_place(1_000, token=7)
        in_place += steps
        assert (steps == 0) == (requests == 0)
        for _ in range(steps):
            # The same steps, through the plan: decodes only, nothing else.
            plan = plain.step()
            assert len(plan.decode) == requests and not plan.prefill
            report = plain.apply(plan.sample_all(7))
            assert not report.finished and not plan.finished
        steps_planned = []
        for scheduler, finished in ((plain, plain_finished), (fast, fast_finished)):
            plan = scheduler.step()
            finished += plan.finished
            report = scheduler.apply(plan.sample_all(7))
            finished += report.finished
            steps_planned.append((plan.step, plan.request_ids))
        assert steps_planned[0] == steps_planned[1]
        for i in fast.running_ids:
            assert fast.tokens(i) == plain.tokens(i)
    assert fast.is_idle and plain.is_idle
    assert in_place > 0
    key = lambda f: f.request_id  # noqa: E731
    assert [(f.request_id, f.generated_tokens) for f in sorted(fast_finished, key=key)] == [
        (f.request_id, f.generated_tokens) for f in sorted(plain_finished, key=key)
    ]
    assert fast.audit() == plain.audit()


def test_decodes_in_place_refuse_what_they_cannot_run():
    scheduler = kvbm.Scheduler(64, 16)
    assert scheduler.run_decodes_in_place(10) == (0, 0)  # nothing running
    scheduler.submit(1, [3] * 5, 50)
    plan = scheduler.step()
    assert scheduler.run_decodes_in_place(10) == (0, 0)  # a plan is pending
    scheduler.apply(plan.sample_all(1))
    assert scheduler.run_decodes_in_place(0) == (0, 0)
    # Slots 5 to 15 lie in the first block: ten decodes, the eleventh
    # would complete it.
    assert scheduler.run_decodes_in_place(100, token=9) == (10, 1)
    assert scheduler.tokens(1)[-10:] == [9] * 10
    assert scheduler.step().step == 11
    with pytest.raises(ValueError):
        scheduler.run_decodes_in_place(-1)
    with pytest.raises(ValueError):
        scheduler.run_decodes_in_place(1, token=2**32)


@pytest.mark.parametrize("groups", [None, WINDOW_MODEL])
def test_slot_mapping_puts_every_token_in_its_block(groups):
    scheduler = kvbm.Scheduler(256, 16, groups=groups, max_running=4, chunk_size=48)
    for i in range(5):
        scheduler.submit(i, SYSTEM + [2000 + i] * (30 + 7 * i), 20)
    group_count = 2 if groups else 1
    steps = 0
    while not scheduler.is_idle:
        plan = scheduler.step()
        steps += 1
        for group in range(group_count):
            slots = scheduler.slot_mapping(plan, group)
            assert slots.typecode == "q" and len(slots) == plan.num_tokens
            at = 0
            for work in plan:
                first, table = scheduler.group_block_table(work.request_id, group)
                if isinstance(work, kvbm.PrefillWork):
                    positions = range(work.start, work.start + work.num_tokens)
                else:
                    positions = range(work.position, work.position + 1 + work.draft_tokens)
                for position in positions:
                    block = table[position // 16 - first]
                    assert slots[at] == block * 16 + position % 16
                    at += 1
        # A group the model does not have pads every token.
        assert set(scheduler.slot_mapping(plan, group_count)) <= {-1}
        scheduler.apply(plan.sample_all(7))
        with pytest.raises(kvbm.SchedulerError):
            scheduler.slot_mapping(plan)  # applied: no longer pending
    assert steps > 5


def test_slot_mapping_pads_a_request_aborted_mid_step():
    scheduler = kvbm.Scheduler(64, 16)
    scheduler.submit(0, list(range(40)), 4)
    scheduler.submit(1, list(range(100, 130)), 4)
    plan = scheduler.step()
    before = scheduler.slot_mapping(plan)
    scheduler.abort(1)  # after planning, before the engine reports
    after = scheduler.slot_mapping(plan)
    assert len(after) == len(before) == 70
    assert list(after[:40]) == list(before[:40])  # request 0's chunk, unchanged
    assert list(after[40:]) == [-1] * 30  # vLLM's PAD_SLOT_ID
    scheduler.apply({0: 7})


def serve_with_transfers(scheduler, fail_loads=False, max_steps=10_000):
    """Steps until idle, running every planned transfer at once: stores
    complete; loads complete, or fail with ``fail_loads``. Returns the
    transfers seen."""
    seen = []
    for _ in range(max_steps):
        if scheduler.is_idle and scheduler.transfers_in_flight == 0:
            return seen
        plan = scheduler.step()
        seen += plan.transfers
        loads = [t.transfer_id for t in plan.transfers if t.kind == "load"]
        stores = [t.transfer_id for t in plan.transfers if t.kind == "store"]
        if fail_loads:
            scheduler.report_transfers(completed=stores, failed=loads)
        else:
            scheduler.report_transfers(completed=stores + loads)
        scheduler.apply(plan.sample_all(7))
    raise AssertionError("the scheduler did not go idle")


def push_off_the_device(scheduler):
    """Serves three other 150-token requests (ids 1-3), pushing what came
    before off a 16- to 24-block device (lower tiers keep it)."""
    for i in range(1, 4):
        scheduler.submit(i, [3000 + 100 * i + j for j in range(150)], 2)
    serve_with_transfers(scheduler)


def test_a_host_tier_onboards_a_prefix_the_device_evicted():
    # 16 device blocks, a 64-block host: request 0's four prompt blocks are
    # written through, then pushed off the device by other requests.
    scheduler = kvbm.Scheduler(16, 16, host_blocks=64, watermark_blocks=0)
    scheduler.submit(0, SYSTEM + [5], 2)
    stores = serve_with_transfers(scheduler)
    assert stores and all(t.kind == "store" and (t.source, t.destination) == (0, 1) for t in stores)
    assert sum(t.num_blocks for t in stores) >= 4
    push_off_the_device(scheduler)
    # The prompt again: its prefix is on the host only, so it onboards.
    scheduler.submit(9, SYSTEM + [6], 2)
    plan = scheduler.step()
    loads = [t for t in plan.transfers if t.kind == "load"]
    assert len(loads) == 1 and (loads[0].source, loads[0].destination) == (1, 0)
    assert loads[0].num_blocks == 4 and len(loads[0].hashes) == 4
    assert scheduler.census()["onboarding"] == 1
    assert 9 not in plan.request_ids  # it waits for its loads
    scheduler.apply(plan.sample_all(7))
    scheduler.report_transfers(completed=[loads[0].transfer_id])
    with pytest.raises(kvbm.SchedulerError):
        scheduler.report_transfers(completed=[loads[0].transfer_id])  # twice
    plan = scheduler.step()
    (prefill,) = [w for w in plan.prefill if w.request_id == 9]
    assert prefill.start == 64  # only the rest is computed
    scheduler.apply(plan.sample_all(7))
    serve_with_transfers(scheduler)
    stats = scheduler.onboard_stats()
    assert stats["requests"] == 1 and stats["blocks"] == 4 and stats["loaded_from"][0] == 4
    assert scheduler.audit()["finished"] == 5


def test_a_failed_load_is_recomputed_and_bad_reports_change_nothing():
    scheduler = kvbm.Scheduler(16, 16, host_blocks=64, watermark_blocks=0)
    scheduler.submit(0, SYSTEM + [5], 2)
    serve_with_transfers(scheduler)
    push_off_the_device(scheduler)
    with pytest.raises(kvbm.SchedulerError):
        scheduler.report_transfers(completed=[10**9])  # never planned
    scheduler.submit(9, SYSTEM + [6], 2)
    seen = serve_with_transfers(scheduler, fail_loads=True)
    assert any(t.kind == "load" for t in seen)
    census = scheduler.audit()
    assert census["finished"] == 5 and census["prefix_hit_tokens"] == 0
    assert scheduler.transfers_in_flight == 0


def test_a_grouped_schedulers_events_name_each_blocks_group():
    scheduler = kvbm.Scheduler(64, 16, groups="sliding_window:32:1,full:1", events=True)
    scheduler.submit(0, SYSTEM + [5], 2)
    run_to_completion(scheduler)
    stored = [h for e in scheduler.take_events() if e["type"] == "stored" for h in e["hashes"]]
    # Four full blocks in each group, keyed alike but for the group.
    assert sorted(kvbm.group_of(h) for h in stored) == [0] * 4 + [1] * 4
    full = {h for h in stored if kvbm.group_of(h) == 0}
    assert {kvbm.without_group(h) for h in stored} == full
    assert full == set(kvbm.block_hashes(SYSTEM + [5], 16))
    with pytest.raises(OverflowError):
        kvbm.group_of(-1)


def test_kv_groups_with_a_host_tier_onboard_only_what_each_group_reads():
    # A full group and a 32-token window (two blocks) over 24 device
    # blocks: request 0's prompt goes down to the host in both groups.
    groups = "sliding_window:32:1,full:1"
    scheduler = kvbm.Scheduler(24, 16, groups=groups, host_blocks=256, watermark_blocks=0)
    scheduler.submit(0, SYSTEM + [5], 2)
    stores = serve_with_transfers(scheduler)
    assert sum(t.num_blocks for t in stores) == 2 * 4  # both groups' full blocks
    push_off_the_device(scheduler)
    scheduler.submit(9, SYSTEM + [6], 2)
    plan = scheduler.step()
    loads = [t for t in plan.transfers if t.kind == "load"]
    assert loads and scheduler.census()["onboarding"] == 1
    # A hit of four blocks, all evicted from the device, in one transfer
    # from the host: the full group's blocks 0-3, then only the two the
    # window's 32 tokens read (2, 3).
    assert [t.num_blocks for t in loads] == [4 + 2]
    scheduler.apply(plan.sample_all(7))
    scheduler.report_transfers(completed=[t.transfer_id for t in loads])
    plan = scheduler.step()
    (prefill,) = [w for w in plan.prefill if w.request_id == 9]
    assert prefill.start == 64  # only the rest is computed
    # Groups are made as vLLM makes them, full attention first.
    first, table = scheduler.group_block_table(9, 0)
    assert first == 0 and len(table) == 5  # the full group: every block
    first, table = scheduler.group_block_table(9, 1)
    assert first == 2 and len(table) == 3  # the window: blocks 2 to 4
    scheduler.apply(plan.sample_all(7))
    serve_with_transfers(scheduler)
    assert scheduler.onboard_stats()["requests"] == 1
    assert scheduler.audit()["finished"] == 5


def test_tier_options_are_checked():
    for kwargs in [
        {"host_blocks": 0},
        {"disk_blocks": 8},
        {"host_blocks": 8, "offload": "sometimes"},
        {"host_blocks": 8, "max_onboarding_blocks": 0},
        {"host_blocks": -1},
    ]:
        with pytest.raises(kvbm.InvalidArgumentError):
            kvbm.Scheduler(16, 16, **kwargs)
    with pytest.raises(TypeError):
        kvbm.Scheduler(16, 16, host_blocks="many")
    plain = kvbm.Scheduler(16, 16)
    with pytest.raises(kvbm.SchedulerError):
        plain.report_transfers(completed=[0])  # no tiers: nothing planned
    plain.report_transfers()  # nothing to report is fine
    assert plain.transfers_in_flight == 0 and plain.take_transfers() == []
