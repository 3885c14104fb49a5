//! Attacks on the position cursor (`list_page`, `recurring_page`), from the outside (written
//! against API.md, the README and the rustdoc, not the implementation): whatever happens to
//! the cursor's own task between pages (acked, cancelled, rescheduled, replaced, redriven), no
//! task that stayed in place is skipped or listed twice; garbage and foreign cursors are
//! `Error::Invalid`, never a panic. The `twq` attacks are in `attack_cli.rs`.

mod support;

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use support::backend::{Backend, fixture, next_delivery};
use tokio_wheel_durable::{Cursor, DurableQueue, Error, Recurring, Task, TaskFilter, TaskId};

on_every_backend!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    pending_cursor_survives_whatever_happens_to_its_task,
    pending_cursor_inside_a_tie_group,
    pending_cursor_task_acked_or_redelivered,
    in_flight_and_dead_cursors_survive_their_task,
    garbage_and_foreign_cursors_are_invalid,
    recurring_cursor_survives_a_cancelled_schedule,
    dead_cursor_with_ties_in_time_of_death,
    in_flight_cursor_task_redelivered_after_its_lease,
);

/// Pages through `filter` with `limit`, calling `between(last id of the page)` after each
/// page; returns every id listed, in order.
async fn page_all<F, Fut>(
    queue: &DurableQueue,
    filter: TaskFilter,
    limit: usize,
    mut between: F,
) -> Vec<String>
where
    F: FnMut(TaskId) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut out = Vec::new();
    let mut cursor: Option<Cursor> = None;
    for _ in 0..10_000 {
        let page = queue
            .list_page(filter, cursor.as_ref(), limit)
            .await
            .unwrap();
        assert!(page.items.len() <= limit);
        let last = page.items.last().map(|t| t.id.clone());
        out.extend(page.items.iter().map(|t| t.id.to_string()));
        match page.next {
            Some(next) => {
                // The printed form goes through a round trip, as on a command line.
                let again: Cursor = next.to_string().parse().unwrap();
                assert_eq!(again, next);
                cursor = Some(again);
                between(last.expect("a page with a next is not empty")).await;
            }
            None => return out,
        }
    }
    panic!("paging never ended");
}

/// Checks that the ids listed, restricted to those that stayed in place, are exactly
/// `expected_in_place` in order, each once.
fn in_place_once(listed: &[String], moved: &HashSet<String>, expected_in_place: &[String]) {
    let kept: Vec<&String> = listed.iter().filter(|i| !moved.contains(*i)).collect();
    let want: Vec<&String> = expected_in_place
        .iter()
        .filter(|i| !moved.contains(*i))
        .collect();
    assert_eq!(
        kept, want,
        "tasks that stayed in place were skipped, repeated or reordered"
    );
}

