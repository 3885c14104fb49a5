//! What an operator reads: one task's payload (`payload`), the recurring schedules
//! (`recurring_page`, paged by position through a backlog of tasks, each schedule once), and
//! on Redis a read-only handle (`Builder::read_only`) that writes nothing to the server and
//! refuses a queue that is not there. Both backends where it applies.

mod support;

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use support::backend::{Backend, fixture};
use tokio_wheel_durable::{
    CatchUp, Cursor, DurableQueue, Error, Recurring, RecurringInfo, RecurringKind, Task,
    TaskFilter, TaskId,
};

on_every_backend!(
    schedules_among_a_backlog_are_listed_once_each,
    payloads_are_read_back_exactly,
    bad_limits_and_foreign_cursors_are_refused,
);

fn ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Every schedule, `n` per page, following `next` to the end.
async fn all_schedules(queue: &DurableQueue, n: usize) -> (Vec<RecurringInfo>, usize) {
    let mut all = Vec::new();
    let mut cursor: Option<Cursor> = None;
    let mut pages = 0;
    loop {
        let page = queue.recurring_page(cursor.as_ref(), n).await.unwrap();
        pages += 1;
        assert!(page.items.len() <= n);
        all.extend(page.items);
        match page.next {
            // A printed cursor reads back as the same position.
            Some(next) => cursor = Some(next.to_string().parse().unwrap()),
            None => break,
        }
    }
    (all, pages)
}

/// A backlog of `tasks` pending tasks spread from an hour ago to three hours ahead, and
/// seven schedules of every kind among them; returns the schedules' declared definitions
/// and the time window they were declared in.
async fn backlog_with_schedules(queue: &DurableQueue, tasks: usize) -> (Vec<Recurring>, u64, u64) {
    let now = SystemTime::now();
    let calls = (0..tasks).map(|i| {
        let queue = queue.clone();
        async move {
            let offset = Duration::from_secs((i as u64 * 17) % (4 * 3600));
            let due = now - Duration::from_secs(3600) + offset;
            queue
                .schedule(
                    Task::new(vec![b't'; i % 5])
                        .id(format!("task-{i:05}"))
                        .at(due),
                )
                .await
                .unwrap();
        }
    });
    futures::stream::iter(calls)
        .buffer_unordered(200)
        .collect::<Vec<()>>()
        .await;
    let schedules = vec![
        Recurring::every(Duration::from_secs(1800)).id("half-hourly"),
        Recurring::every(Duration::from_secs(7200))
            .id("two-hourly")
            .catch_up(CatchUp::All),
        Recurring::every(Duration::from_millis(90_000))
            .id("ninety")
            .payload(vec![0xff; 3]),
        Recurring::cron("0 0 * * * *")
            .unwrap()
            .id("hourly")
            .payload(b"report".to_vec()),
        Recurring::cron("30 15 10 * * *").unwrap().id("daily"),
        Recurring::cron("0 */5 * * * *")
            .unwrap()
            .catch_up(CatchUp::All),
        Recurring::every(Duration::from_secs(3 * 3600)).id("three-hourly"),
    ];
    let before = ms(SystemTime::now());
    for recurring in &schedules {
        queue.schedule_recurring(recurring.clone()).await.unwrap();
    }
    let after = ms(SystemTime::now());
    (schedules, before, after)
}

/// The next occurrence of a cron schedule, from its own reading in `RecurringInfo` checked
/// loosely by kind: every-period schedules are due one period after they were declared.
fn check(info: &RecurringInfo, before: u64, after: u64) {
    let next = ms(info.next);
    match (info.id.as_str(), &info.kind) {
        ("half-hourly", RecurringKind::Every(p)) => {
            assert_eq!(*p, Duration::from_secs(1800));
            assert!(
                (before + 1_800_000..=after + 1_800_000).contains(&next),
                "{info:?}"
            );
            assert_eq!((info.catch_up, info.payload_len), (CatchUp::Latest, 0));
        }
        ("two-hourly", RecurringKind::Every(p)) => {
            assert_eq!(*p, Duration::from_secs(7200));
            assert_eq!(info.catch_up, CatchUp::All);
        }
        ("ninety", RecurringKind::Every(p)) => {
            assert_eq!((*p, info.payload_len), (Duration::from_millis(90_000), 3));
            assert!(
                (before + 90_000..=after + 90_000).contains(&next),
                "{info:?}"
            );
        }
        ("hourly", RecurringKind::Cron(e)) => {
            assert_eq!((e.as_str(), info.payload_len), ("0 0 * * * *", 6));
            // The top of the hour after the declaration.
            let tops = [before, after].map(|t| (t / 3_600_000 + 1) * 3_600_000);
            assert!(tops.contains(&next), "{info:?}");
        }
        ("daily", RecurringKind::Cron(e)) => {
            assert_eq!(e, "30 15 10 * * *");
            assert_eq!(
                next % 86_400_000,
                (10 * 3600 + 15 * 60 + 30) * 1000,
                "{info:?}"
            );
            assert!(next > before && next <= after + 86_400_000, "{info:?}");
        }
        ("cron 0 */5 * * * *", RecurringKind::Cron(e)) => {
            assert_eq!((e.as_str(), info.catch_up), ("0 */5 * * * *", CatchUp::All));
            assert_eq!(next % 300_000, 0, "{info:?}");
        }
        ("three-hourly", RecurringKind::Every(_)) => {}
        _ => panic!("unexpected schedule {info:?}"),
    }
}

