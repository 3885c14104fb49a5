//! Outside attack on `Builder::timer_shards` / `Builder::shards`: which counts are accepted,
//! which are refused (`BuildError::Shards`), how many timer actors run (`Stats::actors`), and
//! `own_thread(true)` with several timer shards. Public API only.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_wheel::{BuildError, JobError, Wheel};

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn err_of(builder: tokio_wheel::Builder) -> Option<BuildError> {
    let runtime = current_thread();
    runtime.block_on(async move { builder.try_build().err() })
}

#[test]
fn zero_and_257_timer_shards_are_refused() {
    assert_eq!(
        err_of(Wheel::builder().timer_shards(0)),
        Some(BuildError::Shards(0))
    );
    assert_eq!(
        err_of(Wheel::builder().timer_shards(257)),
        Some(BuildError::Shards(257))
    );
    assert_eq!(
        err_of(Wheel::builder().timer_shards(usize::MAX)),
        Some(BuildError::Shards(usize::MAX))
    );
    // A valid keyed count does not rescue an invalid timer count, nor the other way round.
    assert_eq!(
        err_of(Wheel::builder().shards(4).timer_shards(0)),
        Some(BuildError::Shards(0))
    );
    assert_eq!(
        err_of(Wheel::builder().shards(0).timer_shards(4)),
        Some(BuildError::Shards(0))
    );
    assert_eq!(
        err_of(Wheel::builder().shards(257)),
        Some(BuildError::Shards(257))
    );
    // Outside a runtime the runtime is what is wrong, whatever the count.
    assert_eq!(
        Wheel::builder().timer_shards(0).try_build().err(),
        Some(BuildError::NoRuntime)
    );
}

#[test]
fn the_shards_error_for_timer_shards_names_timer_shards() {
    // API.md: "BuildError for: ... — each message says what to change". The user set only
    // `timer_shards(0)`; the message must point there, not at keyed sets / `Builder::shards`.
    let error = err_of(Wheel::builder().timer_shards(0)).unwrap();
    let message = error.to_string();
    assert!(message.contains("timer_shards"), "{message}");
}

#[test]
fn valid_counts_run_that_many_timer_actors() {
    let runtime = current_thread();
    runtime.block_on(async {
        for n in [1usize, 2, 3, 7, 8, 256] {
            let wheel = Wheel::builder().timer_shards(n).try_build().unwrap();
            assert_eq!(wheel.stats().actors, n as u64, "timer_shards({n})");
            wheel.sleep(Duration::from_millis(1)).await;
            wheel.flush().await;
            let stats = wheel.stats();
            assert_eq!(stats.fired, 1, "timer_shards({n}): {stats:?}");
            wheel.shutdown().await;
            assert_eq!(wheel.stats().actors, 0, "timer_shards({n})");
        }
        // `shards(n)` alone sets the timer shards too; `timer_shards` wins when given, in
        // either order.
        let wheel = Wheel::builder().shards(5).build();
        assert_eq!(wheel.stats().actors, 5);
        wheel.shutdown().await;
        let wheel = Wheel::builder().shards(5).timer_shards(2).build();
        assert_eq!(wheel.stats().actors, 2);
        wheel.shutdown().await;
        let wheel = Wheel::builder().timer_shards(2).shards(5).build();
        assert_eq!(wheel.stats().actors, 2);
        // Keyed sets still take `shards`: 2 timer actors + 5 keyed.
        let (_timers, _expired) = wheel.keyed::<u32, ()>();
        assert_eq!(wheel.stats().actors, 7);
        wheel.shutdown().await;
        assert_eq!(wheel.stats().actors, 0);
    });
}

