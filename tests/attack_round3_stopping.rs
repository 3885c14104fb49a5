//! Outside attacks, round 3, on API.md "Observing and stopping" (stats, shutdown, a dead
//! runtime; fairness is `fairness.rs`'s, with its allowance for machine noise), written from the contract and the public rustdoc only. Every attack that
//! holds is kept as a regression test, named by the behaviour; a broken promise is kept as
//! `#[ignore = "finding: …"]`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use tokio::time::Instant;
use tokio_wheel::{JobError, Schedule, Wheel};

#[path = "support/attack.rs"]
mod attack;
use attack::{ms, poll_once, secs, settle};

fn full() -> bool {
    std::env::var_os("TOKIO_WHEEL_FULL").is_some()
}

// ───────────────────────────── Observing: stats ─────────────────────────────

/// Stats add up after a mixed flood (sleeps dropped and completed, jobs cancelled and run,
/// keyed entries removed, replaced and fired), and the expirations backlog shows unread ones.
#[tokio::test(start_paused = true)]
async fn stats_add_up_after_a_mixed_flood_and_show_the_backlog() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    let n = 2_000u32;
    let mut sleeps = Vec::new();
    let mut jobs = Vec::new();
    for i in 0..n {
        let mut s = Box::pin(wheel.sleep(ms(1 + u64::from(i % 50))));
        let _ = poll_once(&mut s);
        if i % 2 == 0 {
            sleeps.push(s);
        }
        let job = wheel.spawn_after(ms(u64::from(i % 70)), async move { i });
        if i % 3 == 0 {
            job.cancel();
        } else {
            jobs.push(job);
        }
        timers.set(i, i, ms(1 + u64::from(i % 30)));
        if i % 4 == 0 {
            timers.remove(&i);
        } else if i % 4 == 1 {
            timers.set(i, i + 1, ms(5));
        }
    }
    assert_eq!(timers.len().await, (n - n / 4) as usize);
    tokio::time::sleep(ms(100)).await;
    for s in sleeps {
        s.await;
    }
    for j in jobs {
        j.await.unwrap();
    }
    assert_eq!(timers.len().await, 0);
    wheel.flush().await;
    let stats = wheel.stats();
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(
        stats.inserted,
        stats.fired + stats.cancelled + stats.pending,
        "{stats:?}"
    );
    assert_eq!(stats.expirations_backlog, u64::from(n - n / 4), "{stats:?}");
    let mut got = 0;
    while got < n - n / 4 {
        expired.next().await.unwrap();
        got += 1;
    }
    settle().await;
    assert_eq!(wheel.stats().expirations_backlog, 0);
}

// ───────────────────────────── Stopping ─────────────────────────────

/// Commands made (from other tasks, on 2 workers) before `shutdown()` is called are applied
/// first: every entry set and not removed arrives exactly once, marked `is_shutdown`; no
/// removed one does; then the stream ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_before_shutdown_are_applied_then_flushed_exactly_once() {
    for round in 0..if full() { 50 } else { 8 } {
        let wheel = Wheel::new();
        let (timers, mut expired) = wheel.keyed::<u32, u32>();
        let per = 3_000u32;
        let mut senders = Vec::new();
        for t in 0..3u32 {
            let timers = timers.clone();
            senders.push(tokio::spawn(async move {
                for k in t * per..(t + 1) * per {
                    timers.set(k, k, secs(3600));
                    if k % 3 == 0 {
                        timers.remove(&k);
                    }
                    if k % 3 == 1 {
                        timers.reset(&k, secs(7200));
                    }
                }
            }));
        }
        for s in senders {
            s.await.unwrap();
        }
        wheel.shutdown().await;
        let mut seen = std::collections::HashSet::new();
        while let Some(e) = tokio::time::timeout(secs(30), expired.next())
            .await
            .expect("hung")
        {
            assert!(e.is_shutdown(), "round {round}");
            let k = *e.key();
            assert_ne!(k % 3, 0, "round {round}: removed key {k} delivered");
            assert!(seen.insert(k), "round {round}: key {k} twice");
        }
        assert_eq!(seen.len() as u32, 3 * per - per, "round {round}");
    }
}

