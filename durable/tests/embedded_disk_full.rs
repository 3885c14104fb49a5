//! The embedded store after its file could not be written (a full disk): the same handle
//! works again once writing works again (issue 29: every call used to answer redb's "Previous
//! I/O error occurred. Please close and re-open the database", for good).
//!
//! The full disk is made for real, for this process only: `RLIMIT_FSIZE` caps how large a
//! file it may write (with `SIGXFSZ` ignored, a write past it fails with `EFBIG`), then the
//! cap is lifted. A file of its own: the limit is the whole process's.
#![cfg(unix)]

use std::time::Duration;

use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel_durable::{DurableQueue, Error, Task};

fn set_file_size_limit(bytes: Option<u64>) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct given; signal sets a
    // disposition for SIGXFSZ (ignored, so a write past the limit fails instead of killing us).
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit), 0);
        limit.rlim_cur = bytes.map_or(limit.rlim_max, |bytes| bytes as libc::rlim_t);
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limit), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_handle_works_again_once_the_file_can_be_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.redb");
    let wheel = Wheel::new();
    let queue = DurableQueue::open(&path, &wheel).await.unwrap();
    queue
        .schedule(Task::new("before").id("before"))
        .await
        .unwrap();

    // The disk fills up: writes past the file's size now fail.
    let size = std::fs::metadata(&path).unwrap().len();
    set_file_size_limit(Some(size));
    let payload = vec![b'x'; 256 * 1024];
    let mut failed = None;
    for i in 0..64 {
        let scheduled = queue
            .schedule(Task::new(payload.clone()).id(format!("big-{i}")))
            .await;
        if let Err(error) = scheduled {
            failed = Some((i, error));
            break;
        }
    }
    let (first_failed, error) = failed.expect("a write past the limit fails");
    assert!(matches!(error, Error::Io(_)), "{error:?}");
    assert!(error.is_transient(), "a full disk is transient: {error:?}");

    // Space again: the same handle schedules, and nothing stored before is lost.
    set_file_size_limit(None);
    queue
        .schedule(Task::new("after").id("after"))
        .await
        .expect("the same handle works once the file can be written");
    let expected = 2 + first_failed;
    assert_eq!(queue.len().await.unwrap(), expected);
    let mut deliveries = queue.deliveries();
    let mut ids = Vec::new();
    for _ in 0..expected {
        let delivery = tokio::time::timeout(Duration::from_secs(10), deliveries.next())
            .await
            .expect("every stored task is delivered")
            .unwrap();
        ids.push(delivery.id().to_string());
        delivery.ack().await.unwrap();
    }
    assert!(ids.contains(&"before".to_owned()) && ids.contains(&"after".to_owned()));
    assert_eq!(queue.len().await.unwrap(), 0);
}