#[test]
fn own_thread_with_three_timer_shards_from_many_threads() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let wheel = runtime.block_on(async {
        Wheel::builder()
            .own_thread(true)
            .timer_shards(3)
            .try_build()
            .unwrap()
    });
    assert_eq!(wheel.stats().actors, 3);
    let early = Arc::new(AtomicUsize::new(0));
    let ran = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..6)
        .map(|index| {
            let (wheel, handle) = (wheel.clone(), runtime.handle().clone());
            let (early, ran) = (early.clone(), ran.clone());
            std::thread::spawn(move || {
                let _entered = handle.enter();
                for k in 0..20u64 {
                    let deadline = Instant::now() + Duration::from_millis(1 + (k + index) % 7);
                    futures::executor::block_on(wheel.sleep_until(deadline));
                    if Instant::now() < deadline {
                        early.fetch_add(1, Ordering::SeqCst);
                    }
                }
                let due = Instant::now() + Duration::from_millis(3);
                let ran2 = ran.clone();
                let job = wheel.spawn_at(due, async move {
                    ran2.fetch_add(1, Ordering::SeqCst);
                    Instant::now() >= due
                });
                futures::executor::block_on(job)
            })
        })
        .collect();
    for thread in threads {
        assert_eq!(thread.join().unwrap(), Ok(true), "a job ran early");
    }
    assert_eq!(early.load(Ordering::SeqCst), 0, "sleeps completed early");
    assert_eq!(ran.load(Ordering::SeqCst), 6);
    runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), wheel.flush())
            .await
            .expect("flush hung");
        let stats = wheel.stats();
        // A sleep first polled after its deadline (its thread preempted for a few ms) is
        // ready without registering: every registered one fired, jobs always register.
        assert!((6..=6 * 20 + 6).contains(&stats.inserted), "{stats:?}");
        assert_eq!(stats.fired, stats.inserted, "{stats:?}");
        assert_eq!(stats.pending, 0, "{stats:?}");
        // Pending work on every shard, then shutdown resolves it all.
        let far = Duration::from_secs(3_600);
        let job = wheel.spawn_after(far, async { 1 });
        let timeout = wheel.timeout(far, std::future::pending::<()>());
        tokio::time::timeout(Duration::from_secs(60), wheel.shutdown())
            .await
            .expect("shutdown hung");
        assert_eq!(job.await, Err(JobError::Shutdown));
        let elapsed = timeout.await.unwrap_err();
        assert!(elapsed.is_shutdown());
        assert_eq!(wheel.stats().actors, 0);
    });
}

#[test]
fn own_thread_refuses_a_paused_clock_with_timer_shards() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        assert_eq!(
            Wheel::builder()
                .own_thread(true)
                .timer_shards(3)
                .try_build()
                .err(),
            Some(BuildError::PausedClock)
        );
    });
}

#[test]
fn default_timer_shards_are_one_per_two_workers_rounded_up() {
    for (workers, expected) in [(1usize, 1u64), (2, 1), (3, 2), (4, 2), (5, 3)] {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .unwrap();
        let wheel = runtime.block_on(async { Wheel::new() });
        assert_eq!(wheel.stats().actors, expected, "{workers} workers");
        // Named from elsewhere (a current-thread runtime's context): counts the named one's.
        let named = current_thread().block_on(async {
            Wheel::builder()
                .runtime(runtime.handle().clone())
                .build()
                .stats()
                .actors
        });
        assert_eq!(named, expected, "{workers} workers, named");
        runtime.block_on(wheel.shutdown());
    }
    let runtime = current_thread();
    let actors = runtime.block_on(async { Wheel::new().stats().actors });
    assert_eq!(actors, 1);
}

#[test]
fn two_hundred_fifty_six_timer_shards_all_lanes_in_use() {
    let runtime = current_thread();
    let wheel = runtime.block_on(async { Wheel::builder().timer_shards(256).build() });
    let early = Arc::new(AtomicUsize::new(0));
    let start = runtime.block_on(async { Instant::now() });
    // 300 threads: every lane gets one, several get two.
    let made: Vec<_> = std::thread::scope(|scope| {
        let threads: Vec<_> =
            (0..300u64)
                .map(|i| {
                    let (wheel, handle) = (wheel.clone(), runtime.handle().clone());
                    scope.spawn(move || {
                        let _entered = handle.enter();
                        // Far: still pending when polled, however late this thread runs.
                        let mut sleep = wheel.sleep_until(start + Duration::from_secs(60));
                        assert!(
                            futures::FutureExt::poll_unpin(
                                &mut sleep,
                                &mut std::task::Context::from_waker(std::task::Waker::noop())
                            )
                            .is_pending()
                        );
                        let due = start + Duration::from_millis(1 + i % 9);
                        let job = wheel.spawn_at(start + Duration::from_secs(60), async move {
                            Instant::now()
                        });
                        (sleep, job, due)
                    })
                })
                .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    runtime.block_on(async {
        let mut waits = Vec::new();
        for (mut sleep, job, due) in made {
            // Moved earlier from this thread (a command to the lane that filed it).
            std::pin::Pin::new(&mut sleep).reset(due);
            assert!(job.reschedule(due));
            let early = early.clone();
            waits.push(tokio::spawn(async move {
                sleep.await;
                if Instant::now() < due {
                    early.fetch_add(1, Ordering::SeqCst);
                }
                let ran = job.await.unwrap();
                if ran < due {
                    early.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
        for wait in waits {
            tokio::time::timeout(Duration::from_secs(60), wait)
                .await
                .expect("hung")
                .unwrap();
        }
        wheel.flush().await;
        let stats = wheel.stats();
        assert_eq!(stats.inserted, 600, "{stats:?}");
        assert_eq!(stats.fired, 600, "{stats:?}");
        assert_eq!(stats.pending, 0, "{stats:?}");
        assert_eq!(stats.actors, 256, "{stats:?}");
        wheel.shutdown().await;
    });
    assert_eq!(early.load(Ordering::SeqCst), 0);
}
