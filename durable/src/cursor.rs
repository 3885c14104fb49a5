//! Paging by position: a [`Cursor`] names a place in a list's order, not a task, and a
//! [`Page`] is one stretch of the list with the cursor of the next.
//!
//! [`DurableQueue::list`](crate::DurableQueue::list) continues after a task *where it is
//! now*: if that task moved (rescheduled, acked, replaced) the next page jumps with it, or
//! fails. A cursor from [`DurableQueue::list_page`](crate::DurableQueue::list_page) keeps the
//! position itself — pending tasks are ordered by (due time, schedule sequence), tasks in
//! flight by (lease end, id), dead letters by (time of death, sequence or id) — so whatever
//! happens to the task it was taken from, the next page starts right after that position:
//! no task that stayed in place is skipped or listed twice.

use std::fmt;
use std::str::FromStr;

use crate::{Error, RecurringInfo, TaskFilter, TaskInfo};

/// A position in one of a queue's lists, from [`Page::next`]: where the next page starts.
///
/// Opaque, but printable and parseable, so a command line can show it and take it back:
///
/// ```
/// use tokio_wheel_durable::Cursor;
///
/// # fn print_and_read_back(cursor: &Cursor) -> Result<(), tokio_wheel_durable::Error> {
/// let shown = cursor.to_string();             // e.g. "p.1767225600000.42.6f726465722d3432"
/// let back: Cursor = shown.parse()?;
/// assert_eq!(&back, cursor);
/// # Ok(())
/// # }
/// assert!("not a cursor".parse::<Cursor>().is_err()); // Error::Invalid
/// ```
///
/// A cursor belongs to the list it came from (pending, in flight or dead): giving it to
/// another is [`Error::Invalid`]. It is a position in an order, not a reference to a task:
/// it never goes stale, and on another queue it simply means "after that place".
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cursor {
    pub(crate) filter: TaskFilter,
    /// The ordering time: due (pending), lease end (in flight), time of death (dead), in ms.
    pub(crate) first: u64,
    /// The tie-breaking sequence (pending; dead on the embedded store), else 0.
    pub(crate) seq: u64,
    /// The id of the task the position was taken from: breaks the remaining ties, and on
    /// Redis names the partition.
    pub(crate) id: String,
}

impl Cursor {
    fn kind(filter: TaskFilter) -> char {
        match filter {
            TaskFilter::Pending => 'p',
            TaskFilter::InFlight => 'i',
            TaskFilter::Dead => 'd',
        }
    }

    /// The cursor, checked to belong to the list `filter` pages.
    pub(crate) fn for_list(&self, filter: TaskFilter) -> Result<&Cursor, Error> {
        if self.filter != filter {
            return Err(Error::Invalid(format!(
                "a cursor of the {} list cannot page the {} list",
                self.filter.name(),
                filter.name()
            )));
        }
        Ok(self)
    }
}

impl fmt::Display for Cursor {
    /// `{p|i|d}.{time}.{sequence}.{id in hex}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{}.{}.",
            Cursor::kind(self.filter),
            self.first,
            self.seq
        )?;
        for byte in self.id.bytes() {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl FromStr for Cursor {
    type Err = Error;

    /// Reads back what [`Display`](fmt::Display) wrote.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for anything else.
    fn from_str(text: &str) -> Result<Cursor, Error> {
        let malformed = || Error::Invalid(format!("{text:?} is not a list cursor"));
        let mut fields = text.splitn(4, '.');
        let filter = match fields.next() {
            Some("p") => TaskFilter::Pending,
            Some("i") => TaskFilter::InFlight,
            Some("d") => TaskFilter::Dead,
            _ => return Err(malformed()),
        };
        let mut number = || -> Result<u64, Error> {
            let field = fields.next().ok_or_else(malformed)?;
            // Digits only: no sign, no spaces, no leading zeros (one way to write each).
            if field.is_empty() || (field.len() > 1 && field.starts_with('0')) {
                return Err(malformed());
            }
            if !field.bytes().all(|b| b.is_ascii_digit()) {
                return Err(malformed());
            }
            field.parse().map_err(|_| malformed())
        };
        let first = number()?;
        let seq = number()?;
        let hex = fields.next().ok_or_else(malformed)?;
        if hex.len() % 2 != 0 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(malformed());
        }
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|_| malformed()))
            .collect::<Result<Vec<u8>, Error>>()?;
        let id = String::from_utf8(bytes).map_err(|_| malformed())?;
        Ok(Cursor {
            filter,
            first,
            seq,
            id,
        })
    }
}

/// One page of a list, from [`DurableQueue::list_page`](crate::DurableQueue::list_page).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Page {
    /// The tasks, in the list's order.
    pub items: Vec<TaskInfo>,
    /// Where the next page starts; `None` at the end of the list (this page was not full).
    pub next: Option<Cursor>,
}

/// One page of recurring schedules, from
/// [`DurableQueue::recurring_page`](crate::DurableQueue::recurring_page).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecurringPage {
    /// The schedules, in the order of the store's pending list (next due time).
    pub items: Vec<RecurringInfo>,
    /// Where the next page starts; `None` once the whole list was looked through. A page
    /// may hold fewer schedules than asked for (even none) and still have a `next`: each
    /// call looks through a bounded stretch of the pending list.
    pub next: Option<Cursor>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_print_and_parse_back() {
        for (filter, first, seq, id) in [
            (TaskFilter::Pending, 1_767_225_600_000, 42, "order-42"),
            (TaskFilter::InFlight, u64::MAX, 0, "ünï cödé ids.with.dots"),
            (TaskFilter::Dead, 0, 0, ""),
        ] {
            let cursor = Cursor {
                filter,
                first,
                seq,
                id: id.to_owned(),
            };
            let text = cursor.to_string();
            assert!(text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'));
            assert_eq!(text.parse::<Cursor>().unwrap(), cursor, "{text}");
        }
    }

    #[test]
    fn malformed_cursors_are_invalid() {
        for text in [
            "",
            "p",
            "p.1.2",
            "x.1.2.61",
            "p.-1.2.61",
            "p.01.2.61",
            "p.1.2.6",
            "p.1.2.6G",
            "p.1.2.6A",
            "p.1.2.ff",
            "p.99999999999999999999.2.61",
            "p. 1.2.61",
        ] {
            assert!(
                matches!(text.parse::<Cursor>(), Err(Error::Invalid(_))),
                "{text:?}"
            );
        }
    }
}
