//! Durable queues under API.md §4b: `get`, `list` and their pages, dead letters and their
//! purge, `stats` that add up, recurring tasks, and the prefetch bound. Real time, both
//! backends.

mod support;

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use tokio_wheel_durable::{
    CatchUp, DurableQueue, Error, Recurring, RetryPolicy, Task, TaskFilter, TaskId, TaskState,
};

use support::backend::{Backend, fixture, next, nothing_within};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

on_every_backend!(
    get_and_list_report_each_state_in_pages,
    purge_dead_removes_only_old_dead_letters,
    retention_purges_old_dead_letters_on_its_own,
    stats_add_up_after_every_kind_of_finish,
    inspection_pages_through_a_large_queue,
    a_recurring_period_delivers_each_occurrence_once,
    a_cron_expression_with_seconds_fires_on_whole_seconds,
    declaring_a_recurring_schedule_again_keeps_it_and_cancel_stops_it,
);

/// Issue 13: `get` and paged `list` show each state; a cursor that moved is a clear error.
async fn get_and_list_report_each_state_in_pages(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open_with(DurableQueue::builder().prefetch(1)).await;
    // Due times are kept in whole milliseconds.
    let now_ms = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let base = std::time::UNIX_EPOCH + ms(now_ms + 3_600_000);
    for i in 0..7u64 {
        // Due in reverse order of their names, so due order is not id order.
        let due = base + ms(1_000 * (7 - i));
        queue
            .schedule(Task::new(vec![0u8; i as usize]).id(format!("p{i}")).at(due))
            .await
            .unwrap();
    }
    queue.schedule(Task::new("run").id("run")).await.unwrap();
    queue.schedule(Task::new("die").id("die")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let (mut held, mut dead) = (None, false);
    while held.is_none() || !dead {
        let d = next(&mut deliveries).await;
        if d.id().as_str() == "die" {
            d.fail("bad input").await.unwrap();
            dead = true;
        } else {
            held = Some(d);
        }
    }
    let held = held.unwrap();

    let info = queue.get(&"p3".into()).await.unwrap().expect("p3 exists");
    assert_eq!(info.state, TaskState::Pending);
    assert_eq!((info.payload_len, info.attempts, info.reason), (3, 0, None));
    assert_eq!(info.due, base + ms(4_000));
    let info = queue.get(&"run".into()).await.unwrap().unwrap();
    match info.state {
        TaskState::InFlight {
            attempt,
            lease_until,
        } => {
            assert_eq!(attempt, 1);
            assert!(lease_until > SystemTime::now(), "{lease_until:?}");
        }
        other => panic!("{other:?}"),
    }
    let info = queue.get(&"die".into()).await.unwrap().unwrap();
    assert_eq!(
        info.state,
        TaskState::Dead {
            reason: "bad input".into()
        }
    );
    assert_eq!(info.reason.as_deref(), Some("bad input"));
    assert_eq!(queue.get(&"nothing".into()).await.unwrap(), None);

    // Pages of 3 in due order: p6 (earliest) … p0.
    let mut seen = Vec::new();
    let mut after: Option<TaskId> = None;
    loop {
        let page = queue
            .list(TaskFilter::Pending, after.as_ref(), 3)
            .await
            .unwrap();
        assert!(page.len() <= 3);
        let Some(last) = page.last() else { break };
        after = Some(last.id.clone());
        seen.extend(page.iter().map(|t| t.id.to_string()));
    }
    assert_eq!(seen, ["p6", "p5", "p4", "p3", "p2", "p1", "p0"]);
    let in_flight = queue.list(TaskFilter::InFlight, None, 10).await.unwrap();
    assert_eq!(in_flight.len(), 1);
    assert_eq!(in_flight[0].id.as_str(), "run");
    let dead = queue.list(TaskFilter::Dead, None, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id.as_str(), "die");
    let letters = queue.dead_letters_page(None, 10).await.unwrap();
    assert_eq!(
        (letters.len(), letters[0].payload.as_slice()),
        (1, &b"die"[..])
    );
    assert!(
        queue
            .list(TaskFilter::Dead, Some(&"die".into()), 10)
            .await
            .unwrap()
            .is_empty()
    );

    // The cursor task moved on: a clear error, not a wrong page.
    assert!(queue.cancel(&"p2".into()).await.unwrap());
    let error = queue
        .list(TaskFilter::Pending, Some(&"p2".into()), 3)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Invalid(_)), "{error:?}");
    assert!(error.to_string().contains("p2"), "{error}");
    assert!(
        queue
            .list(TaskFilter::Pending, None, 0)
            .await
            .unwrap()
            .is_empty()
    );
    held.ack().await.unwrap();
}

