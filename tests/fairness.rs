//! The actor is a good citizen of its runtime (API.md, "Fairness and memory"): while it works
//! through a flood of commands, a drain or a shutdown, the other tasks of its runtime keep
//! being polled — on a current-thread runtime, where the actor shares the one thread with
//! everything else, and on a multi-thread one — and a job due meanwhile starts before the
//! flood is through.
//!
//! Asserted as outcomes, never as durations: a task of the runtime is polled *while* the work
//! is still in progress (the wheel's published counters, or timers resolved so far, say so),
//! and a drain leaves no per-entry work on the actor's thread. How long the longest gap of a
//! 10 ms heartbeat is during a flood (API.md's 100 ms) is a timing fact of the machine —
//! another process can preempt the heartbeat's thread for any time — and belongs to a
//! benchmark, not here.

#[path = "support/counting.rs"]
mod counting;
mod support;

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Context;
use std::time::Duration;

use counting::{Counting, allocated_by_this_thread};
use tokio_wheel::{Sleep, Wheel};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// By-key commands in a flood (a `set` and a `reset` per key), and sleeps registered in
/// another: enough that working through them takes an actor many of its turn budgets (1 to
/// 8 ms of real time each, after which it yields) — here, in a debug build on two cores, about
/// 30 — and still a few on a machine 50 times faster. (Past that, an actor may work through
/// a flood without needing to yield, and the flood tests would need a bigger one.)
const KEYED_FLOOD: u64 = 600_000;
const SLEEP_FLOOD: u64 = 300_000;

/// How long a test waits for what it awaits before it fails as hung: a guard, not a figure.
const HANG_GUARD: Duration = Duration::from_secs(60);

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Polls itself on the current runtime, yielding between polls, until `over()` holds; returns
/// how many polls came before that. Fails the test if `over()` does not hold within
/// [`HANG_GUARD`].
async fn polls_until(over: impl Fn() -> bool) -> u64 {
    let polls = async {
        let mut polls = 0;
        while !over() {
            polls += 1;
            tokio::task::yield_now().await;
        }
        polls
    };
    tokio::time::timeout(HANG_GUARD, polls)
        .await
        .expect("the work never completed (hang guard)")
}

/// The wheel's published count of commands taken, once it reaches `total`: an actor publishes
/// its counters at the end of each turn, so while a turn is still working through a flood
/// the count stays below.
fn applied(wheel: &Wheel, total: u64) -> bool {
    wheel.stats().commands >= total
}

/// Registers `count` sleeps an hour or more ahead (a poll files each), and keeps them.
fn register_sleeps(wheel: &Wheel, count: u64) -> Vec<Sleep> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    (0..count)
        .map(|i| {
            let mut sleep = wheel.sleep(Duration::from_secs(3_600 + i));
            assert!(Pin::new(&mut sleep).poll(&mut cx).is_pending());
            sleep
        })
        .collect()
}

/// Sets and resets [`KEYED_FLOOD`] / 2 keys an hour or more ahead. Each reset moves its key
/// earlier: a later one right behind its set would be merged into it in the queue, and the
/// actor would apply half the commands.
fn flood_keys(timers: &tokio_wheel::Timers<u64, u64>) {
    for key in 0..KEYED_FLOOD / 2 {
        timers.set(key, key, Duration::from_secs(5_400));
        timers.reset(&key, Duration::from_secs(3_600));
    }
}

/// A job due at once, queued ahead of `wheel`'s flood of `flood` commands: returns its
/// handle, which answers whether the job started before the wheel's actor was through the
/// flood (its turn, still working, had not published its count).
fn job_due_at_once(wheel: &Wheel, flood: u64) -> tokio_wheel::JobHandle<bool> {
    let probe = wheel.clone();
    let total = wheel.stats().commands + 1 + flood;
    wheel.spawn_after(Duration::ZERO, async move { !applied(&probe, total) })
}

/// Two wheels on `runtime`, each with its actor: one for the sleeps' flood and the job, one for
/// the keyed flood (so the job's check sees its own actor's count only).
fn two_wheels(runtime: &tokio::runtime::Runtime) -> (Wheel, Wheel) {
    let wheel = || Wheel::builder().runtime(runtime.handle().clone()).build();
    (wheel(), wheel())
}

/// Whether both floods are through: `sleeps` applied `1 + SLEEP_FLOOD` commands (the job's
/// and the flood's) and `keyed` [`KEYED_FLOOD`].
fn floods_applied(sleeps: &Wheel, keyed: &Wheel) -> bool {
    applied(sleeps, 1 + SLEEP_FLOOD) && applied(keyed, KEYED_FLOOD)
}

fn assert_polled_during_the_floods(polls: u64, job_started_during_its_flood: bool) {
    eprintln!(
        "a task of the runtime was polled {polls} times during the floods; \
         the job started during its flood: {job_started_during_its_flood}"
    );
    assert!(
        polls > 0,
        "no other task was polled while the actors worked through the floods"
    );
    assert!(
        job_started_during_its_flood,
        "a job due at the start of a flood started only once its actor was through it"
    );
}

