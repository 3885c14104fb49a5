//! Durable queues under API.md §4a: stale finishes, `retry_after` counting toward
//! `max_attempts`, leases that start at hand-out, `extend` and `keep_alive`, graceful `close`,
//! and commits that fail (a store that fails on demand). Real time, both backends.

mod support;

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel_durable::store::{MemoryStore, Store, Work};
use tokio_wheel_durable::{Builder, DurableQueue, Error, RetryPolicy, Task};

use support::backend::{Backend, fixture, next, nothing_within};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

on_every_backend!(
    stale_finishes_return_lease_lost_and_change_nothing,
    retry_after_counts_toward_max_attempts,
    a_lease_starts_at_hand_out_not_while_buffered,
    extend_keeps_a_long_job_and_fails_once_the_lease_is_gone,
    keep_alive_renews_held_deliveries_until_they_are_dropped,
    close_returns_buffered_tasks_at_once_and_waits_for_held_ones,
    close_gives_up_on_held_deliveries_after_its_timeout,
    a_zero_lease_is_a_clear_error,
);

/// Issue 12 item 2: after `retry_after` and a redelivery, the first delivery's finishes are
/// stale: each says `LeaseLost` and leaves the task as it is.
async fn stale_finishes_return_lease_lost_and_change_nothing(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    queue.schedule(Task::new("p").id("t")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let d1 = next(&mut deliveries).await;
    d1.retry_after(Duration::ZERO).await.unwrap();
    let d2 = next(&mut deliveries).await;
    assert_eq!(d2.attempt(), 2);
    assert_eq!(d1.ack().await, Err(Error::LeaseLost), "stale ack");
    assert_eq!(d1.fail("stale").await, Err(Error::LeaseLost), "stale fail");
    assert_eq!(d1.retry().await, Err(Error::LeaseLost), "stale retry");
    assert_eq!(d1.retry_after(ms(1)).await, Err(Error::LeaseLost));
    assert_eq!(d1.extend(ms(1)).await, Err(Error::LeaseLost));
    assert_eq!(queue.len().await.unwrap(), 1, "the task is still there");
    assert!(
        queue.dead_letters().await.unwrap().is_empty(),
        "no dead letter"
    );
    nothing_within(&mut deliveries, ms(100)).await;
    d2.ack().await.unwrap();
    // An ack made again is recognised (issue 29: it may be repeated after a lost answer);
    // another finish after it is stale.
    assert_eq!(d2.ack().await, Ok(()), "the same ack again");
    assert_eq!(
        d2.retry().await,
        Err(Error::LeaseLost),
        "a finish after the ack"
    );
    assert_eq!(queue.len().await.unwrap(), 0);
}

/// Issue 12 item 7: `retry_after` is a retry like any other: with `max_attempts(2)` the second
/// delivery goes to the dead letters however it is retried.
async fn retry_after_counts_toward_max_attempts(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let policy = RetryPolicy::exponential(ms(10), ms(10)).max_attempts(2);
    let queue = f.open_with(DurableQueue::builder().retry(policy)).await;
    queue.schedule(Task::new("p").id("t")).await.unwrap();
    let mut deliveries = queue.deliveries();
    for attempt in 1..=2 {
        let d = next(&mut deliveries).await;
        assert_eq!(d.attempt(), attempt);
        d.retry_after(Duration::ZERO).await.unwrap();
    }
    nothing_within(&mut deliveries, ms(200)).await;
    let dead = queue.dead_letters().await.unwrap();
    assert_eq!(dead.len(), 1, "delivered twice, then dead");
    assert_eq!(dead[0].attempts, 2);
    assert!(
        dead[0].reason.contains("last delivery"),
        "{}",
        dead[0].reason
    );
    assert_eq!(queue.len().await.unwrap(), 0);
}

/// Issue 12 item 4: 6 tasks, a 1 s lease, the default prefetch, a consumer taking 400 ms per
/// task: every job fits in its lease, so each task is delivered once and every ack holds.
async fn a_lease_starts_at_hand_out_not_while_buffered(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f
        .open_with(DurableQueue::builder().lease(Duration::from_secs(1)))
        .await;
    for i in 0..6 {
        queue
            .schedule(Task::new("p").id(format!("t{i}")))
            .await
            .unwrap();
    }
    let mut deliveries = queue.deliveries();
    let mut seen = Vec::new();
    for _ in 0..6 {
        let d = next(&mut deliveries).await;
        seen.push((d.id().to_string(), d.attempt()));
        tokio::time::sleep(ms(400)).await; // the job
        d.ack().await.expect("the job fit in its lease");
    }
    assert!(seen.iter().all(|(_, attempt)| *attempt == 1), "{seen:?}");
    nothing_within(&mut deliveries, ms(200)).await;
    assert_eq!(queue.len().await.unwrap(), 0);
}

async fn extend_keeps_a_long_job_and_fails_once_the_lease_is_gone(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open_with(DurableQueue::builder().lease(ms(300))).await;
    queue.schedule(Task::new("p").id("long")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let d = next(&mut deliveries).await;
    for _ in 0..4 {
        tokio::time::sleep(ms(200)).await;
        d.extend(ms(300)).await.expect("still held");
    }
    // 800 ms in, far past the 300 ms lease: nobody else got it.
    nothing_within(&mut deliveries, ms(100)).await;
    d.ack().await.unwrap();

    queue.schedule(Task::new("p").id("lost")).await.unwrap();
    let d = next(&mut deliveries).await;
    let again = next(&mut deliveries).await; // after the lease ran out
    assert_eq!(again.attempt(), 2);
    assert_eq!(d.extend(ms(300)).await, Err(Error::LeaseLost));
    again.ack().await.unwrap();
}

async fn keep_alive_renews_held_deliveries_until_they_are_dropped(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f
        .open_with(DurableQueue::builder().lease(ms(300)).keep_alive(true))
        .await;
    queue.schedule(Task::new("p").id("t")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let d = next(&mut deliveries).await;
    nothing_within(&mut deliveries, ms(1_000)).await; // more than three leases
    d.ack().await.expect("kept alive");

    queue.schedule(Task::new("p").id("dropped")).await.unwrap();
    let d = next(&mut deliveries).await;
    let dropped = std::time::Instant::now();
    drop(d); // no longer kept alive: back after its lease
    let again = next(&mut deliveries).await;
    assert!(dropped.elapsed() >= ms(250), "{:?}", dropped.elapsed());
    assert_eq!((again.id().as_str(), again.attempt()), ("dropped", 2));
    again.ack().await.unwrap();
}

async fn close_returns_buffered_tasks_at_once_and_waits_for_held_ones(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f
        .open_with(
            DurableQueue::builder()
                .prefetch(4)
                .lease(Duration::from_secs(60)),
        )
        .await;
    for i in 0..4 {
        queue
            .schedule(Task::new("p").id(format!("t{i}")))
            .await
            .unwrap();
    }
    let mut deliveries = queue.deliveries();
    let held = next(&mut deliveries).await;
    tokio::time::sleep(ms(100)).await; // the other three are claimed into the buffer
    let closing = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.close().await })
    };
    tokio::time::sleep(ms(200)).await;
    assert!(!closing.is_finished(), "close waits for the held delivery");
    assert!(
        tokio::time::timeout(ms(100), deliveries.next())
            .await
            .expect("the stream ended")
            .is_none(),
        "buffered tasks are not handed out once closing"
    );
    held.ack()
        .await
        .expect("a held delivery can still be acked while closing");
    tokio::time::timeout(Duration::from_secs(5), closing)
        .await
        .expect("close returns once nothing is held")
        .unwrap();
    drop((queue, deliveries));

    let queue = f.reopen(DurableQueue::builder()).await;
    assert_eq!(queue.len().await.unwrap(), 3);
    let mut deliveries = queue.deliveries();
    for _ in 0..3 {
        let d = next(&mut deliveries).await;
        assert_eq!(
            d.attempt(),
            1,
            "a returned buffered claim was not a delivery"
        );
        d.ack().await.unwrap();
    }
}