async fn dead_letter(
    queue: &DurableQueue,
    deliveries: &mut tokio_wheel_durable::Deliveries,
    id: &str,
) {
    queue.schedule(Task::new(id).id(id)).await.unwrap();
    let d = next(deliveries).await;
    assert_eq!(d.id().as_str(), id);
    d.fail("no").await.unwrap();
}

async fn purge_dead_removes_only_old_dead_letters(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    let mut deliveries = queue.deliveries();
    for id in ["old-1", "old-2", "old-3"] {
        dead_letter(&queue, &mut deliveries, id).await;
    }
    tokio::time::sleep(ms(600)).await;
    for id in ["new-1", "new-2"] {
        dead_letter(&queue, &mut deliveries, id).await;
    }
    assert_eq!(queue.purge_dead(ms(400)).await.unwrap(), 3);
    let left: Vec<String> = queue
        .dead_letters()
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.id.to_string())
        .collect();
    assert_eq!(left, ["new-1", "new-2"], "oldest death first");
    assert_eq!(queue.purge_dead(Duration::ZERO).await.unwrap(), 2);
    assert!(queue.dead_letters().await.unwrap().is_empty());
    assert_eq!(queue.stats().await.unwrap().dead, 0);
}

async fn retention_purges_old_dead_letters_on_its_own(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f
        .open_with(DurableQueue::builder().dead_letter_retention(ms(300)))
        .await;
    let mut deliveries = queue.deliveries();
    dead_letter(&queue, &mut deliveries, "doomed").await;
    assert_eq!(queue.stats().await.unwrap().dead, 1, "kept while young");
    let start = std::time::Instant::now();
    while queue.stats().await.unwrap().dead > 0 {
        // A guard against a hang only: the purge is due after 300 ms.
        assert!(start.elapsed() < Duration::from_secs(30), "never purged");
        tokio::time::sleep(ms(50)).await;
    }
    assert!(start.elapsed() >= ms(250), "{:?}", start.elapsed());
    assert_eq!(queue.get(&"doomed".into()).await.unwrap(), None);
}

/// Issue 13: every way a delivery can end is counted, and the counters add up.
async fn stats_add_up_after_every_kind_of_finish(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let policy = RetryPolicy::exponential(ms(10), ms(10)).max_attempts(2);
    let queue = f
        .open_with(
            DurableQueue::builder()
                .retry(policy)
                .lease(ms(300))
                .prefetch(4),
        )
        .await;
    for i in 0..12 {
        queue
            .schedule(Task::new("p").id(format!("t{i:02}")))
            .await
            .unwrap();
    }
    queue
        .schedule(Task::new("p").id("later").after(Duration::from_secs(3_600)))
        .await
        .unwrap();
    {
        // A stream that buffers four and is dropped after reading one: three go back.
        let mut deliveries = queue.deliveries();
        let d = next(&mut deliveries).await;
        tokio::time::sleep(ms(100)).await;
        d.ack().await.unwrap();
    }
    let mut deliveries = queue.deliveries();
    let mut kept = None;
    let mut finished = 0;
    while finished < 11 {
        let d = next(&mut deliveries).await;
        match (finished % 4, d.attempt()) {
            (0, _) => d.ack().await.unwrap(),
            (1, 1) => d.retry_after(Duration::ZERO).await.unwrap(),
            (1, _) => d.ack().await.unwrap(),
            (2, _) => d.fail("no").await.unwrap(),
            _ if kept.is_none() => {
                d.extend(Duration::from_secs(60)).await.unwrap();
                kept = Some(d); // held: in flight at the end
            }
            _ => drop(d), // its lease runs out
        }
        finished += 1;
    }
    tokio::time::sleep(ms(500)).await; // leases of dropped deliveries run out
    let mut drained = 0;
    while let Ok(Some(d)) = tokio::time::timeout(ms(300), deliveries.next()).await {
        d.ack().await.unwrap();
        drained += 1;
    }
    assert!(drained > 0, "expired leases came back");
    let stats = queue.stats().await.unwrap();
    assert_eq!(
        stats.delivered,
        stats.acked
            + stats.retried
            + stats.dead_lettered
            + stats.expired
            + stats.returned
            + stats.in_flight,
        "{stats:?}"
    );
    assert_eq!(stats.in_flight, 1, "{stats:?}");
    assert_eq!(stats.pending, 1, "{stats:?}");
    assert!(stats.returned >= 3, "{stats:?}");
    assert!(stats.retried >= 1 && stats.expired >= 1, "{stats:?}");
    assert_eq!(stats.dead, stats.dead_lettered, "{stats:?}");
    assert_eq!(
        stats.dead as usize,
        queue.dead_letters().await.unwrap().len()
    );
    assert_eq!(
        stats.pending + stats.in_flight,
        queue.len().await.unwrap() as u64
    );
    assert!(stats.lateness_p99 >= stats.lateness_p50);
    assert!(stats.lateness_p99 < Duration::from_secs(5), "{stats:?}");
    kept.unwrap().ack().await.unwrap();
}