/// The floods queued at once on a current-thread runtime: the sends are made on the runtime's
/// own thread before it runs (they never wait there: the actors need that very thread), so
/// each actor finds its whole flood in one take. An actor that worked through it without
/// yielding would leave no poll to another task before it was through (it yields once a
/// stretch of work outruns its budget), and would start the job due meanwhile only then.
/// Catches: an actor that starves its runtime.
#[test]
fn a_current_thread_runtime_keeps_polling_its_tasks_while_its_actors_work_through_a_flood() {
    let runtime = current_thread();
    let (sleeps_wheel, keyed_wheel) = two_wheels(&runtime);
    let (job, sleeps) = {
        let _on_its_thread = runtime.enter();
        let job = job_due_at_once(&sleeps_wheel, SLEEP_FLOOD);
        let (timers, expired) = keyed_wheel.keyed::<u64, u64>();
        drop(expired);
        flood_keys(&timers);
        (job, register_sleeps(&sleeps_wheel, SLEEP_FLOOD))
    };
    let polls = runtime.block_on(async {
        // `block_on` polls this future before any task of the runtime runs: let the actors
        // start first.
        tokio::task::yield_now().await;
        polls_until(|| floods_applied(&sleeps_wheel, &keyed_wheel)).await
    });
    let job_started_during_its_flood = runtime.block_on(job).expect("the job ran");
    assert_polled_during_the_floods(polls, job_started_during_its_flood);
    drop(sleeps);
    runtime.block_on(async {
        sleeps_wheel.shutdown().await;
        keyed_wheel.shutdown().await;
    });
}

/// The floods made by two other threads while the actors run on a 2-worker runtime (each
/// producer waits for its actor when its inbox shard is full): the runtime's other tasks are
/// polled and the job due meanwhile starts while they last. Catches a flood that holds both
/// workers. Weaker than the current-thread case (producers slower than the actors leave them
/// idle between turns, so an actor that never yielded could pass here), which is the sharp
/// one.
#[test]
fn a_multi_thread_runtime_fed_from_other_threads_keeps_polling_its_tasks() {
    let runtime = support::two_workers();
    let (sleeps_wheel, keyed_wheel) = two_wheels(&runtime);
    let job = job_due_at_once(&sleeps_wheel, SLEEP_FLOOD);
    let (timers, expired) = {
        let _entered = runtime.enter();
        keyed_wheel.keyed::<u64, u64>()
    };
    drop(expired);
    let beats = runtime.spawn({
        let (sleeps_wheel, keyed_wheel) = (sleeps_wheel.clone(), keyed_wheel.clone());
        async move {
            let started = || sleeps_wheel.stats().commands + keyed_wheel.stats().commands > 1;
            polls_until(started).await;
            polls_until(|| floods_applied(&sleeps_wheel, &keyed_wheel)).await
        }
    });
    let keyed = std::thread::spawn(move || flood_keys(&timers));
    let sleeps = {
        let wheel = sleeps_wheel.clone();
        std::thread::spawn(move || register_sleeps(&wheel, SLEEP_FLOOD))
    };
    keyed.join().unwrap();
    let sleeps = sleeps.join().unwrap();
    let polls = runtime.block_on(beats).unwrap();
    let job_started_during_its_flood = runtime.block_on(job).expect("the job ran");
    assert_polled_during_the_floods(polls, job_started_during_its_flood);
    drop(sleeps);
    runtime.block_on(async {
        sleeps_wheel.shutdown().await;
        keyed_wheel.shutdown().await;
    });
}

/// Runs `future` to completion on a runtime of the calling thread (the work thread's own).
fn block_on<F: Future>(future: F) -> F::Output {
    current_thread().block_on(future)
}

const BIG: u64 = 200_000;