async fn close_gives_up_on_held_deliveries_after_its_timeout(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f
        .open_with(DurableQueue::builder().close_timeout(ms(300)))
        .await;
    queue.schedule(Task::new("p").id("t")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let _held = next(&mut deliveries).await;
    let start = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(5), queue.close())
        .await
        .expect("close returns after its timeout");
    assert!(start.elapsed() >= ms(280), "{:?}", start.elapsed());
}

async fn a_zero_lease_is_a_clear_error(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let builder = DurableQueue::builder().lease(Duration::ZERO);
    let error = match f.backend {
        Backend::Embedded => builder.open(f.path(), &f.wheel).await.unwrap_err(),
        #[cfg(feature = "redis")]
        Backend::Redis => builder
            .redis(&f.redis.as_ref().unwrap().url(), "q", &f.wheel)
            .await
            .unwrap_err(),
        #[cfg(not(feature = "redis"))]
        Backend::Redis => unreachable!(),
    };
    assert!(matches!(error, Error::Invalid(_)), "{error:?}");
    assert!(error.to_string().contains("lease"), "{error}");
}

/// A [`Store`] that fails on demand: `fail_next(n)` makes the next `n` commits fail as a full
/// disk would (nothing applied).
#[derive(Clone, Default)]
struct FlakyStore {
    inner: MemoryStore,
    fail_next: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    failed: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl FlakyStore {
    fn fail_next(&self, commits: usize) {
        self.fail_next
            .store(commits, std::sync::atomic::Ordering::SeqCst);
    }

    fn failed(&self) -> usize {
        self.failed.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Store for FlakyStore {
    fn transact(&mut self, work: &mut Work<'_>) -> Result<(), Error> {
        use std::sync::atomic::Ordering::SeqCst;
        // The work runs, then its commit fails as a full disk would: nothing applied.
        let (fail_next, failed) = (self.fail_next.clone(), self.failed.clone());
        self.inner.transact(&mut |tx| {
            work(tx)?;
            let failing = fail_next
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if failing {
                failed.fetch_add(1, SeqCst);
                return Err(Error::Io("injected: no space left on device".into()));
            }
            Ok(())
        })
    }
}

async fn flaky_queue(builder: Builder) -> (FlakyStore, DurableQueue, Wheel) {
    let wheel = Wheel::new();
    let store = FlakyStore::default();
    let queue = builder
        .open_with_store(store.clone(), &wheel)
        .await
        .unwrap();
    (store, queue, wheel)
}

/// Issue 12 item 5: the commit of a claim fails while a stream waits. The stream still gets
/// its delivery once the store works again, without being polled anew.
#[tokio::test]
async fn a_failed_claim_commit_does_not_strand_the_waiting_stream() {
    // A prefetch of one: the failed claim took the stream's only credit.
    let (store, queue, _wheel) = flaky_queue(DurableQueue::builder().prefetch(1)).await;
    let mut deliveries = queue.deliveries();
    // One poll, then the consumer just waits (a task blocked in `next().await`).
    let waiter = tokio::spawn(async move {
        let d = tokio::time::timeout(Duration::from_secs(5), deliveries.next())
            .await
            .expect("stranded: no delivery after the store recovered")
            .unwrap();
        (d, deliveries)
    });
    tokio::time::sleep(ms(50)).await;
    queue
        .schedule(Task::new("exact bytes").id("t").after(ms(200)))
        .await
        .unwrap();
    store.fail_next(2); // the claim at 200 ms fails, and its first retry too
    let (d, _deliveries) = waiter.await.unwrap();
    assert_eq!(store.failed(), 2, "the fault was injected");
    assert_eq!(
        (d.id().as_str(), d.payload(), d.attempt()),
        ("t", &b"exact bytes"[..], 1)
    );
    d.ack().await.unwrap();
    assert_eq!(queue.len().await.unwrap(), 0);
}

/// Issue 12 item 6: a failed commit must not redeliver a task whose lease is live here, and a
/// finish that failed can be tried again.
#[tokio::test]
async fn a_failed_commit_does_not_redeliver_live_leases() {
    let (store, queue, _wheel) =
        flaky_queue(DurableQueue::builder().lease(Duration::from_secs(30))).await;
    queue.schedule(Task::new("held").id("held")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let held = next(&mut deliveries).await;

    store.fail_next(1);
    let error = queue.schedule(Task::new("x").id("x")).await.unwrap_err();
    assert!(error.is_transient(), "{error:?}");
    nothing_within(&mut deliveries, ms(300)).await; // "held" is not handed out again

    store.fail_next(1);
    let error = held.ack().await.unwrap_err();
    assert!(matches!(error, Error::Io(_)), "{error:?}");
    nothing_within(&mut deliveries, ms(100)).await;
    held.ack().await.expect("the failed ack can be tried again");
    assert_eq!(store.failed(), 2);
    queue.schedule(Task::new("x").id("x")).await.unwrap();
    let x = next(&mut deliveries).await;
    assert_eq!((x.id().as_str(), x.attempt()), ("x", 1));
    x.ack().await.unwrap();
    assert_eq!(queue.len().await.unwrap(), 0);
}

/// Random commit failures under a steady load: everything is still delivered, and nothing
/// whose ack returned `Ok` comes back.
#[tokio::test]
async fn random_commit_failures_lose_nothing() {
    let (store, queue, _wheel) =
        flaky_queue(DurableQueue::builder().lease(Duration::from_secs(30))).await;
    let mut rng = support::Rng(42);
    let mut scheduled = HashSet::new();
    for i in 0..200 {
        if rng.below(5) == 0 {
            store.fail_next(1);
        }
        let id = format!("t{i}");
        // A failed schedule is not durable: the producer tries again, as a caller would.
        while queue
            .schedule(Task::new(id.clone()).id(id.clone()))
            .await
            .is_err()
        {}
        scheduled.insert(id);
    }
    let mut deliveries = queue.deliveries();
    let mut acked = HashSet::new();
    while acked.len() < scheduled.len() {
        let d = next(&mut deliveries).await;
        assert_eq!(d.payload(), d.id().as_str().as_bytes());
        assert!(
            !acked.contains(d.id().as_str()),
            "{} came back after its ack",
            d.id()
        );
        if rng.below(4) == 0 {
            store.fail_next(1);
        }
        loop {
            match d.ack().await {
                Ok(()) => break,
                Err(Error::Io(_)) => continue,
                Err(other) => panic!("{other}"),
            }
        }
        acked.insert(d.id().to_string());
    }
    assert!(store.failed() > 10, "only {} faults", store.failed());
    assert_eq!(queue.len().await.unwrap(), 0);
}
