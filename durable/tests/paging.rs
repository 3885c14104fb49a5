//! Paging with a position cursor (`list_page`): a cursor is a place in a list's order, so
//! whatever happens to the task it was taken from between pages — rescheduled, replaced,
//! cancelled, delivered and acked, redriven — the next page starts right after that place,
//! and no task that stayed in place is skipped or listed twice. Both backends.

mod support;

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use support::backend::{Backend, fixture};
use tokio_wheel_durable::{
    Cursor, DurableQueue, Error, Page, RetryPolicy, Task, TaskFilter, TaskId, TaskInfo,
};

on_every_backend!(
    a_thousand_tasks_paged_seven_at_a_time_equal_the_whole_list,
    the_cursor_holds_its_place_whatever_happens_to_its_task,
    in_flight_and_dead_lists_page_by_position_too,
    malformed_and_foreign_cursors_are_refused_or_harmless,
);

fn hour_from_now() -> SystemTime {
    SystemTime::now() + Duration::from_secs(3600)
}

fn ids(items: &[TaskInfo]) -> Vec<String> {
    items.iter().map(|t| t.id.as_str().to_owned()).collect()
}

async fn page(queue: &DurableQueue, filter: TaskFilter, cursor: Option<&Cursor>, n: usize) -> Page {
    queue.list_page(filter, cursor, n).await.unwrap()
}

/// Every page after the first, to the end.
async fn rest(
    queue: &DurableQueue,
    filter: TaskFilter,
    mut cursor: Option<Cursor>,
    n: usize,
) -> Vec<String> {
    let mut all = Vec::new();
    while let Some(at) = cursor {
        let next = page(queue, filter, Some(&at), n).await;
        all.extend(ids(&next.items));
        cursor = next.next;
    }
    all
}

async fn a_thousand_tasks_paged_seven_at_a_time_equal_the_whole_list(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    let base = hour_from_now();
    // Ten due times, a hundred tasks each: most of the order is ties, broken by schedule order.
    let schedules = (0..1000).map(|i| {
        let queue = queue.clone();
        async move {
            let due = base + Duration::from_millis((i % 10) * 1000);
            queue
                .schedule(Task::new("p").id(format!("task-{i:04}")).at(due))
                .await
                .unwrap();
        }
    });
    futures::future::join_all(schedules).await;
    let whole = ids(&queue.list(TaskFilter::Pending, None, 1000).await.unwrap());
    assert_eq!(whole.len(), 1000);
    let first = page(&queue, TaskFilter::Pending, None, 7).await;
    let mut paged = ids(&first.items);
    paged.extend(rest(&queue, TaskFilter::Pending, first.next, 7).await);
    assert_eq!(paged, whole);
}

