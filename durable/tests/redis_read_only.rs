//! A read-only handle (`Builder::read_only`) on Redis, for operators' tools and dashboards:
//! it writes nothing to the server — not at connect (an ordinary handle records the queue's
//! partition count), not in any call — so a misspelt queue name leaves no key behind and is
//! reported as [`Error::NoQueue`]; it reads the partition count the queue recorded, and a
//! queue made before the count was recorded still opens. Recurring schedules of a
//! partitioned queue are listed once each, on a server and on a Redis Cluster.
#![cfg(feature = "redis")]

mod support;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use support::redis_server;
use tokio_wheel::Wheel;
use tokio_wheel_durable::{
    Cursor, DurableQueue, Error, Recurring, RecurringInfo, Task, TaskFilter, TaskId,
};

/// Every key on the server (or one cluster node) with its serialized value: any write shows.
/// Kept replies (`tw:{q}:call:<invocation>`, written only by schedule and finish invocations
/// and expiring on their own) are left out, so one expiring mid-test is not taken for a write;
/// a handle that could schedule or finish would still show in the task keys.
fn snapshot(url: &str) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut connection = redis::Client::open(url).unwrap().get_connection().unwrap();
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut connection).unwrap();
    keys.into_iter()
        .filter(|key| !key.windows(6).any(|w| w == b":call:"))
        .map(|key| {
            let value: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut connection).unwrap();
            (key, value)
        })
        .collect()
}

async fn read_only(url: &str, name: &str, wheel: &Wheel) -> Result<DurableQueue, Error> {
    DurableQueue::builder()
        .read_only(true)
        .redis(url, name, wheel)
        .await
}

async fn all_schedules(queue: &DurableQueue, n: usize) -> Vec<RecurringInfo> {
    let mut all = Vec::new();
    let mut cursor: Option<Cursor> = None;
    loop {
        let page = queue.recurring_page(cursor.as_ref(), n).await.unwrap();
        all.extend(page.items);
        match page.next {
            Some(next) => cursor = Some(next),
            None => return all,
        }
    }
}