std::thread_local! {
    /// Set on the thread that runs the actor's runtime.
    static ACTORS_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Values dropped on the actor's thread.
static DROPPED_BY_THE_ACTOR: AtomicUsize = AtomicUsize::new(0);

/// A keyed value that counts being dropped on the actor's thread.
struct Value;

impl Drop for Value {
    fn drop(&mut self) {
        if ACTORS_THREAD.with(Cell::get) {
            DROPPED_BY_THE_ACTOR.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A drain of a big set leaves its per-entry work to the caller: the actor hands its table
/// over whole in one short turn, and the caller turns it into pairs. So, between the drain
/// being sent and being answered, the actor's thread allocates next to nothing (no list of
/// 200 000 pairs: ~6 MiB) and drops no value. Catches an actor that walks the entries itself,
/// stalling its runtime for as long.
#[test]
fn draining_a_big_keyed_set_leaves_the_per_entry_work_to_the_caller() {
    let runtime = current_thread();
    let wheel = Wheel::builder().runtime(runtime.handle().clone()).build();
    let (timers, _expired) = {
        let _entered = runtime.enter();
        wheel.keyed::<u64, Value>()
    };
    // 0: filling; 1: about to drain; 2: the actor's thread took note; 3: drained; 4: noted.
    let step = Arc::new(AtomicU64::new(0));
    let caller = {
        let step = step.clone();
        std::thread::spawn(move || {
            for key in 0..BIG {
                timers.set(key, Value, Duration::from_secs(3_600));
            }
            assert_eq!(block_on(timers.len()) as u64, BIG, "all applied");
            let next = |from: u64| {
                step.store(from + 1, Ordering::SeqCst);
                while step.load(Ordering::SeqCst) != from + 2 {
                    std::thread::yield_now();
                }
            };
            next(0);
            let drained = block_on(timers.drain());
            next(2);
            drained.len() as u64
        })
    };
    let allocated_during_the_drain = runtime.block_on(async {
        ACTORS_THREAD.with(|here| here.set(true));
        polls_until(|| step.load(Ordering::SeqCst) == 1).await;
        let before = allocated_by_this_thread();
        step.store(2, Ordering::SeqCst);
        polls_until(|| step.load(Ordering::SeqCst) == 3).await;
        let after = allocated_by_this_thread();
        step.store(4, Ordering::SeqCst);
        after - before
    });
    assert_eq!(caller.join().unwrap(), BIG);
    eprintln!("the actor's thread allocated {allocated_during_the_drain} bytes during the drain");
    assert!(
        allocated_during_the_drain < 1 << 20,
        "the actor's thread allocated {allocated_during_the_drain} bytes for the drain"
    );
    assert_eq!(
        DROPPED_BY_THE_ACTOR.load(Ordering::Relaxed),
        0,
        "values dropped on the actor's thread"
    );
}

/// Sleeps of a big set of pending ones whose resolution the heartbeat watches.
const WATCHED: usize = 64;

/// A shutdown with 200 000 keyed entries, sleeps and jobs each pending resolves them in
/// batches, yielding between them: another task of the runtime is polled while some of the
/// sleeps are resolved and others not yet. Catches a shutdown that resolves everything in one
/// go, stalling its runtime for as long. Everything is resolved once: the entries are
/// delivered marked as flushed by the shutdown, the jobs answer `Shutdown`.
#[test]
fn shutting_down_with_many_timers_pending_lets_the_runtime_poll_its_tasks_meanwhile() {
    let runtime = current_thread();
    let wheel = Wheel::builder().runtime(runtime.handle().clone()).build();
    let watched: Arc<Mutex<Vec<Sleep>>> = Arc::default();
    let ready = Arc::new(AtomicBool::new(false));
    let worker = {
        let (wheel, watched, ready) = (wheel.clone(), watched.clone(), ready.clone());
        std::thread::spawn(move || {
            let (timers, mut expired) = block_on(async { wheel.keyed::<u64, String>() });
            for key in 0..BIG {
                timers.set(key, "x".to_owned(), Duration::from_secs(3_600));
            }
            let mut sleeps = register_sleeps(&wheel, BIG);
            let every = sleeps.len() / WATCHED;
            *watched.lock().unwrap() = (0..WATCHED).map(|i| sleeps.remove(i * every)).collect();
            let jobs: Vec<_> = (0..BIG)
                .map(|i| wheel.spawn_after(Duration::from_secs(3_600 + i), async {}))
                .collect();
            block_on(async {
                wheel.flush().await;
                assert_eq!(timers.len().await as u64, BIG);
                ready.store(true, Ordering::SeqCst);
                wheel.shutdown().await;
                let mut flushed = 0;
                while let Some(expiry) = futures::StreamExt::next(&mut expired).await {
                    assert!(expiry.is_shutdown());
                    flushed += 1;
                }
                assert_eq!(flushed, BIG);
                for job in jobs {
                    assert_eq!(job.await, Err(tokio_wheel::JobError::Shutdown));
                }
            });
            drop(sleeps);
        })
    };
    let resolved = || {
        let watched = watched.lock().unwrap();
        watched.iter().filter(|sleep| sleep.is_elapsed()).count()
    };
    let polls_midway = runtime.block_on(async {
        polls_until(|| ready.load(Ordering::SeqCst)).await;
        let midway = AtomicU64::new(0);
        polls_until(|| {
            let resolved = resolved();
            if resolved > 0 && resolved < WATCHED {
                midway.fetch_add(1, Ordering::Relaxed);
            }
            resolved == WATCHED
        })
        .await;
        midway.load(Ordering::Relaxed)
    });
    eprintln!("polled {polls_midway} times with the shutdown midway");
    assert!(
        polls_midway > 0,
        "no other task was polled while the shutdown resolved the pending sleeps"
    );
    runtime.block_on(async {
        // The worker awaits the shutdown from its own thread: let the actors finish it.
        polls_until(|| worker.is_finished()).await;
    });
    worker.join().unwrap();
}