/// 40 pending tasks, 20 of them due at one instant (ties). Page 5 at a time, and between
/// pages do something to the cursor's own task: reschedule it later, reschedule it earlier,
/// replace it, cancel it, deliver and ack it. The others stay in place: each is listed once,
/// in order.
async fn the_cursor_holds_its_place_whatever_happens_to_its_task(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f
        .open_named(DurableQueue::builder().prefetch(1), "moves")
        .await;
    let base = hour_from_now();
    for i in 0..40u64 {
        let due = base + Duration::from_millis(if i < 20 { 0 } else { i * 10 });
        queue
            .schedule(Task::new("p").id(format!("t{i:02}")).at(due))
            .await
            .unwrap();
    }
    let order = ids(&queue.list(TaskFilter::Pending, None, 100).await.unwrap());
    let mut seen: Vec<String> = Vec::new();
    let mut moved: HashSet<String> = HashSet::new();
    let mut cursor: Option<Cursor> = None;
    let mut deliveries = queue.deliveries();
    for turn in 0.. {
        let next = page(&queue, TaskFilter::Pending, cursor.as_ref(), 5).await;
        seen.extend(ids(&next.items));
        let Some(at) = next.next else { break };
        let own: TaskId = next.items.last().unwrap().id.clone();
        moved.insert(own.to_string());
        match turn % 5 {
            0 => assert!(
                queue
                    .reschedule(&own, base + Duration::from_secs(7200))
                    .await
                    .unwrap()
            ),
            1 => assert!(
                queue
                    .reschedule(&own, base - Duration::from_secs(60))
                    .await
                    .unwrap()
            ),
            2 => {
                queue
                    .schedule(Task::new("again").id(own.as_str()).at(base))
                    .await
                    .unwrap();
            }
            3 => assert!(queue.cancel(&own).await.unwrap()),
            _ => {
                // Due now: the only due task, so the stream (prefetch 1) gets it.
                assert!(queue.reschedule(&own, SystemTime::now()).await.unwrap());
                let delivery = tokio::time::timeout(Duration::from_secs(5), deliveries.next())
                    .await
                    .expect("delivered")
                    .unwrap();
                assert_eq!(delivery.id(), &own);
                delivery.ack().await.unwrap();
            }
        }
        cursor = Some(at);
    }
    let stayed: Vec<&String> = order.iter().filter(|id| !moved.contains(*id)).collect();
    let seen_stayed: Vec<&String> = seen.iter().filter(|id| !moved.contains(*id)).collect();
    assert_eq!(
        seen_stayed, stayed,
        "every task that stayed, once, in order"
    );
    assert!(moved.len() >= 5, "{moved:?}");
}