/// How many entries the large inspection test uses: 10^5 with `TOKIO_WHEEL_FULL=1`.
fn large() -> usize {
    if std::env::var_os("TOKIO_WHEEL_FULL").is_some() {
        100_000
    } else {
        20_000
    }
}

/// Issue 13: paging through a large backlog and dead-letter set, and purging it, all in
/// bounded pages.
async fn inspection_pages_through_a_large_queue(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open_with(DurableQueue::builder().prefetch(256)).await;
    let count = large();
    let base = SystemTime::now() + Duration::from_secs(3_600);
    let producers: Vec<_> = (0..64)
        .map(|p| {
            let queue = queue.clone();
            tokio::spawn(async move {
                for i in (p..count).step_by(64) {
                    let task = Task::new(format!("{i}")).id(format!("t{i:06}"));
                    let task = if i % 2 == 0 {
                        task.at(base + ms(i as u64))
                    } else {
                        task // due now: to the dead letters below
                    };
                    queue.schedule(task).await.unwrap();
                }
            })
        })
        .collect();
    for producer in producers {
        producer.await.unwrap();
    }
    queue
        .deliveries()
        .take(count / 2)
        .for_each_concurrent(
            256,
            |d| async move { d.fail("for the test").await.unwrap() },
        )
        .await;
    let stats = queue.stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.dead),
        ((count / 2) as u64, (count / 2) as u64)
    );

    let start = std::time::Instant::now();
    let (mut pages, mut listed, mut after, mut last_due) = (0, 0, None::<TaskId>, None);
    loop {
        let page = queue
            .list(TaskFilter::Pending, after.as_ref(), 1_000)
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        for task in &page {
            assert!(last_due <= Some(task.due), "due order");
            last_due = Some(task.due);
        }
        pages += 1;
        listed += page.len();
        after = Some(last.id.clone());
    }
    assert_eq!((listed, pages), (count / 2, count.div_ceil(2_000)));
    let (mut letters, mut after) = (0, None::<TaskId>);
    loop {
        let page = queue
            .dead_letters_page(after.as_ref(), 1_000)
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        assert!(page.iter().all(|d| d.payload
            == d.id.as_str()[1..].trim_start_matches('0').as_bytes()
            || d.id.as_str() == "t000000"));
        letters += page.len();
        after = Some(last.id.clone());
    }
    assert_eq!(letters, count / 2);
    let id = TaskId::from(format!("t{:06}", count / 2 + 1));
    assert_eq!(queue.get(&id).await.unwrap().unwrap().attempts, 1);
    eprintln!(
        "{backend:?}: listed {listed} pending and {letters} dead in pages of 1000 in {:?}",
        start.elapsed()
    );
    assert_eq!(
        queue.purge_dead(Duration::ZERO).await.unwrap(),
        (count / 2) as u64
    );
    assert_eq!(queue.stats().await.unwrap().dead, 0);
}

