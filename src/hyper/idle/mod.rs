//! [`IdleIo`]: closes a connection once no byte has moved for a while and no request is in
//! progress — the idle timeout hyper lacks (hyper issue #1628).

mod state;
mod sweep;

use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use self::state::{CLOSED, FILED, Idle, IdleClock, Parking, QUIET, SHUT};
use self::sweep::Filing;
pub(crate) use self::sweep::Group;
use crate::Wheel;

pin_project! {
    /// An IO (a `TcpStream`, a TLS stream, anything `AsyncRead + AsyncWrite`) that ends itself
    /// once no byte has moved in either direction for its idle timeout **and** no request is in
    /// progress.
    ///
    /// hyper closes a keep-alive connection only when the client does; wrap the stream before
    /// handing it to hyper (through hyper-util's `TokioIo`) and it is closed for you. The
    /// wrapper works at the byte level, so HTTP/1 and HTTP/2 alike.
    ///
    /// - **What counts as traffic:** a read that returns bytes, a write that accepts bytes,
    ///   [`IdleHandle::touch`], and the drop of the last [`Busy`] guard (the countdown restarts
    ///   then). While a guard from [`IdleHandle::busy`] lives, the connection is never closed
    ///   for idleness: hold one in a handler that takes longer than the timeout.
    /// - **Never early:** the connection is closed only after `timeout` of silence with no
    ///   guard alive. It is closed within `timeout` plus one wheel tick plus scheduling latency
    ///   — provided the connection's task polls the IO, as hyper does while it waits for a
    ///   request (HTTP/1) or always (HTTP/2).
    /// - **Nothing held back is cut:** once the connection may close, it closes on the next
    ///   poll of the IO that moves no byte (the IO wakes its task for it). So what the
    ///   connection's task still holds to send goes out first — an HTTP/2 connection buffers
    ///   the last frames of a response whose body has ended — and bytes it reads ahead are
    ///   served.
    /// - **How it ends:** the pending read answers an [`io::Error`] of kind
    ///   [`TimedOut`](io::ErrorKind::TimedOut); so does a pending write or flush (a peer that
    ///   stopped reading is idle too — unless a request is in progress: with
    ///   [`BusyLayer`](crate::tower::BusyLayer), a response holds the connection until a
    ///   flush after its last frame completes, so until the peer has taken it). From then on every read and write answers `TimedOut`
    ///   without touching the inner IO; `poll_shutdown` (and `poll_flush`) still reach it, so
    ///   it can be shut down cleanly. hyper then drops the connection.
    /// - **Errors of the inner IO** pass through unchanged (and are not traffic).
    /// - **Shutdown:** after [`Wheel::shutdown`] idle connections close at once (their reads
    ///   answer `TimedOut`, "timer wheel shut down"); a busy one closes as soon as its last
    ///   guard drops, its last bytes are out, and it would wait. An `IdleIo` made on a wheel that is already shut down
    ///   is closed from the start: its first read or write answers `TimedOut` at once.
    /// - **With hyper's header-read timeout:** hyper also runs `header_read_timeout` (30 s by
    ///   default once a timer is set) while an HTTP/1 keep-alive connection waits for its next
    ///   request; keep it longer than the idle timeout, or it closes idle connections first.
    /// - **Edge timeouts:** `Duration::ZERO` closes the connection the first time it would
    ///   wait with no request in progress and nothing moving — like nginx's
    ///   `keepalive_timeout 0`, it ends keep-alive: a request already sent is served first. `Duration::MAX` (or any timeout past the
    ///   clock's range) never closes it for idleness: no overflow, no panic; only a wheel
    ///   shutdown closes it.
    ///
    /// ```
    /// use std::io::ErrorKind;
    /// use std::time::Duration;
    ///
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    /// use tokio::time::Instant;
    /// use tokio_wheel::Wheel;
    /// use tokio_wheel::hyper::IdleIo;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let wheel = Wheel::new();
    /// let (server_side, mut client) = tokio::io::duplex(64);
    /// let mut io = IdleIo::new(server_side, &wheel, Duration::from_secs(5));
    ///
    /// let start = Instant::now();
    /// client.write_all(b"ping").await.unwrap();
    /// let mut buf = [0; 4];
    /// io.read_exact(&mut buf).await.unwrap(); // traffic: the countdown starts again
    ///
    /// let err = io.read(&mut buf).await.unwrap_err(); // nothing more comes
    /// assert_eq!(err.kind(), ErrorKind::TimedOut);
    /// assert!(start.elapsed() >= Duration::from_secs(5));
    /// # }
    /// ```
    ///
    /// # Cost
    ///
    /// Each read or write that moves bytes reads the clock and does one atomic `fetch_max`;
    /// a read or write that would wait registers its waker and looks at one word.
    ///
    /// No wheel timer per connection: the idle connections of a wheel (whatever their
    /// timeouts) are filed by the tick their idle deadline rounds up to (or, while that is far
    /// off, under a coarser tick before it), and one task per wheel sleeps on one wheel timer
    /// until the first filed deadline. There it looks at each connection's own last
    /// traffic: traffic since → filed again for its new deadline, with no wake-up (a busy connection costs one
    /// look per timeout period, never anything per request); a request in progress → set
    /// aside until the last guard drops; idle → its IO is woken, reads the clock itself and
    /// closes. So a connection is filed when its IO first waits, and a dropped one is
    /// forgotten at once (its entry is swept out in bulk, amortised).
    ///
    /// Memory: 72 bytes shared by the IO and its handles, 16 in the `IdleIo` itself and a
    /// pointer in a bucket — measured, an idle connection costs 80–83 heap bytes more than one
    /// without an idle timeout, against 112 for a boxed tokio `Sleep` per connection
    /// (BENCHMARKS.md). Closing 10^5 connections due in the same second costs 0.6–0.8×
    /// tokio's CPU, and they close 2–5× more punctually.
    pub struct IdleIo<T> {
        #[pin]
        io: T,
        watch: Watch,
    }
}