/// In flight (by lease end) and dead (by time of death): the cursor's own task is acked, or
/// redriven, between pages; the others are each listed once.
async fn in_flight_and_dead_lists_page_by_position_too(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let builder = DurableQueue::builder().prefetch(12).retry(
        RetryPolicy::exponential(Duration::from_millis(1), Duration::from_millis(1))
            .max_attempts(1),
    );
    let queue = f.open_named(builder, "states").await;
    for i in 0..12 {
        queue
            .schedule(Task::new("p").id(format!("f{i:02}")))
            .await
            .unwrap();
    }
    let mut deliveries = queue.deliveries();
    let mut held = Vec::new();
    for _ in 0..12 {
        let delivery = tokio::time::timeout(Duration::from_secs(5), deliveries.next())
            .await
            .expect("delivered")
            .unwrap();
        held.push(delivery);
        // Distinct lease ends, mostly.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let order = ids(&queue.list(TaskFilter::InFlight, None, 100).await.unwrap());
    assert_eq!(order.len(), 12);
    let first = page(&queue, TaskFilter::InFlight, None, 4).await;
    let mut seen = ids(&first.items);
    let own = first.items.last().unwrap().id.clone();
    let index = held.iter().position(|d| d.id() == &own).unwrap();
    held.remove(index).ack().await.unwrap();
    seen.extend(rest(&queue, TaskFilter::InFlight, first.next, 4).await);
    let expected: Vec<String> = order
        .iter()
        .filter(|id| **id != own.as_str())
        .cloned()
        .collect();
    let seen_others: Vec<String> = seen
        .iter()
        .filter(|id| **id != own.as_str())
        .cloned()
        .collect();
    assert_eq!(seen_others, expected);

    // Each remaining delivery fails, one at a time: eleven dead letters in order of death.
    for delivery in held.drain(..) {
        delivery.fail("no").await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let order = ids(&queue.list(TaskFilter::Dead, None, 100).await.unwrap());
    assert_eq!(order.len(), 11);
    let first = page(&queue, TaskFilter::Dead, None, 3).await;
    let own = first.items.last().unwrap().id.clone();
    assert!(queue.redrive(&own).await.unwrap());
    let mut seen = ids(&first.items);
    seen.extend(rest(&queue, TaskFilter::Dead, first.next, 3).await);
    assert_eq!(
        seen, order,
        "the others once each, in order (the redriven one on page 1)"
    );
}

/// A cursor string edited by hand, a cursor of another list, a limit of 0: `Error::Invalid`.
/// A cursor of another queue is a position there too: a page, not an error. Edited numbers
/// that still parse are positions as well: past the end, an empty page.
async fn malformed_and_foreign_cursors_are_refused_or_harmless(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    let other = f.open_named(DurableQueue::builder(), "other").await;
    for i in 0..5 {
        queue
            .schedule(Task::new("p").id(format!("m{i}")).at(hour_from_now()))
            .await
            .unwrap();
        other
            .schedule(Task::new("p").id(format!("o{i}")).at(hour_from_now()))
            .await
            .unwrap();
    }
    let first = page(&queue, TaskFilter::Pending, None, 2).await;
    let cursor = first.next.clone().expect("more to come");
    let text = cursor.to_string();
    assert_eq!(text.parse::<Cursor>().unwrap(), cursor);
    for edited in [
        format!("{text}0"), // odd hex
        text.replacen('.', ":", 1),
        text.replacen('p', "x", 1),
        format!("{text}ff"), // not UTF-8 any more
        String::new(),
        "p.1.2".to_owned(),
    ] {
        assert!(
            matches!(edited.parse::<Cursor>(), Err(Error::Invalid(_))),
            "{edited:?}"
        );
    }
    for filter in [TaskFilter::InFlight, TaskFilter::Dead] {
        assert!(matches!(
            queue.list_page(filter, Some(&cursor), 2).await,
            Err(Error::Invalid(_))
        ));
    }
    assert!(matches!(
        queue.list_page(TaskFilter::Pending, None, 0).await,
        Err(Error::Invalid(_))
    ));
    // Another queue's cursor: a position in this one.
    let foreign = page(&other, TaskFilter::Pending, None, 1)
        .await
        .next
        .unwrap();
    let there = page(&queue, TaskFilter::Pending, Some(&foreign), 10).await;
    assert!(there.items.len() <= 5);
    // A time edited far into the future: past the end.
    let far: Cursor = format!("p.{}.0.", 1u64 << 52).parse().unwrap();
    let end = page(&queue, TaskFilter::Pending, Some(&far), 10).await;
    assert!(end.items.is_empty() && end.next.is_none());
    // And the genuine cursor still goes on where it was.
    let second = page(&queue, TaskFilter::Pending, Some(&cursor), 10).await;
    assert_eq!(second.items.len(), 3);
    assert!(second.next.is_none());
}

/// On a Redis queue spread over partitions, pages go one partition after another; with a
/// cursor's own task cancelled between pages, every other task is listed once, in the order
/// `list` gives.
#[cfg(feature = "redis")]
#[tokio::test]
async fn on_a_partitioned_redis_queue_every_task_is_listed_once() {
    let Some(f) = fixture(Backend::Redis) else {
        return;
    };
    let queue = f
        .open_named(DurableQueue::builder().partitions(4), "parts")
        .await;
    let base = hour_from_now();
    for i in 0..200u64 {
        let due = base + Duration::from_millis(i % 3);
        queue
            .schedule(Task::new("p").id(format!("p{i:03}")).at(due))
            .await
            .unwrap();
    }
    let whole = ids(&queue.list(TaskFilter::Pending, None, 1000).await.unwrap());
    assert_eq!(whole.len(), 200);
    let mut seen = Vec::new();
    let mut cancelled = HashSet::new();
    let mut cursor: Option<Cursor> = None;
    loop {
        let next = page(&queue, TaskFilter::Pending, cursor.as_ref(), 7).await;
        seen.extend(ids(&next.items));
        let Some(at) = next.next else { break };
        let own = next.items.last().unwrap().id.clone();
        assert!(queue.cancel(&own).await.unwrap());
        cancelled.insert(own.to_string());
        cursor = Some(at);
    }
    let expected: Vec<&String> = whole.iter().filter(|id| !cancelled.contains(*id)).collect();
    let others: Vec<&String> = seen.iter().filter(|id| !cancelled.contains(*id)).collect();
    assert_eq!(others, expected);
}