/// Issue 13: a fixed period, each occurrence delivered once, never early, with its own id
/// and its occurrence time as `due()`.
async fn a_recurring_period_delivers_each_occurrence_once(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    let id = queue
        .schedule_recurring(
            Recurring::every(ms(200))
                .id("tick")
                .payload(b"beat".to_vec()),
        )
        .await
        .unwrap();
    assert_eq!(id.as_str(), "tick");
    let mut deliveries = queue.deliveries();
    let mut occurrences = Vec::new();
    let start = std::time::Instant::now();
    while start.elapsed() < ms(1_300) {
        let Ok(Some(d)) = tokio::time::timeout(ms(400), deliveries.next()).await else {
            continue;
        };
        assert!(SystemTime::now() >= d.due(), "delivered early");
        assert_eq!((d.payload(), d.attempt()), (&b"beat"[..], 1));
        let at = d
            .id()
            .as_str()
            .strip_prefix("tick@")
            .expect("occurrence id");
        let at: u64 = at.parse().unwrap();
        assert_eq!(
            d.due(),
            std::time::UNIX_EPOCH + ms(at),
            "due() is the occurrence's time"
        );
        occurrences.push(at);
        d.ack().await.unwrap();
    }
    // At most the 7 occurrences due in 1.3 s (more would be early or twice); at least two,
    // however loaded the machine (missed ones collapse into one, so fewer than 7 is no fault).
    assert!((2..=7).contains(&occurrences.len()), "{occurrences:?}");
    let distinct: HashSet<_> = occurrences.iter().collect();
    assert_eq!(
        distinct.len(),
        occurrences.len(),
        "once each: {occurrences:?}"
    );
    for pair in occurrences.windows(2) {
        assert_eq!((pair[1] - pair[0]) % 200, 0, "{occurrences:?}");
    }
    let info = queue.get(&id).await.unwrap().unwrap();
    assert_eq!(
        info.state,
        TaskState::Pending,
        "the schedule waits for its next"
    );
}

async fn a_cron_expression_with_seconds_fires_on_whole_seconds(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    queue
        .schedule_recurring(Recurring::cron("* * * * * *").unwrap().id("each-second"))
        .await
        .unwrap();
    let mut deliveries = queue.deliveries();
    for _ in 0..2 {
        let d = tokio::time::timeout(Duration::from_secs(3), deliveries.next())
            .await
            .expect("an occurrence each second")
            .unwrap();
        let ms = d
            .due()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        assert_eq!(ms % 1_000, 0, "on a whole second: {ms}");
        assert!(SystemTime::now() >= d.due(), "never early");
        d.ack().await.unwrap();
    }
    assert!(Recurring::cron("* * * * * * * *").is_err());
}

async fn declaring_a_recurring_schedule_again_keeps_it_and_cancel_stops_it(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    let every = || {
        Recurring::every(ms(300))
            .id("job")
            .catch_up(CatchUp::Latest)
    };
    queue.schedule_recurring(every()).await.unwrap();
    let mut deliveries = queue.deliveries();
    let first = next(&mut deliveries).await;
    first.ack().await.unwrap();
    let due_before = queue.get(&"job".into()).await.unwrap().unwrap().due;
    // Declared again (a restart): kept, not reset.
    queue.schedule_recurring(every()).await.unwrap();
    assert_eq!(
        queue.get(&"job".into()).await.unwrap().unwrap().due,
        due_before
    );
    let second = next(&mut deliveries).await;
    assert_ne!(second.id(), first.id());
    second.ack().await.unwrap();
    assert!(queue.cancel_recurring(&"job".into()).await.unwrap());
    assert!(!queue.cancel_recurring(&"job".into()).await.unwrap());
    assert_eq!(queue.get(&"job".into()).await.unwrap(), None);
    nothing_within(&mut deliveries, ms(700)).await;
    let error = queue
        .schedule_recurring(Recurring::every(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Invalid(_)), "{error:?}");
}

/// Issue 13: a recurring schedule survives a restart of the embedded store; occurrences
/// missed while it was closed collapse into one (or all come, with `CatchUp::All`).
#[tokio::test]
async fn missed_occurrences_collapse_after_a_restart_of_the_embedded_store() {
    for (catch_up, id) in [(CatchUp::Latest, "latest"), (CatchUp::All, "all")] {
        let f = fixture(Backend::Embedded).unwrap();
        let queue = f.open().await;
        queue
            // A period of 250 ms: the first delivery after the restart may come that late
            // on a loaded machine before the next occurrence is due, not only 100 ms.
            .schedule_recurring(Recurring::every(ms(250)).id(id).catch_up(catch_up))
            .await
            .unwrap();
        let mut deliveries = queue.deliveries();
        let mut seen = HashSet::new();
        for _ in 0..2 {
            let d = next(&mut deliveries).await;
            seen.insert(d.id().to_string());
            d.ack().await.unwrap();
        }
        drop(deliveries);
        queue.close().await;
        tokio::time::sleep(ms(2_500)).await; // about ten occurrences missed
        let queue = f.reopen(DurableQueue::builder()).await;
        let mut deliveries = queue.deliveries();
        let first = next(&mut deliveries).await;
        // Judged by due times, not by how fast they come: every occurrence due by the time the
        // first one arrived was missed while closed; the first one due after it is the
        // schedule running on again.
        let first_seen = std::time::SystemTime::now();
        assert!(first.due() <= first_seen);
        let mut caught_up = vec![first];
        let on_schedule = loop {
            let d = next(&mut deliveries).await;
            if d.due() > first_seen {
                break d;
            }
            caught_up.push(d);
        };
        let count = caught_up.len();
        for d in caught_up {
            assert!(seen.insert(d.id().to_string()), "{} twice", d.id());
            d.ack().await.unwrap();
        }
        match catch_up {
            CatchUp::Latest => assert_eq!(count, 1, "missed occurrences collapse into one"),
            _ => assert!(count >= 8, "each missed occurrence: {count}"),
        }
        assert!(seen.insert(on_schedule.id().to_string()));
        on_schedule.ack().await.unwrap();
        queue.close().await;
    }
}