async fn pending_cursor_survives_whatever_happens_to_its_task(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx.open().await;
    let base = SystemTime::now() + Duration::from_secs(86_400);
    // 60 tasks, due in pairs (ties), in a known order.
    let ids: Vec<String> = (0..60).map(|i| format!("k{i:02}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let due = base + Duration::from_secs((i / 2) as u64);
        queue
            .schedule(Task::new(b"v".to_vec()).id(id.as_str()).at(due))
            .await
            .unwrap();
    }
    let moved = std::sync::Mutex::new(HashSet::new());
    let moves = std::sync::Mutex::new(std::collections::HashMap::<String, usize>::new());
    let step = std::sync::atomic::AtomicUsize::new(0);
    let listed = page_all(&queue, TaskFilter::Pending, 7, |last: TaskId| {
        let queue = &queue;
        let moved = &moved;
        let n = step.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *moves.lock().unwrap().entry(last.to_string()).or_default() += 1;
        async move {
            moved.lock().unwrap().insert(last.to_string());
            match n % 5 {
                0 => assert!(queue.cancel(&last).await.unwrap()),
                1 => assert!(
                    queue
                        .reschedule(&last, base + Duration::from_secs(10_000))
                        .await
                        .unwrap()
                ),
                2 => assert!(
                    queue
                        .reschedule(&last, base - Duration::from_secs(10_000))
                        .await
                        .unwrap()
                ),
                // Replaced in place: same due time, a later schedule sequence.
                3 => {
                    let due = queue.get(&last).await.unwrap().unwrap().due;
                    queue
                        .schedule(Task::new(b"w".to_vec()).id(last.as_str()).at(due))
                        .await
                        .unwrap();
                }
                _ => {
                    queue
                        .schedule(
                            Task::new(b"w".to_vec())
                                .id(last.as_str())
                                .at(base + Duration::from_secs(5)),
                        )
                        .await
                        .unwrap();
                }
            }
        }
    })
    .await;
    let moved = moved.into_inner().unwrap();
    in_place_once(&listed, &moved, &ids);
    // A task moved m times is listed at most m + 1 times (once per place it was in).
    let moves = moves.into_inner().unwrap();
    for m in &moved {
        let count = listed.iter().filter(|i| *i == m).count();
        assert!(
            count <= moves[m] + 1,
            "{m} listed {count} times, moved {}",
            moves[m]
        );
    }
}

async fn pending_cursor_inside_a_tie_group(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx.open().await;
    // 1200 tasks at one due time (more than a page limit): the cursor always falls inside the
    // group, whose order is the schedule order.
    let due = SystemTime::now() + Duration::from_secs(86_400);
    let ids: Vec<String> = (0..1200)
        .map(|i| format!("z{:04}", (i * 7919) % 1200))
        .collect();
    for a in queue
        .schedule_many(
            ids.iter()
                .map(|id| Task::new(Vec::new()).id(id.as_str()).at(due)),
        )
        .await
        .unwrap()
    {
        a.unwrap();
    }
    let moved = std::sync::Mutex::new(HashSet::new());
    let listed = page_all(&queue, TaskFilter::Pending, 97, |last: TaskId| {
        let queue = &queue;
        let moved = &moved;
        async move {
            moved.lock().unwrap().insert(last.to_string());
            assert!(queue.cancel(&last).await.unwrap());
        }
    })
    .await;
    in_place_once(&listed, &moved.into_inner().unwrap(), &ids);
    // Over the cap: one page never holds more than PAGE_LIMIT.
    let page = queue
        .list_page(TaskFilter::Pending, None, 5_000)
        .await
        .unwrap();
    assert!(page.items.len() <= tokio_wheel_durable::PAGE_LIMIT);
    assert!(page.next.is_some());
    let err = queue
        .list_page(TaskFilter::Pending, None, 0)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "{err:?}");
}

async fn pending_cursor_task_acked_or_redelivered(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx
        .open_named(DurableQueue::builder().prefetch(1), "queue")
        .await;
    let past = SystemTime::now() - Duration::from_secs(60);
    let future = SystemTime::now() + Duration::from_secs(86_400);
    // d0..d3 due long ago, f00..f19 in the future.
    let mut ids: Vec<String> = (0..4).map(|i| format!("d{i}")).collect();
    ids.extend((0..20).map(|i| format!("f{i:02}")));
    for (i, id) in ids.iter().enumerate() {
        let due = if i < 4 {
            past + Duration::from_secs(i as u64)
        } else {
            future + Duration::from_secs(i as u64)
        };
        queue
            .schedule(Task::new(b"v".to_vec()).id(id.as_str()).at(due))
            .await
            .unwrap();
    }
    let page = queue.list_page(TaskFilter::Pending, None, 4).await.unwrap();
    let first: Vec<String> = page.items.iter().map(|t| t.id.to_string()).collect();
    assert_eq!(first, ids[..4]);
    let cursor = page.next.unwrap();
    // The due ones are claimed: d0, d1 acked, d2 retried (redelivered later), d3 (the
    // cursor's own task) acked.
    let mut stream = queue.deliveries();
    for _ in 0..4 {
        let d = stream.next().await.unwrap();
        if d.id().as_str() == "d2" {
            d.retry_after(Duration::from_secs(3600)).await.unwrap();
        } else {
            d.ack().await.unwrap();
        }
    }
    drop(stream);
    let page = queue
        .list_page(TaskFilter::Pending, Some(&cursor), 1000)
        .await
        .unwrap();
    let rest: Vec<String> = page.items.iter().map(|t| t.id.to_string()).collect();
    let want: Vec<String> = ids[4..].to_vec();
    let in_place: Vec<&String> = rest.iter().filter(|i| *i != "d2").collect();
    assert_eq!(in_place, want.iter().collect::<Vec<_>>());
}