/// A handle to an [`IdleIo`]'s idle countdown, for the services serving that connection:
/// mark a request in progress ([`busy`](IdleHandle::busy)) or count something as traffic
/// ([`touch`](IdleHandle::touch)).
///
/// `Clone + Send + Sync`; cloning is an `Arc` clone.
///
/// ```
/// use std::time::Duration;
///
/// use tokio_wheel::Wheel;
/// use tokio_wheel::hyper::IdleIo;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let wheel = Wheel::new();
/// let (stream, _peer) = tokio::io::duplex(64);
/// let io = IdleIo::new(stream, &wheel, Duration::from_secs(60));
/// let idle = io.handle();
///
/// // In a handler: the connection stays open however long this takes.
/// let busy = idle.busy();
/// wheel.sleep(Duration::from_secs(120)).await;
/// drop(busy); // the 60 s countdown starts now
/// # }
/// ```
#[derive(Clone)]
pub struct IdleHandle {
    idle: Arc<Idle>,
    /// A copy, not the wheel's group: a service cloned per request (as hyper-util's
    /// `TowerToHyperService` does under `axum::serve`) touches no count every connection
    /// shares.
    clock: IdleClock,
}

/// A request in progress on an [`IdleIo`]'s connection: while any `Busy` lives, the
/// connection is not closed for idleness. Made by [`IdleHandle::busy`]; the countdown
/// restarts when the last one drops.
///
/// ```
/// use std::io::ErrorKind;
/// use std::time::Duration;
///
/// use tokio::io::AsyncReadExt;
/// use tokio::time::Instant;
/// use tokio_wheel::Wheel;
/// use tokio_wheel::hyper::IdleIo;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let wheel = Wheel::new();
/// let (stream, _peer) = tokio::io::duplex(64);
/// let mut io = IdleIo::new(stream, &wheel, Duration::from_secs(1));
/// let busy = io.handle().busy();
/// let released = Instant::now() + Duration::from_secs(10);
/// tokio::spawn(async move {
///     tokio::time::sleep_until(released).await;
///     drop(busy);
/// });
/// let error = io.read(&mut [0; 8]).await.unwrap_err();
/// assert_eq!(error.kind(), ErrorKind::TimedOut);
/// assert!(Instant::now() >= released + Duration::from_secs(1));
/// # }
/// ```
#[must_use = "the connection counts as busy only while the guard lives"]
pub struct Busy {
    idle: Arc<Idle>,
    clock: IdleClock,
    /// Released at the IO's next completed flush rather than at once.
    until_flushed: bool,
}

/// Why an `IdleIo` closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closed {
    Idle,
    Shutdown,
}

impl Closed {
    fn error(self) -> io::Error {
        let message = match self {
            Closed::Idle => "connection closed: idle for longer than its idle timeout",
            Closed::Shutdown => "connection closed: the timer wheel shut down",
        };
        io::Error::new(io::ErrorKind::TimedOut, message)
    }