/// Found by the independent attack: a stream polled while its claims waited for their commit
/// saw an empty buffer and no credits, and asked for a whole prefetch more (7 in flight with
/// prefetch 4 after reading 2, in some rounds). On two workers, so that the engine's commit
/// and the stream's poll race for real.
async fn a_stream_never_claims_more_than_its_prefetch_ahead(backend: Backend) {
    for round in 0..30 {
        let Some(fixture) = fixture(backend) else {
            return;
        };
        let queue = fixture
            .open_with(
                DurableQueue::builder()
                    .lease(Duration::from_secs(10))
                    .prefetch(4),
            )
            .await;
        for i in 0..100u64 {
            queue
                .schedule(Task::new(vec![1]).id(format!("t{i}")))
                .await
                .unwrap();
        }
        let mut deliveries = queue.deliveries();
        let first = next(&mut deliveries).await;
        let held = next(&mut deliveries).await;
        first.ack().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let stats = queue.stats().await.unwrap();
        // One held, at most four claimed ahead.
        assert!(stats.in_flight <= 5, "round {round}: {stats:?}");
        assert!(stats.delivered <= 6, "round {round}: {stats:?}");
        drop(held);
        drop(deliveries);
        queue.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_a_stream_never_claims_more_than_its_prefetch_ahead() {
    a_stream_never_claims_more_than_its_prefetch_ahead(Backend::Embedded).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_stream_never_claims_more_than_its_prefetch_ahead() {
    a_stream_never_claims_more_than_its_prefetch_ahead(Backend::Redis).await;
}

/// Found by the independent attack: paging through the in-flight tasks of an embedded store
/// skipped a held delivery whose lease never changed, because the claims still buffered were
/// ordered by a lease end that slides with the clock ("as if handed out now") and passed it.
/// Buffered claims now come after every delivery handed out, in id order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_in_flight_tasks_lists_a_held_delivery_once_while_others_wait_in_a_buffer() {
    let fixture = fixture(Backend::Embedded).unwrap();
    let queue = fixture
        .open_with(
            DurableQueue::builder()
                .lease(Duration::from_secs(1))
                .prefetch(4),
        )
        .await;
    for i in 0..5 {
        queue
            .schedule(Task::new(vec![]).id(format!("t{i}")))
            .await
            .unwrap();
    }
    let mut deliveries = queue.deliveries();
    let held = next(&mut deliveries).await; // t0; t1..t3 wait in the buffer
    held.extend(Duration::from_secs(3)).await.unwrap();
    let ids = |page: &[tokio_wheel_durable::TaskInfo]| -> Vec<String> {
        page.iter().map(|t| t.id.to_string()).collect()
    };
    let first = queue.list(TaskFilter::InFlight, None, 2).await.unwrap();
    assert_eq!(ids(&first), ["t0", "t1"], "the held delivery first");
    // Time passes; the held lease is unchanged and live.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut seen = ids(&first);
    let mut after = first.last().map(|t| t.id.clone());
    loop {
        let page = queue
            .list(TaskFilter::InFlight, after.as_ref(), 2)
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        after = page.last().map(|t| t.id.clone());
        seen.extend(ids(&page));
    }
    // t0 held, t1..t3 buffered (the prefetch of 4), each once.
    assert_eq!(seen, ["t0", "t1", "t2", "t3"]);
    assert_eq!(queue.stats().await.unwrap().in_flight, 4);
    drop(held);
    drop(deliveries);
    queue.close().await;
}
