//! What can go wrong with a durable queue.

use std::fmt;

/// An error from a [`DurableQueue`](super::DurableQueue) or a [`Delivery`](super::Delivery).
///
/// Never a panic: every failure of the store, the lock or a lease comes back as one of these.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The store's file cannot be read as a task store; it was not modified.
    Corrupt(String),
    /// Another handle holds the store (in this process or another); close it first.
    Locked,
    /// The store's server cannot be reached.
    Unreachable(String),
    /// Reading or writing the store failed.
    Io(String),
    /// The queue was closed, or its wheel shut down.
    Closed,
    /// The delivery's lease ran out and the task was handed out again (or moved on); this
    /// delivery can no longer ack, retry or fail it.
    LeaseLost,
    /// The id is being delivered right now; it cannot be replaced until acked or retried.
    InFlight,
    /// A setting or argument is out of range; the message says which and why.
    Invalid(String),
    /// The server refused this client (wrong user or password, missing permission), or the
    /// client refused the server (an untrusted or mismatched TLS certificate). Final: retrying
    /// will not help. The message never contains the credentials.
    Denied(String),
    /// The queue named does not exist on the server: a handle opened
    /// with `Builder::read_only` (feature `redis`) found none of its keys (a misspelt name?).
    NoQueue(String),
}

impl Error {
    /// Whether another handle holds the store.
    pub fn is_locked(&self) -> bool {
        matches!(self, Error::Locked)
    }

    /// Whether the store could not be reached or written: trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Unreachable(_) | Error::Io(_))
    }

    /// Whether the server refused the credentials, or the client the server's certificate.
    pub fn is_denied(&self) -> bool {
        matches!(self, Error::Denied(_))
    }

    /// Whether this delivery lost its lease.
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Corrupt(why) => {
                write!(f, "the task store cannot be read (left untouched): {why}")
            }
            Error::Locked => f.write_str("the task store is open in another handle or process"),
            Error::Unreachable(why) => write!(f, "the task store cannot be reached: {why}"),
            Error::Io(why) => write!(f, "task store I/O failed: {why}"),
            Error::Closed => f.write_str("the durable queue is closed"),
            Error::LeaseLost => {
                f.write_str("the delivery's lease expired and the task was handed out again")
            }
            Error::InFlight => f.write_str("the task is being delivered and cannot be replaced"),
            Error::Invalid(why) => write!(f, "invalid durable queue setting: {why}"),
            Error::Denied(why) => write!(f, "the task store refused the connection: {why}"),
            Error::NoQueue(name) => write!(f, "no queue {name} on this server"),
        }
    }
}

impl std::error::Error for Error {}