    fn of(status: u32) -> Option<Closed> {
        match (status & CLOSED != 0, status & SHUT != 0) {
            (false, _) => None,
            (true, false) => Some(Closed::Idle),
            (true, true) => Some(Closed::Shutdown),
        }
    }
}

/// The non-IO half of an `IdleIo`: its block, its group, and the decision to close.
struct Watch {
    idle: Arc<Idle>,
    group: Arc<Group>,
}

impl Watch {
    /// The error every read and write answers once closed.
    fn closed_error(&self) -> Option<io::Error> {
        Closed::of(self.idle.status()).map(Closed::error)
    }

    /// Called when the inner IO would wait (its waker is registered): ready with the error to
    /// answer if the connection is to close now, else pending — filed with the sweeper, or,
    /// while busy, with the last guard's drop set to wake it.
    fn poll_idle(&mut self) -> Poll<io::Error> {
        let idle = &self.idle;
        let why = loop {
            let status = idle.status();
            if status & FILED != 0 {
                // The sweeper has it, and wakes the IO if it finds it idle.
                return Poll::Pending;
            }
            match idle.park_if_busy(status) {
                Parking::Parked => return Poll::Pending,
                Parking::Raced => continue,
                Parking::Free => {}
            }
            if self.group.wheel().is_shutdown() {
                break Closed::Shutdown;
            }
            let now = self.group.clock().now();
            // Read after the status (acquire): a guard's last touch is visible.
            let deadline = idle.deadline();
            if deadline <= now {
                break Closed::Idle;
            }
            match self.group.file(idle, status, deadline, now) {
                Filing::Filed => return Poll::Pending,
                Filing::Raced => continue,
                Filing::Stopped => break Closed::Shutdown,
            }
        };
        // Close only after one more poll of the connection that moved no byte: what it still
        // holds to send goes out first (an HTTP/2 connection buffers the last frames of a
        // response its body has finished; hyper reads ahead before it calls the service, so
        // a zero timeout would otherwise close before the first request is served).
        if idle.set(QUIET) & QUIET == 0 {
            idle.wake();
            return Poll::Pending;
        }
        Poll::Ready(self.close(why))
    }

    /// A read or write moved bytes: traffic.
    fn moved(&mut self) {
        self.idle.moved(self.group.clock().now());
    }

    /// A flush completed: guards waiting for one go (see [`Busy::release_after_flush`]).
    fn flushed(&mut self) {
        if self.idle.flushed(|| self.group.clock().now()) {
            self.idle.wake();
        }
    }

    fn close(&mut self, why: Closed) -> io::Error {
        let shut = if why == Closed::Shutdown { SHUT } else { 0 };
        self.idle.set(CLOSED | shut);
        // A read or write waiting in another task (a split IO) learns at once.
        self.idle.wake();
        why.error()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.group.forget(&self.idle);
    }
}

impl<T> IdleIo<T> {
    /// Wraps `io`, closing it after `timeout` without traffic and with no request in
    /// progress (see [`IdleIo`] for the rules, including a zero or `Duration::MAX` timeout
    /// and a wheel already shut down).
    ///
    /// The countdown starts now: a connection that never sends a byte is closed `timeout`
    /// after this call (once it is read from).
    pub fn new(io: T, wheel: &Wheel, timeout: Duration) -> IdleIo<T> {
        IdleIo::in_group(io, Group::of(wheel), timeout)
    }

    /// [`new`](Self::new) with the wheel's group found: what a listener does for each
    /// connection.
    pub(crate) fn in_group(io: T, group: Arc<Group>, timeout: Duration) -> IdleIo<T> {
        let closed = if group.wheel().is_shutdown() {
            CLOSED | SHUT
        } else {
            0
        };
        group.join();
        IdleIo {
            io,
            watch: Watch {
                idle: Arc::new(Idle::new(group.clock().now(), closed, timeout)),
                group,
            },
        }
    }

    /// A handle for the services on this connection: [`IdleHandle::busy`],
    /// [`IdleHandle::touch`].
    pub fn handle(&self) -> IdleHandle {
        IdleHandle {
            idle: self.watch.idle.clone(),
            clock: self.watch.group.clock(),
        }
    }

    /// The idle timeout.
    pub fn timeout(&self) -> Duration {
        self.watch.idle.timeout()
    }