/// After shutdown every call answers at once: keyed set refused, take/drain/len empty, new
/// sleeps ready, timeouts `Elapsed` with `is_shutdown`, jobs `Shutdown`, interval ticks ready.
#[tokio::test(start_paused = true)]
async fn calls_on_a_stopped_wheel_answer_at_once() {
    let wheel = Wheel::new();
    let (timers, _expired) = wheel.keyed::<u32, u32>();
    let pending_timeout = tokio::spawn({
        let wheel = wheel.clone();
        async move { wheel.timeout(secs(60), std::future::pending::<()>()).await }
    });
    let pending_job = wheel.spawn_after(secs(60), async { 1 });
    let mut iv = wheel.interval_at(Instant::now() + secs(60), secs(60));
    settle().await;
    wheel.shutdown().await;
    let t0 = Instant::now();
    let e = pending_timeout.await.unwrap().unwrap_err();
    assert!(e.is_shutdown());
    assert_eq!(pending_job.await, Err(JobError::Shutdown));
    for _ in 0..3 {
        iv.tick().await;
    }
    timers.set(1, 1, secs(1));
    assert_eq!(timers.len().await, 0);
    assert_eq!(timers.take(&1).await, None);
    assert!(timers.drain().await.is_empty());
    wheel.sleep(secs(100)).await;
    let e = wheel
        .timeout(secs(100), std::future::pending::<()>())
        .await
        .unwrap_err();
    assert!(e.is_shutdown());
    assert_eq!(
        wheel.spawn_after(secs(1), async { 1 }).await,
        Err(JobError::Shutdown)
    );
    assert_eq!(
        wheel
            .spawn_every(secs(1), Schedule::FixedRate, || async {})
            .await,
        Err(JobError::Shutdown)
    );
    wheel.flush().await;
    wheel.shutdown().await;
    // Paused time auto-advances only when everything waits: nothing above waited on time.
    assert_eq!(Instant::now(), t0);
}

/// A running job at shutdown finishes with its output (only not-yet-started ones get
/// `Shutdown`).
#[tokio::test(start_paused = true)]
async fn a_running_job_finishes_across_shutdown() {
    let wheel = Wheel::new();
    let started = Arc::new(AtomicBool::new(false));
    let job = {
        let started = started.clone();
        wheel.spawn_after(ms(1), async move {
            started.store(true, Ordering::SeqCst);
            tokio::time::sleep(ms(50)).await;
            5
        })
    };
    while !started.load(Ordering::SeqCst) {
        tokio::time::sleep(ms(1)).await;
    }
    wheel.shutdown().await;
    assert_eq!(job.await, Ok(5));
}

/// The actor's runtime goes away with keyed entries pending: the stream, read on another
/// runtime, gets each live entry exactly once marked `is_shutdown`, then ends; calls answer.
#[test]
fn runtime_dropped_flushes_keyed_entries_once() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (wheel, timers, expired) = rt.block_on(async {
        let wheel = Wheel::new();
        let (timers, expired) = wheel.keyed::<u32, u32>();
        for k in 0..1000 {
            timers.set(k, k, secs(3600));
        }
        timers.remove(&7);
        (wheel, timers, expired)
    });
    drop(rt);
    let other = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    other.block_on(async move {
        let mut expired = expired;
        let mut seen = std::collections::HashSet::new();
        while let Some(e) = tokio::time::timeout(secs(10), expired.next())
            .await
            .expect("stream hung")
        {
            assert!(e.is_shutdown());
            assert!(seen.insert(*e.key()));
        }
        assert_eq!(seen.len(), 999);
        assert!(!seen.contains(&7));
        let quick = async {
            assert_eq!(timers.len().await, 0);
            assert_eq!(timers.take(&1).await, None);
            wheel.sleep(secs(100)).await;
            assert_eq!(
                wheel.spawn_after(secs(1), async { 1 }).await,
                Err(JobError::Shutdown)
            );
            wheel.shutdown().await;
        };
        tokio::time::timeout(secs(10), quick)
            .await
            .expect("a call on a dead wheel hung");
    });
}
