//! Sleeps, timeouts and jobs on several timer shards (`Builder::timer_shards`): each thread
//! registers on its own shard's actor, and every promise of one actor holds over all of them —
//! never early, commands in order, `flush` over every shard, stats that add up, shutdown that
//! resolves everything.

mod support;

use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::thread;
use std::time::Duration;

use futures::future::join_all;
use tokio::time::Instant;
use tokio_wheel::{JobError, Sleep, Wheel};

use support::{Rng, poll_once, two_workers};

const THREADS: usize = 8;
const SHARDS: usize = 4;

/// Runs `work(thread index)` on `THREADS` plain threads at once, each inside the runtime's
/// context (so `Instant::now()` is the runtime's clock, paused or not) and each a thread the
/// wheel has not seen: they spread over the timer shards.
fn on_threads<T: Send + 'static>(
    runtime: &tokio::runtime::Handle,
    work: impl Fn(usize) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let work = Arc::new(work);
    let threads: Vec<_> = (0..THREADS)
        .map(|index| {
            let (runtime, work) = (runtime.clone(), work.clone());
            thread::spawn(move || {
                let _entered = runtime.enter();
                work(index)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// A sleep registered (polled once) on the calling thread.
fn registered(wheel: &Wheel, deadline: Instant) -> Sleep {
    let mut sleep = wheel.sleep_until(deadline);
    assert!(poll_once(&mut sleep).is_pending());
    sleep
}

#[test]
fn sleeps_from_many_threads_all_complete_and_none_early() {
    let runtime = two_workers();
    let wheel = runtime.block_on(async { Wheel::builder().timer_shards(SHARDS).build() });
    let per_thread = 200;
    let w = wheel.clone();
    let early = on_threads(runtime.handle(), move |index| {
        let mut rng = Rng(index as u64 + 1);
        let start = Instant::now();
        let sleeps = (0..per_thread).map(|_| {
            // A second ahead: a sleep first polled after its deadline is ready without
            // registering, and the counts below expect every one registered.
            let deadline = start + Duration::from_secs(1) + rng.millis(30);
            let sleep = w.sleep_until(deadline);
            async move {
                sleep.await;
                Instant::now() < deadline
            }
        });
        // Polled on this thread: registered on its shard.
        let done = futures::executor::block_on(join_all(sleeps));
        done.into_iter().filter(|&early| early).count()
    });
    assert_eq!(early.iter().sum::<usize>(), 0, "sleeps completed early");
    runtime.block_on(wheel.flush());
    let stats = wheel.stats();
    let made = (THREADS * per_thread) as u64;
    assert_eq!(stats.inserted, made, "{stats:?}");
    assert_eq!(stats.fired, made, "{stats:?}");
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(stats.actors, SHARDS as u64, "{stats:?}");
}

#[test]
fn flush_waits_for_every_shard() {
    let runtime = two_workers();
    let wheel = runtime.block_on(async { Wheel::builder().timer_shards(SHARDS).build() });
    for round in 1..=5u64 {
        let w = wheel.clone();
        let sleeps = on_threads(runtime.handle(), move |_| {
            let far = Instant::now() + Duration::from_secs(3_600);
            (0..50).map(|_| registered(&w, far)).collect::<Vec<_>>()
        });
        // No retry: once `flush` returns, every shard has applied and published its share.
        runtime.block_on(wheel.flush());
        let stats = wheel.stats();
        assert_eq!(stats.pending, round * (THREADS as u64) * 50, "{stats:?}");
        // Kept alive until counted, then cancelled together.
        std::mem::forget(sleeps);
    }
}

#[test]
fn cancelled_sleeps_never_fire_and_the_counts_add_up() {
    let runtime = two_workers();
    let wheel = runtime.block_on(async { Wheel::builder().timer_shards(SHARDS).build() });
    let w = wheel.clone();
    let kept = on_threads(runtime.handle(), move |index| {
        let start = Instant::now();
        let mut sleeps: Vec<Sleep> = (0..100)
            .map(|i| registered(&w, start + Duration::from_millis(20 + i)))
            .collect();
        // Every other one dropped (cancelled) on its own thread, one moved earlier, one later.
        let mut kept: Vec<Sleep> = sleeps.drain(..).step_by(2).collect();
        Pin::new(&mut kept[0]).reset(start + Duration::from_millis(5));
        Pin::new(&mut kept[1]).reset(start + Duration::from_millis(200 + index as u64));
        kept
    });
    runtime.block_on(async {
        for sleeps in kept {
            for sleep in sleeps {
                let deadline = sleep.deadline();
                sleep.await;
                assert!(Instant::now() >= deadline, "a sleep completed early");
            }
        }
        wheel.flush().await;
    });
    let stats = wheel.stats();
    let made = (THREADS * 100) as u64;
    // A sleep dropped before its shard's actor took its registration is withdrawn in the
    // queue and never counted: the dropped half counts only as far as it was filed.
    assert_eq!(stats.fired, made / 2, "{stats:?}");
    assert!(
        stats.inserted >= made / 2 && stats.inserted <= made,
        "{stats:?}"
    );
    assert_eq!(stats.inserted, stats.fired + stats.cancelled, "{stats:?}");
    assert_eq!(stats.pending, 0, "{stats:?}");
}

#[test]
fn jobs_are_cancelled_and_rescheduled_from_threads_other_than_their_shard() {
    let runtime = two_workers();
    let wheel = runtime.block_on(async { Wheel::builder().timer_shards(SHARDS).build() });
    let w = wheel.clone();
    // Each thread spawns jobs on its shard...
    let jobs = on_threads(runtime.handle(), move |index| {
        (0..20u64)
            .map(|i| {
                let due = Instant::now() + Duration::from_secs(600);
                (w.spawn_at(due, async move { index as u64 * 100 + i }), due)
            })
            .collect::<Vec<_>>()
    });
    // ...and the test's thread cancels a third and moves the rest near.
    let results = runtime.block_on(async {
        let mut outcomes = Vec::new();
        for (index, (job, _)) in jobs.into_iter().flatten().enumerate() {
            if index % 3 == 0 {
                assert!(job.cancel(), "job {index} could not be cancelled");
                outcomes.push((None, job.await));
            } else {
                let due = Instant::now() + Duration::from_millis(10);
                assert!(job.reschedule(due), "job {index} could not be rescheduled");
                outcomes.push((Some(due), Ok(0)));
                let result = job.await;
                assert!(Instant::now() >= due, "job {index} ran early");
                outcomes.last_mut().unwrap().1 = result;
            }
        }
        outcomes
    });
    for (index, (due, result)) in results.into_iter().enumerate() {
        match due {
            None => assert_eq!(result, Err(JobError::Cancelled), "job {index}"),
            Some(_) => assert!(result.is_ok(), "job {index}: {result:?}"),
        }
    }
}

#[test]
fn shutdown_resolves_sleeps_and_jobs_on_every_shard() {
    let runtime = two_workers();
    let wheel = runtime.block_on(async { Wheel::builder().timer_shards(SHARDS).build() });
    let w = wheel.clone();
    let pending = on_threads(runtime.handle(), move |_| {
        let far = Instant::now() + Duration::from_secs(3_600);
        let sleeps: Vec<Sleep> = (0..30).map(|_| registered(&w, far)).collect();
        let job = w.spawn_at(far, async { 7 });
        (sleeps, job)
    });
    runtime.block_on(async {
        wheel.shutdown().await;
        for (sleeps, job) in pending {
            for mut sleep in sleeps {
                assert_eq!(poll_once(&mut sleep), Poll::Ready(()));
            }
            assert_eq!(job.await, Err(JobError::Shutdown));
        }
    });
    let stats = wheel.stats();
    assert_eq!(stats.actors, 0, "{stats:?}");
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(stats.inserted, stats.fired + stats.cancelled, "{stats:?}");
}

#[test]
fn the_last_handle_gone_every_shard_actor_exits() {
    let runtime = two_workers();
    let wheel = runtime.block_on(async { Wheel::builder().timer_shards(SHARDS).build() });
    let w = wheel.clone();
    on_threads(runtime.handle(), move |_| {
        let soon = Instant::now() + Duration::from_millis(5);
        futures::executor::block_on(w.sleep_until(soon));
    });
    assert_eq!(wheel.stats().actors, SHARDS as u64);
    assert_eq!(runtime.metrics().num_alive_tasks(), SHARDS);
    drop(wheel);
    // Every shard's actor exits on its own once no handle can send and nothing is filed.
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while runtime.metrics().num_alive_tasks() > 0 && std::time::Instant::now() < until {
        thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(runtime.metrics().num_alive_tasks(), 0);
}

#[tokio::test(start_paused = true)]
async fn paused_time_fires_each_shard_at_its_deadline_in_order() {
    let wheel = Wheel::builder().timer_shards(3).build();
    let start = Instant::now();
    let w = wheel.clone();
    // Thread i's sleeps are due at start + (i + 8k) ms: consecutive deadlines alternate
    // between shards.
    let sleeps: Vec<(Instant, Sleep)> = on_threads(&tokio::runtime::Handle::current(), move |i| {
        (0..10u64)
            .map(|k| {
                let deadline = start + Duration::from_millis(1 + i as u64 + 8 * k);
                (deadline, registered(&w, deadline))
            })
            .collect::<Vec<_>>()
    })
    .into_iter()
    .flatten()
    .collect();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = sleeps
        .into_iter()
        .map(|(deadline, sleep)| {
            let order = order.clone();
            tokio::spawn(async move {
                sleep.await;
                // Under paused time the wheel fires at the deadline's own tick.
                assert_eq!(Instant::now(), deadline);
                order.lock().unwrap().push(deadline);
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order.len(), THREADS * 10);
    assert!(
        order.windows(2).all(|pair| pair[0] <= pair[1]),
        "deadline order across shards: {order:?}"
    );
    wheel.flush().await;
    assert_eq!(wheel.stats().fired, (THREADS * 10) as u64);
}