fn ids(items: &[RecurringInfo]) -> Vec<String> {
    let mut ids: Vec<String> = items.iter().map(|i| i.id.as_str().to_owned()).collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misspelt_queue_is_no_queue_and_leaves_no_key() {
    let Some(server) = redis_server::start() else {
        return;
    };
    let url = server.url();
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .redis(&url, "orders", &wheel)
        .await
        .unwrap();
    queue
        .schedule(Task::new("x").id("a").after(Duration::from_secs(600)))
        .await
        .unwrap();
    let before = snapshot(&url);
    assert!(!before.is_empty());
    let missing = read_only(&url, "ordres", &wheel).await.unwrap_err();
    assert_eq!(missing, Error::NoQueue("\"ordres\"".into()));
    assert_eq!(missing.to_string(), "no queue \"ordres\" on this server");
    assert_eq!(snapshot(&url), before, "a key was written");
    // An ordinary handle would have left one.
    DurableQueue::builder()
        .redis(&url, "ordres", &wheel)
        .await
        .unwrap()
        .close()
        .await;
    assert!(snapshot(&url).contains_key(&b"tw:{ordres}:config"[..]));
    queue.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_handle_reads_everything_and_writes_nothing() {
    let Some(server) = redis_server::start() else {
        return;
    };
    let url = server.url();
    let wheel = Wheel::new();
    // Three partitions; the read-only handle is opened without saying so.
    let writer = DurableQueue::builder()
        .partitions(3)
        .redis(&url, "parts", &wheel)
        .await
        .unwrap();
    for i in 0..1500u64 {
        let task = Task::new(format!("t{i}"))
            .id(format!("t{i}"))
            .after(Duration::from_secs(60 + i));
        writer.schedule(task).await.unwrap();
    }
    let names: Vec<String> = (0..9).map(|i| format!("every-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let every = Recurring::every(Duration::from_secs(60 * (i as u64 + 1))).id(name);
        writer
            .schedule_recurring(every.payload(vec![b'p'; i]))
            .await
            .unwrap();
    }
    let before = snapshot(&url);
    let reader = read_only(&url, "parts", &wheel).await.unwrap();
    assert_eq!(reader.stats().await.unwrap().pending, 1509);
    assert_eq!(reader.len().await.unwrap(), 1509);
    let t7 = TaskId::from("t7");
    assert_eq!(
        reader.get(&t7).await.unwrap(),
        writer.get(&t7).await.unwrap()
    );
    assert_eq!(reader.payload(&t7).await.unwrap(), Some(b"t7".to_vec()));
    let page = reader
        .list_page(TaskFilter::Pending, None, 10)
        .await
        .unwrap();
    assert_eq!(page.items.len(), 10);
    for n in [1, 4, 1000] {
        let found = all_schedules(&reader, n).await;
        assert_eq!(
            found.len(),
            names.len(),
            "listed twice or missed: {found:?}"
        );
        assert_eq!(ids(&found), names);
    }
    let every_4 = all_schedules(&reader, 1000)
        .await
        .into_iter()
        .find(|i| i.id.as_str() == "every-4");
    assert_eq!(every_4.unwrap().payload_len, 4);
    // Every write is refused before it reaches the server.
    let refused = [
        reader.schedule(Task::new("y").id("y")).await.map(drop),
        reader.cancel(&t7).await.map(drop),
        reader
            .reschedule(&t7, std::time::SystemTime::now())
            .await
            .map(drop),
        reader.redrive(&t7).await.map(drop),
        reader.purge_dead(Duration::ZERO).await.map(drop),
        reader
            .cancel_recurring(&TaskId::from("every-1"))
            .await
            .map(drop),
        reader
            .schedule_recurring(Recurring::every(Duration::from_secs(1)).id("z"))
            .await
            .map(drop),
    ];
    for result in refused {
        let Err(Error::Invalid(why)) = result else {
            panic!("a write went through: {result:?}");
        };
        assert!(why.contains("read-only"), "{why}");
    }
    // It never claims: its stream ends at once, the due schedules stay where they are.
    let mut deliveries = reader.deliveries();
    let next = tokio::time::timeout(Duration::from_secs(5), deliveries.next()).await;
    assert!(matches!(next, Ok(None)), "a read-only stream delivered");
    assert_eq!(snapshot(&url), before, "the read-only handle wrote");
    reader.close().await;
    assert_eq!(reader.stats().await, Err(Error::Closed));
    writer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_without_a_recorded_partition_count_still_opens() {
    let Some(server) = redis_server::start() else {
        return;
    };
    let url = server.url();
    let wheel = Wheel::new();
    let writer = DurableQueue::builder()
        .redis(&url, "old", &wheel)
        .await
        .unwrap();
    writer
        .schedule(Task::new("x").id("a").after(Duration::from_secs(600)))
        .await
        .unwrap();
    writer.close().await;
    // As a queue made before the count was recorded.
    let mut connection = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg("tw:{old}:config")
        .query(&mut connection)
        .unwrap();
    let before = snapshot(&url);
    let reader = read_only(&url, "old", &wheel).await.unwrap();
    assert_eq!(reader.len().await.unwrap(), 1);
    assert_eq!(snapshot(&url), before);
    reader.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_schedules_list_once_and_a_misspelt_queue_writes_nothing() {
    let Some(cluster) = support::redis_cluster::start() else {
        return;
    };
    let urls = cluster.urls();
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    let wheel = Wheel::new();
    let writer = DurableQueue::builder()
        .partitions(3)
        .redis_cluster(&seeds, "spread", &wheel)
        .await
        .unwrap();
    for i in 0..300u64 {
        let task = Task::new("t")
            .id(format!("t{i}"))
            .after(Duration::from_secs(60 + i));
        writer.schedule(task).await.unwrap();
    }
    let names: Vec<String> = (0..6).map(|i| format!("cron-{i}")).collect();
    for name in &names {
        writer
            .schedule_recurring(Recurring::cron("0 0 * * * *").unwrap().id(name))
            .await
            .unwrap();
    }
    let masters: Vec<String> = cluster
        .masters()
        .iter()
        .map(|port| format!("redis://127.0.0.1:{port}/"))
        .collect();
    let before: Vec<_> = masters.iter().map(|url| snapshot(url)).collect();
    let missing = DurableQueue::builder()
        .read_only(true)
        .redis_cluster(&seeds, "sprad", &wheel)
        .await
        .unwrap_err();
    assert!(matches!(missing, Error::NoQueue(_)), "{missing:?}");
    let reader = DurableQueue::builder()
        .read_only(true)
        .redis_cluster(&seeds, "spread", &wheel)
        .await
        .unwrap();
    for n in [1, 5] {
        let found = all_schedules(&reader, n).await;
        let unique: HashSet<String> = found.iter().map(|i| i.id.as_str().to_owned()).collect();
        assert_eq!(unique.len(), found.len(), "listed twice: {found:?}");
        assert_eq!(ids(&found), names);
    }
    reader.close().await;
    let after: Vec<_> = masters.iter().map(|url| snapshot(url)).collect();
    assert_eq!(after, before, "a key was written");
    writer.close().await;
}
