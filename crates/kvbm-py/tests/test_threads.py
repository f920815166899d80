"""Many Python threads on one pool or scheduler: no crash, no deadlock,
nothing lost."""

import random
import threading

import kvbm

JOIN_TIMEOUT_S = 120


def run_threads(target, count):
    errors = []

    def guarded(index):
        try:
            target(index)
        except Exception as err:  # surfaced below, with the thread's index
            errors.append((index, err))

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT_S)
        assert not thread.is_alive(), "a thread is stuck: deadlock"
    assert errors == []


def test_threads_hammering_one_pool():
    pool = kvbm.BlockPool(64, 4, events=True)
    shared = kvbm.Sequence(list(range(16)), 4)  # four blocks every thread matches
    prefix = pool.allocate(4)
    pool.register(prefix, shared)
    pool.release(prefix)

    def worker(index):
        rng = random.Random(index)
        for _ in range(300):
            held = pool.match_prefix(shared)
            try:
                fresh = pool.allocate(rng.randint(1, 6))
            except kvbm.PoolExhaustedError:
                fresh = []
            if fresh and len(held) == 4 and rng.random() < 0.5:
                tokens = list(range(16)) + [index] * 4 * len(fresh)
                ids = pool.register(fresh, kvbm.Sequence(tokens, 4), position=4)
                held += ids
                fresh = []
            try:
                pool.release([-1])
            except kvbm.InvalidArgumentError:
                pass
            pool.release(held + fresh)
            if rng.random() < 0.1:
                pool.take_events()
            if rng.random() < 0.05:
                pool.audit()

    run_threads(worker, 8)
    assert pool.num_held == 0
    metrics = pool.metrics()
    assert metrics["in_use_blocks"] == 0
    assert metrics["free_blocks"] + metrics["inactive_blocks"] == 64
    assert pool.audit()["total_blocks"] == 64


def test_threads_submitting_while_one_steps():
    scheduler = kvbm.Scheduler(256, 16, max_running=32)
    submitted = threading.Event()
    per_thread = 100

    def submitter(index):
        rng = random.Random(index)
        for n in range(per_thread):
            request_id = index * per_thread + n
            scheduler.submit(request_id, [rng.randrange(100)] * rng.randint(1, 90), rng.randint(1, 8))
            if rng.random() < 0.1:
                scheduler.cancel(request_id)
            if rng.random() < 0.2:  # reads that wait for a step's lock
                assert scheduler.census()["submitted"] >= 1
                scheduler.metrics()
                scheduler.running_ids

    finished = []

    def stepper():
        while not (submitted.is_set() and scheduler.is_idle):
            plan = scheduler.step()
            finished.extend(plan.finished)
            finished.extend(scheduler.apply(plan.sample_all(3)).finished)

    step_thread = threading.Thread(target=stepper)
    step_thread.start()
    run_threads(submitter, 4)
    submitted.set()
    step_thread.join(JOIN_TIMEOUT_S)
    assert not step_thread.is_alive(), "the stepping thread is stuck"
    assert sorted(f.request_id for f in finished) == list(range(4 * per_thread))
    census = scheduler.audit()
    assert census["submitted"] == census["finished"] + census["aborted"] == 4 * per_thread


def test_threads_racing_to_step_one_scheduler():
    scheduler = kvbm.Scheduler(128, 16)
    for i in range(50):
        scheduler.submit(i, [i] * 20, 5)

    def racer(_index):
        for _ in range(2000):
            if scheduler.is_idle:
                return
            try:
                plan = scheduler.step()
                scheduler.apply(plan.sample_all(1))
            except kvbm.SchedulerError:
                pass  # another thread's step is pending, or none is

    run_threads(racer, 4)
    assert scheduler.audit()["finished"] == 50