async fn in_flight_and_dead_cursors_survive_their_task(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx
        .open_named(
            DurableQueue::builder()
                .prefetch(40)
                .lease(Duration::from_secs(600)),
            "queue",
        )
        .await;
    let now = SystemTime::now() - Duration::from_millis(10);
    for i in 0..30 {
        queue
            .schedule(Task::new(b"v".to_vec()).id(format!("i{i:02}")).at(now))
            .await
            .unwrap();
    }
    let mut stream = queue.deliveries();
    let mut held = std::collections::HashMap::new();
    for _ in 0..30 {
        let d = next_delivery(&mut stream).await;
        held.insert(d.id().to_string(), d);
    }
    // In flight, by lease end then id: the full order first, then paged while the cursor's
    // task is acked between pages.
    let order = page_all(&queue, TaskFilter::InFlight, 1000, |_| async {}).await;
    assert_eq!(order.len(), 30);
    let held = std::sync::Mutex::new(held);
    let moved = std::sync::Mutex::new(HashSet::new());
    let listed = page_all(&queue, TaskFilter::InFlight, 4, |last: TaskId| {
        let d = held.lock().unwrap().remove(last.as_str()).unwrap();
        moved.lock().unwrap().insert(last.to_string());
        async move { d.ack().await.unwrap() }
    })
    .await;
    in_place_once(&listed, &moved.into_inner().unwrap(), &order);
    // Dead letters: fail the rest one by one, page them, redrive the cursor's task.
    let mut rest: Vec<_> = held.into_inner().unwrap().into_values().collect();
    rest.sort_by(|a, b| a.id().as_str().cmp(b.id().as_str()));
    for d in rest {
        d.fail("boom").await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    drop(stream);
    let dead_order = page_all(&queue, TaskFilter::Dead, 1000, |_| async {}).await;
    let moved = std::sync::Mutex::new(HashSet::new());
    let listed = page_all(&queue, TaskFilter::Dead, 3, |last: TaskId| {
        let queue = &queue;
        moved.lock().unwrap().insert(last.to_string());
        async move { assert!(queue.redrive(&last).await.unwrap()) }
    })
    .await;
    in_place_once(&listed, &moved.into_inner().unwrap(), &dead_order);
}

async fn garbage_and_foreign_cursors_are_invalid(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx.open().await;
    let far = SystemTime::now() + Duration::from_secs(86_400);
    for i in 0..5 {
        queue
            .schedule(Task::new(Vec::new()).id(format!("g{i}")).at(far))
            .await
            .unwrap();
    }
    for junk in [
        "",
        "p",
        "p.",
        "p..",
        "p.1.2",
        "p.1.2.zz",
        "p.1.2.6",
        "p.-1.2.00",
        "p.99999999999999999999999999.1.00",
        "p.1.99999999999999999999999999.00",
        "x.1.2.00",
        "P.1.2.00",
        "p.1.2.00.extra",
        "p.１.2.00",
        "p.1.2.\u{0}",
        "not a cursor",
        "\n",
    ] {
        match junk.parse::<Cursor>() {
            Err(e) => assert!(matches!(e, Error::Invalid(_)), "{junk:?}: {e:?}"),
            // If it parses, using it must not panic and must be a clean answer.
            Ok(c) => {
                let r = queue.list_page(TaskFilter::Pending, Some(&c), 10).await;
                assert!(
                    matches!(r, Ok(_) | Err(Error::Invalid(_))),
                    "{junk:?}: {r:?}"
                );
                assert_eq!(c.to_string().parse::<Cursor>().unwrap(), c, "{junk:?}");
            }
        }
    }
    // A cursor of another list is refused by each other list.
    let pending = queue
        .list_page(TaskFilter::Pending, None, 2)
        .await
        .unwrap()
        .next
        .unwrap();
    for filter in [TaskFilter::InFlight, TaskFilter::Dead] {
        let err = queue
            .list_page(filter, Some(&pending), 10)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Invalid(_)), "{filter:?}: {err:?}");
    }
    // recurring_page takes a pending cursor, but not one of the in-flight or dead lists.
    queue.recurring_page(Some(&pending), 10).await.unwrap();
    let err = queue.recurring_page(None, 0).await.unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "{err:?}");
    // A cursor whose task id is unicode, with a newline, survives its printed form.
    queue
        .schedule(
            Task::new(Vec::new())
                .id("ü\nn€ 👀")
                .at(far - Duration::from_secs(1)),
        )
        .await
        .unwrap();
    let page = queue.list_page(TaskFilter::Pending, None, 1).await.unwrap();
    assert_eq!(page.items[0].id.as_str(), "ü\nn€ 👀");
    let shown = page.next.as_ref().unwrap().to_string();
    assert!(!shown.contains('\n') && shown.is_ascii(), "{shown:?}");
    let back: Cursor = shown.parse().unwrap();
    let next = queue
        .list_page(TaskFilter::Pending, Some(&back), 10)
        .await
        .unwrap();
    let ids: Vec<&str> = next.items.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["g0", "g1", "g2", "g3", "g4"]);
    // The same cursor on another queue means "after that place" there.
    let other = fx.open_named(DurableQueue::builder(), "other").await;
    other
        .schedule(Task::new(Vec::new()).id("o").at(far))
        .await
        .unwrap();
    let there = other
        .list_page(TaskFilter::Pending, Some(&back), 10)
        .await
        .unwrap();
    assert_eq!(there.items.len(), 1);
}

