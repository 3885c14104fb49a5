//! Occurrence ids are the recurring schedules' own: an occurrence of schedule `report` due at
//! ms `T` is the task `report@T`, and no task of the user's can take that id (before, one
//! scheduled under it stood in for the occurrence, which was then never made). Both backends.

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use support::backend::{Backend, fixture};
use tokio_wheel_durable::{Error, Recurring, Task, TaskId};

on_every_backend!(
    ids_ending_in_at_and_digits_are_refused_and_others_accepted,
    a_user_task_cannot_stand_in_for_an_occurrence,
);

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

async fn ids_ending_in_at_and_digits_are_refused_and_others_accepted(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    for reserved in ["report@1767225600000", "x@0", "a@b@12", "@7"] {
        let refused = queue.schedule(Task::new("p").id(reserved)).await;
        let Err(Error::Invalid(why)) = &refused else {
            panic!("{reserved:?} accepted: {refused:?}");
        };
        assert!(why.contains(reserved), "names the id: {why}");
        let recurring = Recurring::every(Duration::from_secs(60)).id(reserved);
        assert!(
            matches!(
                queue.schedule_recurring(recurring).await,
                Err(Error::Invalid(_))
            ),
            "{reserved:?} as a schedule id"
        );
    }
    // Nothing was stored under them.
    assert_eq!(queue.len().await.unwrap(), 0);
    for allowed in [
        "alice@example.com",
        "build@v2",
        "report@",
        "report@12a",
        "42",
        "a@1 ",
    ] {
        let id = queue.schedule(Task::new("p").id(allowed)).await.unwrap();
        assert_eq!(id.as_str(), allowed);
        assert!(!TaskId::from(allowed).is_occurrence());
    }
    assert_eq!(queue.len().await.unwrap(), 6);
}

/// Schedule `tick` every 300 ms; read one occurrence, then try to take the id of the next
/// one: refused, and the next occurrence is made and delivered with the schedule's payload.
async fn a_user_task_cannot_stand_in_for_an_occurrence(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    queue
        .schedule_recurring(
            Recurring::every(ms(300))
                .id("tick")
                .payload(b"beat".to_vec()),
        )
        .await
        .unwrap();
    let mut deliveries = queue.deliveries();
    let first = tokio::time::timeout(Duration::from_secs(5), deliveries.next())
        .await
        .unwrap()
        .unwrap();
    let at: u64 = first.id().as_str()["tick@".len()..].parse().unwrap();
    first.ack().await.unwrap();
    let next_id = format!("tick@{}", at + 300);
    let impostor = queue
        .schedule(
            Task::new(b"impostor".to_vec())
                .id(next_id.as_str())
                .at(SystemTime::now() + Duration::from_secs(3600)),
        )
        .await;
    assert!(
        matches!(impostor, Err(Error::Invalid(_))),
        "the next occurrence's id was taken: {impostor:?}"
    );
    let next = tokio::time::timeout(Duration::from_secs(5), deliveries.next())
        .await
        .expect("the next occurrence is made")
        .unwrap();
    assert_eq!(next.id().as_str(), next_id);
    assert_eq!(next.payload(), b"beat");
    assert_eq!(next.due(), UNIX_EPOCH + ms(at + 300));
    next.ack().await.unwrap();
}
