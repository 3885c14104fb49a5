//! Pausing a queue (issue 29 item 3): while paused no worker is handed a task — in this
//! process or another sharing the queue — scheduling goes on, and the pause holds across a
//! restart; resuming hands out what is due at once, idle workers woken. Both backends.

mod support;

use std::time::Duration;

use tokio_wheel_durable::{DurableQueue, Task};

use support::backend::{Backend, fixture, next, nothing_within};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

on_every_backend!(
    a_paused_queue_hands_out_nothing_until_resumed,
    a_pause_holds_across_a_restart,
    a_pause_stops_every_handle_and_a_resume_wakes_the_idle_ones,
);

async fn a_paused_queue_hands_out_nothing_until_resumed(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    queue.schedule(Task::new("a").id("a")).await.unwrap();
    assert!(!queue.is_paused().await.unwrap());
    queue.pause().await.unwrap();
    assert!(queue.is_paused().await.unwrap());
    assert!(queue.stats().await.unwrap().paused);
    // Scheduling goes on while paused; nothing is handed out.
    queue.schedule(Task::new("b").id("b")).await.unwrap();
    let mut deliveries = queue.deliveries();
    nothing_within(&mut deliveries, ms(400)).await;
    assert_eq!(queue.len().await.unwrap(), 2);

    queue.resume().await.unwrap();
    assert!(!queue.stats().await.unwrap().paused);
    let mut ids = Vec::new();
    for _ in 0..2 {
        let delivery = next(&mut deliveries).await;
        ids.push(delivery.id().to_string());
        delivery.ack().await.unwrap();
    }
    ids.sort();
    assert_eq!(ids, ["a", "b"]);
}

async fn a_pause_holds_across_a_restart(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    queue.pause().await.unwrap();
    queue.schedule(Task::new("a").id("kept")).await.unwrap();
    queue.close().await;
    drop(queue);

    let queue = f.reopen(DurableQueue::builder()).await;
    assert!(queue.is_paused().await.unwrap(), "paused after a restart");
    let mut deliveries = queue.deliveries();
    nothing_within(&mut deliveries, ms(400)).await;
    queue.resume().await.unwrap();
    let delivery = next(&mut deliveries).await;
    assert_eq!(delivery.id().as_str(), "kept");
    delivery.ack().await.unwrap();
}

/// Two handles on one queue (on Redis, as two processes would be; on the embedded store, two
/// streams of one handle): a pause made through one stops the other's stream, and the resume
/// wakes it while it idles — no poll, it is handed the task at once.
async fn a_pause_stops_every_handle_and_a_resume_wakes_the_idle_ones(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let first = f.open().await;
    let second = match backend {
        Backend::Embedded => first.clone(),
        Backend::Redis => f.open().await,
    };
    let mut idle = second.deliveries();
    // The stream idles (nothing due) before the pause.
    nothing_within(&mut idle, ms(200)).await;
    first.pause().await.unwrap();
    second.schedule(Task::new("x").id("due-now")).await.unwrap();
    nothing_within(&mut idle, ms(400)).await;
    first.resume().await.unwrap();
    let delivery = tokio::time::timeout(Duration::from_secs(2), next(&mut idle))
        .await
        .expect("the idle worker is woken by the resume");
    assert_eq!(delivery.id().as_str(), "due-now");
    delivery.ack().await.unwrap();
}