async fn recurring_cursor_survives_a_cancelled_schedule(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx.open().await;
    // Ordinary pending tasks interleaved with 25 schedules (every 1h..25h: the first
    // occurrence an hour or more away, so nothing fires while we page).
    let now = SystemTime::now();
    let mut want = Vec::new();
    for i in 0..25u64 {
        let id = format!("rec{i:02}");
        queue
            .schedule_recurring(
                Recurring::every(Duration::from_secs(3600 * (i + 1)))
                    .id(id.as_str())
                    .payload(b"p".to_vec()),
            )
            .await
            .unwrap();
        want.push(id);
        queue
            .schedule(
                Task::new(Vec::new())
                    .id(format!("t{i}"))
                    .at(now + Duration::from_secs(3600 * i + 1800)),
            )
            .await
            .unwrap();
    }
    // (On Redis a schedule just declared is due at once, until a worker moves it on: none
    // runs here, so they sit tied at their declaration time while we page.)
    let mut full = Vec::new();
    let mut cursor = None;
    loop {
        let page = queue.recurring_page(cursor.as_ref(), 1000).await.unwrap();
        full.extend(page.items.iter().map(|r| r.id.to_string()));
        match page.next {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    let mut sorted = full.clone();
    sorted.sort();
    assert_eq!(sorted, want);
    let mut listed = Vec::new();
    let mut moved = HashSet::new();
    let mut cursor: Option<Cursor> = None;
    loop {
        let page = queue.recurring_page(cursor.as_ref(), 4).await.unwrap();
        listed.extend(page.items.iter().map(|r| r.id.to_string()));
        match page.next {
            Some(n) => {
                if let Some(last) = page.items.last() {
                    moved.insert(last.id.to_string());
                    assert!(queue.cancel_recurring(&last.id).await.unwrap());
                }
                cursor = Some(n.to_string().parse().unwrap());
            }
            None => break,
        }
    }
    in_place_once(&listed, &moved, &full);
}

async fn dead_cursor_with_ties_in_time_of_death(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx
        .open_named(DurableQueue::builder().prefetch(64), "queue")
        .await;
    let now = SystemTime::now() - Duration::from_millis(5);
    let n = 60;
    queue
        .schedule_many((0..n).map(|i| Task::new(Vec::new()).id(format!("x{i:02}")).at(now)))
        .await
        .unwrap();
    let mut stream = queue.deliveries();
    let mut held = Vec::new();
    for _ in 0..n {
        held.push(next_delivery(&mut stream).await);
    }
    // All fail at once: many share their time of death.
    futures::future::join_all(held.iter().map(|d| d.fail("boom")))
        .await
        .into_iter()
        .for_each(|r| r.unwrap());
    drop(held);
    drop(stream);
    let order = page_all(&queue, TaskFilter::Dead, 1000, |_| async {}).await;
    assert_eq!(order.len(), n);
    let moved = std::sync::Mutex::new(HashSet::new());
    let step = std::sync::atomic::AtomicUsize::new(0);
    let listed = page_all(&queue, TaskFilter::Dead, 4, |last: TaskId| {
        let queue = &queue;
        moved.lock().unwrap().insert(last.to_string());
        let k = step.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        async move {
            if k.is_multiple_of(2) {
                assert!(queue.redrive(&last).await.unwrap());
            } else {
                // Purging every dead letter but those not yet listed is not possible by
                // age; cancel is refused for dead ones, so re-schedule (replace) it instead.
                queue
                    .schedule(
                        Task::new(Vec::new())
                            .id(last.as_str())
                            .after(Duration::from_secs(3600)),
                    )
                    .await
                    .unwrap();
            }
        }
    })
    .await;
    in_place_once(&listed, &moved.into_inner().unwrap(), &order);
}

async fn in_flight_cursor_task_redelivered_after_its_lease(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx
        .open_named(
            DurableQueue::builder()
                .prefetch(1)
                .lease(Duration::from_millis(600)),
            "queue",
        )
        .await;
    let now = SystemTime::now() - Duration::from_millis(5);
    queue
        .schedule_many((0..12).map(|i| Task::new(Vec::new()).id(format!("l{i:02}")).at(now)))
        .await
        .unwrap();
    let mut stream = queue.deliveries();
    let mut held = Vec::new();
    for _ in 0..12 {
        let d = next_delivery(&mut stream).await;
        // Kept well past the test (extending moves it to a later lease end: listed below).
        d.extend(Duration::from_secs(60)).await.unwrap();
        held.push(d);
    }
    let order = page_all(&queue, TaskFilter::InFlight, 1000, |_| async {}).await;
    let first = queue
        .list_page(TaskFilter::InFlight, None, 3)
        .await
        .unwrap();
    let cursor = first.next.clone().unwrap();
    let cursor_task = first.items.last().unwrap().id.clone();
    // The cursor's task is handed back (retried at once) and handed out again: a new lease
    // end, later than every other.
    let mut others = Vec::new();
    for d in held {
        if *d.id() == cursor_task {
            d.retry_after(Duration::ZERO).await.unwrap();
        } else {
            others.push(d);
        }
    }
    let order_after: Vec<String> = order.clone();
    let again = next_delivery(&mut stream).await;
    assert_eq!(*again.id(), cursor_task);
    assert_eq!(again.attempt(), 2);
    let rest = queue
        .list_page(TaskFilter::InFlight, Some(&cursor), 1000)
        .await
        .unwrap();
    let rest: Vec<String> = rest.items.iter().map(|t| t.id.to_string()).collect();
    // Everything whose lease end lies after the cursor is listed once (the redelivered task
    // included, at its new place, at most once).
    let at = order
        .iter()
        .position(|i| *i == cursor_task.to_string())
        .unwrap();
    let want: Vec<String> = order_after[at + 1..].to_vec();
    let kept: Vec<String> = rest
        .iter()
        .filter(|i| **i != cursor_task.to_string())
        .cloned()
        .collect();
    assert_eq!(kept, want, "before the move: {order:?}");
    assert!(
        rest.iter()
            .filter(|i| **i == cursor_task.to_string())
            .count()
            <= 1
    );
    again.ack().await.unwrap();
    for d in others {
        d.ack().await.unwrap();
    }
}
