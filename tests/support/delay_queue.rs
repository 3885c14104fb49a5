//! The `DelayQueue` side of `tests/tokio_suite_delay_queue.rs` (tokio-util's own suite,
//! ported): a keyed set dressed as a `DelayQueue`, and the macro that runs each test both by
//! key and through `KeyedTimer` handles.
#![allow(dead_code, unused_macros)]

use std::collections::HashMap;

use tokio::time::{Duration, Instant};
use tokio_wheel::{Expirations, KeyedTimer, Timers, Wheel};

use crate::mock_task as task;

/// How the port names an entry: by key (`Timers::set_at`, `reset_at(&key)`, `take(&key)`), or
/// through the [`KeyedTimer`] handle `Timers::insert_at` returns (`handle.reset_at`,
/// `handle.take()`). Every test runs both ways: `name` by key, `name::via_handles` through
/// handles, with the same body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    ByKey,
    Handles,
}

/// Each upstream test, once by key and once through handles (`name::via_handles`).
macro_rules! both {
    ($(#[$attr:meta])* async fn $name:ident($mode:ident) $body:block) => {
        $(#[$attr])*
        async fn $name() {
            let $mode = Mode::ByKey;
            $body
        }

        mod $name {
            use super::*;

            $(#[$attr])*
            async fn via_handles() {
                let $mode = Mode::Handles;
                $body
            }
        }
    };
}

/// The insert side of a `DelayQueue`: a fresh key per insert, as `DelayQueue`'s `Key`s.
pub struct Queue<V> {
    pub timers: Timers<u32, V>,
    next: u32,
    mode: Mode,
    handles: HashMap<u32, KeyedTimer<u32, V>>,
}

impl<V: Send + 'static> Queue<V> {
    pub fn insert_at(&mut self, value: V, deadline: Instant) -> u32 {
        self.next += 1;
        match self.mode {
            Mode::ByKey => self.timers.set_at(self.next, value, deadline),
            Mode::Handles => {
                let handle = self.timers.insert_at(self.next, value, deadline);
                self.handles.insert(self.next, handle);
            }
        }
        self.next
    }

    pub fn insert(&mut self, value: V, after: Duration) -> u32 {
        self.insert_at(value, Instant::now() + after)
    }

    pub fn reset_at(&self, key: &u32, deadline: Instant) {
        match self.mode {
            Mode::ByKey => self.timers.reset_at(key, deadline),
            Mode::Handles => self.handles[key].reset_at(deadline),
        }
    }

    pub async fn take(&self, key: &u32) -> Option<V> {
        match self.mode {
            Mode::ByKey => self.timers.take(key).await,
            Mode::Handles => self.handles[key].take().await,
        }
    }

    pub async fn remove(&self, key: &u32) -> V {
        self.take(key).await.expect("the key is set")
    }

    pub async fn len(&self) -> usize {
        self.timers.len().await
    }

    pub async fn clear(&self) {
        self.timers.drain().await;
    }
}

/// A wheel's keyed set as a `DelayQueue`: the insert side and the polled stream.
pub fn delay_queue<V: Send + 'static>(mode: Mode) -> (Queue<V>, task::Spawn<Expirations<u32, V>>) {
    let (timers, expired) = Wheel::new().keyed();
    let queue = Queue {
        timers,
        next: 0,
        mode,
        handles: HashMap::new(),
    };
    (queue, task::spawn(expired))
}

/// Adapted end of stream: `DelayQueue::poll_expired` answers `Ready(None)` whenever the queue
/// is empty, and the queue stays usable. Ours is a stream that ends once every `Timers` clone
/// is dropped and nothing is pending (API.md §3), so upstream's `assert!(entry.is_none())`
/// becomes: nothing more is buffered (`Pending`), then, once the `Timers` are dropped and the
/// set's actor has had its turn (one yield), the stream wakes its task and ends.
pub async fn assert_ends<V: std::fmt::Debug>(
    queue: Queue<V>,
    expired: &mut task::Spawn<Expirations<u32, V>>,
) {
    assert_pending!(expired.poll_next());
    drop(queue);
    tokio::task::yield_now().await;
    assert!(expired.is_woken());
    let entry = assert_ready!(expired.poll_next());
    assert!(entry.is_none());
}

/// `poll_expired` → the stream's `poll_next`, on the mock task.
macro_rules! poll {
    ($queue:ident) => {
        $queue.poll_next()
    };
}

/// A ready `Some`, unwrapped (upstream's helper of the same name).
macro_rules! assert_ready_some {
    ($e:expr) => {{
        match assert_ready!($e) {
            Some(v) => v,
            None => panic!("None"),
        }
    }};
}

/// Milliseconds, as upstream writes its durations.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