    /// Whether the connection was closed (idle, or the wheel shut down): every read and write
    /// now answers `TimedOut`.
    pub fn is_closed(&self) -> bool {
        self.watch.idle.status() & CLOSED != 0
    }

    /// The inner IO.
    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// The inner IO, mutably. Bytes moved through it directly are not traffic.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.io
    }

    /// The inner IO, pinned.
    pub fn get_pin_mut(self: Pin<&mut Self>) -> Pin<&mut T> {
        self.project().io
    }

    /// The inner IO, leaving the idle countdown (and its group) behind.
    pub fn into_inner(self) -> T {
        self.io
    }
}

impl<T: AsyncRead> AsyncRead for IdleIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        if let Some(error) = this.watch.closed_error() {
            return Poll::Ready(Err(error));
        }
        let before = buf.filled().len();
        match this.io.poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.watch.moved();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => {
                this.watch.idle.register_read(cx.waker());
                this.watch.poll_idle().map(Err)
            }
        }
    }
}

impl<T: AsyncWrite> IdleIo<T> {
    /// The write side's common path: `write` is the inner call.
    fn poll_write_with(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        write: impl FnOnce(Pin<&mut T>, &mut Context<'_>) -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        if let Some(error) = this.watch.closed_error() {
            return Poll::Ready(Err(error));
        }
        match write(this.io, cx) {
            Poll::Ready(Ok(written)) => {
                if written > 0 {
                    this.watch.moved();
                }
                Poll::Ready(Ok(written))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => {
                this.watch.idle.register_write(cx.waker());
                this.watch.poll_idle().map(Err)
            }
        }
    }
}

impl<T: AsyncWrite> AsyncWrite for IdleIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_with(cx, |io, cx| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_with(cx, |io, cx| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        match this.io.poll_flush(cx) {
            Poll::Pending if this.watch.closed_error().is_none() => {
                this.watch.idle.register_write(cx.waker());
                this.watch.poll_idle().map(Err)
            }
            Poll::Ready(Ok(())) => {
                // What was handed over before this flush is written: responses that ended
                // before it let go of the connection now.
                this.watch.flushed();
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}

impl IdleHandle {
    /// Marks a request in progress: until the returned guard (and every other) drops, the
    /// connection is not closed for idleness. The countdown restarts when the last guard
    /// drops. Costs one atomic increment (and, at drop, a clock read and two atomics).
    ///
    /// # Panics
    ///
    /// With 2^26 − 1 guards of one connection alive already.
    pub fn busy(&self) -> Busy {
        self.idle.acquire();
        Busy {
            idle: self.idle.clone(),
            clock: self.clock,
            until_flushed: false,
        }
    }

    /// Counts as traffic now: the countdown restarts (a clock read and one atomic).
    pub fn touch(&self) {
        self.idle.touch(self.clock.now());
    }

    /// The idle timeout.
    pub fn timeout(&self) -> Duration {
        self.idle.timeout()
    }

    /// Whether the [`IdleIo`] closed its connection (idle, or the wheel shut down) — as
    /// opposed to the connection ending any other way. hyper reports a keep-alive connection
    /// that ends between requests as a clean end (`Ok`), whatever the IO said; this tells.
    pub fn is_closed(&self) -> bool {
        self.idle.status() & CLOSED != 0
    }

    /// How many [`Busy`] guards are alive now: requests in progress on the connection.
    pub fn busy_count(&self) -> usize {
        self.idle.busy_count()
    }
}

impl Busy {
    /// When this guard drops, it lets go of the connection only at the IO's next completed
    /// flush, not at once: for a response its connection has been handed in full but may not
    /// have written yet (a peer reading slowly).
    #[cfg(feature = "tower")]
    pub(crate) fn release_after_flush(&mut self) {
        self.until_flushed = true;
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if self.until_flushed {
            self.idle.hold_until_flushed();
            return;
        }
        if self.idle.release(self.clock.now()) {
            // The IO found the connection busy and parked on it: it looks again, and decides.
            self.idle.wake();
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for IdleIo<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdleIo")
            .field("io", &self.io)
            .field("timeout", &self.watch.idle.timeout())
            .field("busy", &self.watch.idle.busy_count())
            .field("closed", &Closed::of(self.watch.idle.status()))
            .finish()
    }
}

impl fmt::Debug for IdleHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdleHandle")
            .field("timeout", &self.idle.timeout())
            .field("busy", &self.busy_count())
            .finish()
    }
}

impl fmt::Debug for Busy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Busy").finish_non_exhaustive()
    }
}