async fn schedules_among_a_backlog_are_listed_once_each(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    let (schedules, before, after) = backlog_with_schedules(&queue, 2500).await;
    for n in [1, 2, 3, 1000] {
        let (found, pages) = all_schedules(&queue, n).await;
        let ids: Vec<&str> = found.iter().map(|i| i.id.as_str()).collect();
        let unique: HashSet<&str> = ids.iter().copied().collect();
        assert_eq!(ids.len(), unique.len(), "listed twice: {ids:?}");
        assert_eq!(ids.len(), schedules.len(), "{ids:?}");
        // 2507 pending entries, at most 1000 looked through per call.
        assert!(pages >= 3, "{pages} pages of {n}");
        for info in &found {
            check(info, before, after);
        }
        // In the pending list's order.
        let positions: Vec<usize> = {
            let mut order = Vec::new();
            let mut cursor = None;
            loop {
                let page = queue
                    .list_page(TaskFilter::Pending, cursor.as_ref(), 1000)
                    .await
                    .unwrap();
                order.extend(page.items.into_iter().map(|t| t.id));
                match page.next {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            found
                .iter()
                .map(|i| order.iter().position(|id| *id == i.id).unwrap())
                .collect()
        };
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    }
    // A cancelled schedule is gone from the list; the tasks were never listed.
    assert!(
        queue
            .cancel_recurring(&TaskId::from("daily"))
            .await
            .unwrap()
    );
    let (found, _) = all_schedules(&queue, 1000).await;
    assert_eq!(found.len(), 6);
    assert!(found.iter().all(|i| i.id.as_str() != "daily"));
    queue.close().await;
}

async fn payloads_are_read_back_exactly(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    let binary: Vec<u8> = (0..=255).collect();
    let later = Duration::from_secs(3600);
    let id = queue
        .schedule(Task::new(binary.clone()).id("bin").after(later))
        .await
        .unwrap();
    assert_eq!(queue.payload(&id).await.unwrap(), Some(binary));
    queue
        .schedule(Task::new(Vec::new()).id("empty").after(later))
        .await
        .unwrap();
    assert_eq!(
        queue.payload(&"empty".into()).await.unwrap(),
        Some(Vec::new())
    );
    assert_eq!(queue.payload(&"nothing".into()).await.unwrap(), None);
    let sweep = Recurring::every(Duration::from_secs(600))
        .id("sweep")
        .payload(b"each".to_vec());
    queue.schedule_recurring(sweep).await.unwrap();
    assert_eq!(
        queue.payload(&"sweep".into()).await.unwrap(),
        Some(b"each".to_vec())
    );
    // A cancelled task has none.
    assert!(queue.cancel(&id).await.unwrap());
    assert_eq!(queue.payload(&id).await.unwrap(), None);
    queue.close().await;
    assert_eq!(queue.payload(&"empty".into()).await, Err(Error::Closed));
}

async fn bad_limits_and_foreign_cursors_are_refused(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    assert!(matches!(
        queue.recurring_page(None, 0).await,
        Err(Error::Invalid(_))
    ));
    let dead: Cursor = "d.1.2.61".parse().unwrap();
    assert!(matches!(
        queue.recurring_page(Some(&dead), 5).await,
        Err(Error::Invalid(_))
    ));
    // An empty queue: nothing, and the end.
    let page = queue.recurring_page(None, 5).await.unwrap();
    assert!(page.items.is_empty() && page.next.is_none(), "{page:?}");
    queue.close().await;
}
