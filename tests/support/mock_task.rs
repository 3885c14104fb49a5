//! A stand-in for `tokio_test::task` (not a dependency here), for the ported tokio suites:
//! a future or stream polled by hand with a waker that records whether it was woken.
#![allow(dead_code, unused_macros)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures::Stream;

/// The waker of a [`Spawn`]: a flag set on wake, cleared before each poll.
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A future or stream under test, as `tokio_test::task::Spawn`.
pub struct Spawn<T> {
    inner: Pin<Box<T>>,
    flag: Arc<Flag>,
    waker: Waker,
}

/// Wraps `inner` for polling by hand, as `tokio_test::task::spawn`.
pub fn spawn<T>(inner: T) -> Spawn<T> {
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(flag.clone());
    Spawn {
        inner: Box::pin(inner),
        flag,
        waker,
    }
}

impl<T> Spawn<T> {
    /// Whether the waker was woken since the last poll.
    pub fn is_woken(&self) -> bool {
        self.flag.0.load(Ordering::SeqCst)
    }

    /// Calls `f` with a context of this task's waker, clearing the woken flag first.
    pub fn enter<F, R>(&mut self, f: F) -> R
    where
        F: FnOnce(&mut Context<'_>, Pin<&mut T>) -> R,
    {
        self.flag.0.store(false, Ordering::SeqCst);
        let mut cx = Context::from_waker(&self.waker);
        f(&mut cx, self.inner.as_mut())
    }
}

impl<T: Unpin> Spawn<T> {
    /// The wrapped value.
    pub fn into_inner(self) -> T {
        *Pin::into_inner(self.inner)
    }
}

impl<T: Future> Spawn<T> {
    /// Polls the future once.
    pub fn poll(&mut self) -> Poll<T::Output> {
        self.enter(|cx, future| future.poll(cx))
    }
}

impl<T: Stream> Spawn<T> {
    /// Polls the stream once.
    pub fn poll_next(&mut self) -> Poll<Option<T::Item>> {
        self.enter(|cx, stream| stream.poll_next(cx))
    }
}

impl<T: Unpin> std::ops::Deref for Spawn<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T: Unpin> std::ops::DerefMut for Spawn<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

/// `tokio_test::assert_ready!`: the value of a `Poll::Ready`, or a panic.
macro_rules! assert_ready {
    ($e:expr) => {
        match $e {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => panic!("pending"),
        }
    };
}

/// `tokio_test::assert_pending!`.
macro_rules! assert_pending {
    ($e:expr) => {
        match $e {
            std::task::Poll::Pending => {}
            std::task::Poll::Ready(v) => panic!("ready; value = {:?}", v),
        }
    };
}

/// `tokio_test::assert_elapsed!`: at least `$dur` and less than `$dur` + 1 ms since `$now`.
macro_rules! assert_elapsed {
    ($now:expr, $dur:expr) => {{
        let elapsed = $now.elapsed();
        let lower: std::time::Duration = $dur;
        assert!(
            elapsed >= lower && elapsed <= lower + std::time::Duration::from_millis(1),
            "actual = {:?}, expected = {:?}",
            elapsed,
            lower
        );
    }};
}
