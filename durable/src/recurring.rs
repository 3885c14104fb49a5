//! Recurring tasks: a cron expression or a fixed period, kept in the store, each occurrence
//! delivered once as an ordinary [`Delivery`](super::Delivery).
//!
//! A recurring schedule is one entry in the store, pending at its next occurrence. When it
//! comes due, whoever claims it — under the same lease rules as any task, so one worker at a
//! time — creates the occurrences that are owed as ordinary tasks with the ids
//! `"{id}@{occurrence in ms since the Unix epoch}"` and moves the schedule on to its next
//! occurrence, in one atomic step. An occurrence is owed once: the schedule remembers up to
//! when it has made them, so a worker that dies mid-way, a second worker, or a restart never
//! makes one twice. That form — an id ending in `@` and digits — is reserved for them:
//! [`DurableQueue::schedule`](super::DurableQueue::schedule) and `schedule_recurring` refuse
//! it ([`Error::Invalid`]; see [`TaskId::is_occurrence`]), so no task of yours can stand in
//! an occurrence's place. (A task stored under such an id before this rule — by an older
//! version — is still delivered and acked like any task; if it has an occurrence's exact
//! id, that occurrence is not made again.)
//!
//! Occurrences missed while nothing consumed the queue are collapsed into one by default
//! ([`CatchUp::Latest`]); [`CatchUp::All`] makes each of them (the latest
//! [`MAX_CATCH_UP`] at most).
//!
//! Cron expressions are parsed and evaluated by [croner](https://docs.rs/croner), in UTC,
//! with POSIX (Vixie cron) semantics and an optional leading seconds field.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use croner::Cron;
use croner::parser::{CronParser, Seconds};

use super::{Error, MAX_DUE_MS, TaskId};

/// The most missed occurrences [`CatchUp::All`] makes at once (the latest ones).
pub const MAX_CATCH_UP: usize = 1000;

/// What a recurring schedule does about occurrences that came and went while nothing
/// consumed the queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CatchUp {
    /// One delivery stands for all the missed occurrences: the latest of them (default).
    #[default]
    Latest,
    /// Each missed occurrence is delivered, oldest first: at most the latest
    /// [`MAX_CATCH_UP`].
    All,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Schedule {
    Every(Duration),
    Cron(String),
}

/// A recurring task to give to
/// [`DurableQueue::schedule_recurring`](super::DurableQueue::schedule_recurring).
///
/// ```
/// use std::time::Duration;
/// use tokio_wheel_durable::{CatchUp, Recurring};
///
/// // At second 0 of every fifth minute (six fields: seconds first).
/// let report = Recurring::cron("0 */5 * * * *")?.id("report").payload(b"weekly".to_vec());
/// // Every minute, each missed one delivered after downtime.
/// let sweep = Recurring::every(Duration::from_secs(60)).id("sweep").catch_up(CatchUp::All);
/// assert_ne!(report, sweep);
/// // Each is given to `queue.schedule_recurring(..)`. A bad expression is an error at once:
/// assert!(Recurring::cron("61 * * * * *").is_err());
/// # Ok::<(), tokio_wheel_durable::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recurring {
    id: Option<TaskId>,
    schedule: Schedule,
    payload: Vec<u8>,
    catch_up: CatchUp,
}

fn parse_cron(expression: &str) -> Result<Cron, Error> {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(expression)
        .map_err(|e| Error::Invalid(format!("cron expression {expression:?}: {e}")))
}

impl Recurring {
    /// Every `period`, the first one `period` after it is first scheduled. A period under
    /// 1 ms is refused by `schedule_recurring` ([`Error::Invalid`]).
    pub fn every(period: Duration) -> Recurring {
        Recurring {
            id: None,
            schedule: Schedule::Every(period),
            payload: Vec::new(),
            catch_up: CatchUp::Latest,
        }
    }

    /// At the times a cron expression names, in UTC: five fields (minute hour day-of-month
    /// month day-of-week) or six with seconds first, names (`MON`, `JAN`), ranges, steps,
    /// `L`, `#`, `W` and nicknames (`@hourly`).
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] naming the expression and what is wrong with it.
    pub fn cron(expression: &str) -> Result<Recurring, Error> {
        parse_cron(expression)?;
        Ok(Recurring {
            id: None,
            schedule: Schedule::Cron(expression.trim().to_owned()),
            payload: Vec::new(),
            catch_up: CatchUp::Latest,
        })
    }

    /// Names the schedule. Scheduling the same id again with the same definition keeps the
    /// schedule as it is (so every process may declare it at start-up); with another
    /// definition it replaces it. Without an id, the id is derived from the definition
    /// (`"every 60000ms"`, `"cron 0 */5 * * * *"`).
    pub fn id(mut self, id: impl Into<String>) -> Recurring {
        self.id = Some(TaskId::from(id.into()));
        self
    }

    /// The payload every occurrence carries (default: empty).
    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> Recurring {
        self.payload = payload.into();
        self
    }

    /// What to do about occurrences missed while nothing ran (default [`CatchUp::Latest`]).
    pub fn catch_up(mut self, catch_up: CatchUp) -> Recurring {
        self.catch_up = catch_up;
        self
    }

    fn definition(&self) -> String {
        match &self.schedule {
            Schedule::Every(period) => format!("every {}ms", super::delay_ms(*period)),
            Schedule::Cron(expression) => format!("cron {expression}"),
        }
    }

    /// The id, the schedule's stored form as of `now_ms` (nothing owed before then), and the
    /// payload.
    pub(crate) fn into_parts(self, now_ms: u64) -> Result<(TaskId, Spec, Vec<u8>), Error> {
        let id = self
            .id
            .clone()
            .unwrap_or_else(|| TaskId::from(self.definition()));
        // A schedule named like an occurrence would take that occurrence's place.
        id.check_schedulable()?;
        let kind = match &self.schedule {
            Schedule::Every(period) => {
                if *period < Duration::from_millis(1) {
                    return Err(Error::Invalid(format!(
                        "a recurring period must be at least 1 ms (got {period:?})"
                    )));
                }
                Kind::Every {
                    period_ms: super::delay_ms(*period),
                    anchor_ms: now_ms,
                }
            }
            Schedule::Cron(expression) => Kind::Cron {
                cron: Box::new(parse_cron(expression)?),
                expression: expression.clone(),
            },
        };
        let spec = Spec {
            catch_up: self.catch_up,
            last_ms: now_ms,
            kind,
        };
        Ok((id, spec, self.payload))
    }
}

#[derive(Clone)]
enum Kind {
    Every { period_ms: u64, anchor_ms: u64 },
    Cron { expression: String, cron: Box<Cron> },
}

/// A recurring schedule as the store keeps it: its definition, its catch-up, and up to when
/// its occurrences were made (`last_ms`).
#[derive(Clone)]
pub(crate) struct Spec {
    catch_up: CatchUp,
    pub(crate) last_ms: u64,
    kind: Kind,
}

impl fmt::Debug for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encode())
    }
}

impl Spec {
    /// `catch-up|last|every|period|anchor` or `catch-up|last|cron|expression`.
    pub(crate) fn encode(&self) -> String {
        let catch_up = match self.catch_up {
            CatchUp::Latest => "latest",
            CatchUp::All => "all",
        };
        match &self.kind {
            Kind::Every {
                period_ms,
                anchor_ms,
            } => format!("{catch_up}|{}|every|{period_ms}|{anchor_ms}", self.last_ms),
            Kind::Cron { expression, .. } => {
                format!("{catch_up}|{}|cron|{expression}", self.last_ms)
            }
        }
    }

    pub(crate) fn decode(text: &str) -> Result<Spec, Error> {
        let corrupt = || Error::Corrupt(format!("a recurring schedule is damaged: {text:?}"));
        let mut fields = text.splitn(4, '|');
        let catch_up = match fields.next() {
            Some("latest") => CatchUp::Latest,
            Some("all") => CatchUp::All,
            _ => return Err(corrupt()),
        };
        let last_ms = fields
            .next()
            .and_then(|f| f.parse().ok())
            .ok_or_else(corrupt)?;
        let kind = match (fields.next(), fields.next()) {
            (Some("every"), Some(rest)) => {
                let (period, anchor) = rest.split_once('|').ok_or_else(corrupt)?;
                Kind::Every {
                    period_ms: period.parse().ok().filter(|&p| p > 0).ok_or_else(corrupt)?,
                    anchor_ms: anchor.parse().map_err(|_| corrupt())?,
                }
            }
            (Some("cron"), Some(expression)) => Kind::Cron {
                cron: Box::new(parse_cron(expression).map_err(|_| corrupt())?),
                expression: expression.to_owned(),
            },
            _ => return Err(corrupt()),
        };
        Ok(Spec {
            catch_up,
            last_ms,
            kind,
        })
    }

    /// The parts of the definition a Redis script compares and stores: catch-up, kind
    /// (`every` or `cron`) and the period in ms or the expression.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn definition(&self) -> (&'static str, &'static str, String) {
        let catch_up = match self.catch_up {
            CatchUp::Latest => "latest",
            CatchUp::All => "all",
        };
        match &self.kind {
            Kind::Every { period_ms, .. } => (catch_up, "every", period_ms.to_string()),
            Kind::Cron { expression, .. } => (catch_up, "cron", expression.clone()),
        }
    }

    /// Whether `other` is the same definition (period or expression, and catch-up): if so,
    /// scheduling it again keeps this one as it is.
    pub(crate) fn same_definition(&self, other: &Spec) -> bool {
        self.catch_up == other.catch_up
            && match (&self.kind, &other.kind) {
                (Kind::Every { period_ms: a, .. }, Kind::Every { period_ms: b, .. }) => a == b,
                (Kind::Cron { expression: a, .. }, Kind::Cron { expression: b, .. }) => a == b,
                _ => false,
            }
    }

    /// Takes over what the schedule it replaces had made: nothing up to `last_ms` is owed
    /// twice.
    pub(crate) fn continue_from(&mut self, previous: &Spec) {
        self.last_ms = self.last_ms.max(previous.last_ms);
    }

    /// The first occurrence after `after_ms` (or never: [`MAX_DUE_MS`]).
    pub(crate) fn next_after(&self, after_ms: u64) -> u64 {
        match &self.kind {
            Kind::Every {
                period_ms,
                anchor_ms,
            } => {
                if after_ms < *anchor_ms {
                    return *anchor_ms;
                }
                let k = (after_ms - anchor_ms) / period_ms + 1;
                k.checked_mul(*period_ms)
                    .and_then(|offset| offset.checked_add(*anchor_ms))
                    .map_or(MAX_DUE_MS, |t| t.min(MAX_DUE_MS))
            }
            Kind::Cron { cron, .. } => to_datetime(after_ms)
                .and_then(|at| cron.find_next_occurrence(&at, false).ok())
                .map_or(MAX_DUE_MS, from_datetime),
        }
    }

    /// The latest occurrence at or before `at_ms`, if any.
    fn at_or_before(&self, at_ms: u64) -> Option<u64> {
        match &self.kind {
            Kind::Every {
                period_ms,
                anchor_ms,
            } => (at_ms >= *anchor_ms)
                .then(|| anchor_ms + (at_ms - anchor_ms) / period_ms * period_ms),
            Kind::Cron { cron, .. } => to_datetime(at_ms)
                .and_then(|at| cron.find_previous_occurrence(&at, true).ok())
                .map(from_datetime),
        }
    }

    /// At `now_ms`: the occurrences owed (after `last_ms`, at or before now, by the
    /// catch-up rule, oldest first) and the next due time; the schedule then owes nothing up
    /// to now.
    pub(crate) fn advance(&mut self, now_ms: u64) -> (Vec<u64>, u64) {
        let mut owed = Vec::new();
        let mut cursor = now_ms;
        let wanted = match self.catch_up {
            CatchUp::Latest => 1,
            CatchUp::All => MAX_CATCH_UP,
        };
        while owed.len() < wanted {
            match self.at_or_before(cursor) {
                Some(t) if t > self.last_ms => {
                    owed.push(t);
                    match t.checked_sub(1) {
                        Some(before) => cursor = before,
                        None => break,
                    }
                }
                _ => break,
            }
        }
        owed.reverse();
        self.last_ms = self.last_ms.max(now_ms);
        (owed, self.next_after(now_ms))
    }
}

impl Spec {
    /// What [`DurableQueue::recurring_page`](super::DurableQueue::recurring_page) reports of
    /// the schedule `id` with this definition and a payload of `payload_len` bytes. The next
    /// occurrence is the first one after what was made (`last_ms`): a schedule declared but
    /// not yet claimed (due at once, so a worker computes it) shows its real next time, and
    /// one whose occurrences are owed (nothing consumed) shows the oldest owed, in the past.
    pub(crate) fn info(&self, id: &str, payload_len: u64) -> RecurringInfo {
        RecurringInfo {
            id: TaskId::from(id),
            kind: match &self.kind {
                Kind::Every { period_ms, .. } => {
                    RecurringKind::Every(Duration::from_millis(*period_ms))
                }
                Kind::Cron { expression, .. } => RecurringKind::Cron(expression.clone()),
            },
            next: super::protocol::system_time(self.next_after(self.last_ms)),
            catch_up: self.catch_up,
            payload_len: usize::try_from(payload_len).unwrap_or(usize::MAX),
        }
    }
}

/// How a recurring schedule recurs, as [`RecurringInfo`] reports it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RecurringKind {
    /// Every period ([`Recurring::every`]).
    Every(Duration),
    /// At the times a cron expression names, in UTC ([`Recurring::cron`]).
    Cron(String),
}

impl fmt::Display for RecurringKind {
    /// `every 60000ms` or `cron 0 */5 * * * *` (the form of a schedule's default id).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecurringKind::Every(period) => write!(f, "every {}ms", super::delay_ms(*period)),
            RecurringKind::Cron(expression) => write!(f, "cron {expression}"),
        }
    }
}

/// One recurring schedule as the store holds it, from
/// [`DurableQueue::recurring_page`](super::DurableQueue::recurring_page).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecurringInfo {
    /// The schedule's id (its occurrences are `"{id}@{ms}"`).
    pub id: TaskId,
    /// Every period, or a cron expression.
    pub kind: RecurringKind,
    /// Its next occurrence, by the store's clock: the first after the occurrences already
    /// made. In the past when occurrences are owed (nothing consumed the queue since); the
    /// [`catch_up`](RecurringInfo::catch_up) rule then says how many are delivered.
    pub next: std::time::SystemTime,
    /// What it does about missed occurrences.
    pub catch_up: CatchUp,
    /// The length in bytes of the payload each occurrence carries.
    pub payload_len: usize,
}

fn to_datetime(ms: u64) -> Option<DateTime<Utc>> {
    DateTime::<Utc>::from_timestamp_millis(i64::try_from(ms).ok()?)
}

fn from_datetime(at: DateTime<Utc>) -> u64 {
    u64::try_from(at.timestamp_millis())
        .unwrap_or(0)
        .min(MAX_DUE_MS)
}

/// The id of the occurrence of schedule `id` at `at_ms`.
pub(crate) fn occurrence_id(id: &str, at_ms: u64) -> String {
    format!("{id}@{at_ms}")
}

impl FromStr for CatchUp {
    type Err = Error;

    fn from_str(text: &str) -> Result<CatchUp, Error> {
        match text {
            "latest" => Ok(CatchUp::Latest),
            "all" => Ok(CatchUp::All),
            other => Err(Error::Invalid(format!(
                "catch-up {other:?}: expected \"latest\" or \"all\""
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(recurring: Recurring, now: u64) -> Spec {
        recurring.into_parts(now).unwrap().1
    }

    #[test]
    fn a_period_owes_one_occurrence_per_period_and_collapses_missed_ones() {
        let mut every = spec(Recurring::every(Duration::from_millis(100)), 1_000);
        assert_eq!(every.next_after(1_000), 1_100);
        assert_eq!(every.advance(1_100), (vec![1_100], 1_200));
        assert_eq!(every.advance(1_150), (vec![], 1_200), "nothing owed twice");
        // Down from 1 150 to 1 730: 1 200 … 1 700 were missed; one stands for them.
        assert_eq!(every.advance(1_730), (vec![1_700], 1_800));
    }

    #[test]
    fn catch_up_all_owes_each_missed_occurrence_up_to_the_bound() {
        let mut every = spec(
            Recurring::every(Duration::from_millis(100)).catch_up(CatchUp::All),
            1_000,
        );
        assert_eq!(
            every.advance(1_450),
            (vec![1_100, 1_200, 1_300, 1_400], 1_500)
        );
        let mut fast = spec(
            Recurring::every(Duration::from_millis(1)).catch_up(CatchUp::All),
            0,
        );
        let (owed, next) = fast.advance(5_000);
        assert_eq!(owed.len(), MAX_CATCH_UP);
        assert_eq!(
            (owed[0], *owed.last().unwrap(), next),
            (4_001, 5_000, 5_001)
        );
    }

    #[test]
    fn cron_expressions_with_seconds_run_in_utc() {
        // 2023-11-14T22:13:20Z = 1_700_000_000_000 ms.
        let mut cron = spec(
            Recurring::cron("*/10 * * * * *").unwrap(),
            1_700_000_000_000,
        );
        assert_eq!(cron.next_after(1_700_000_000_000), 1_700_000_010_000);
        assert_eq!(
            cron.advance(1_700_000_025_000),
            (vec![1_700_000_020_000], 1_700_000_030_000)
        );
        let five_fields = spec(Recurring::cron("0 0 * * *").unwrap(), 1_700_000_000_000);
        assert_eq!(five_fields.next_after(1_700_000_000_000), 1_700_006_400_000); // midnight
    }

    #[test]
    fn specs_round_trip_and_bad_ones_are_errors() {
        for recurring in [
            Recurring::every(Duration::from_secs(60)).catch_up(CatchUp::All),
            Recurring::cron("0 */5 * * * *").unwrap(),
        ] {
            let original = spec(recurring, 42);
            let decoded = Spec::decode(&original.encode()).unwrap();
            assert_eq!(decoded.encode(), original.encode());
            assert!(decoded.same_definition(&original));
        }
        assert!(Spec::decode("nonsense").is_err());
        assert!(Spec::decode("latest|1|every|0|0").is_err());
        assert!(Recurring::cron("").is_err());
        assert!(Recurring::cron("* * *").is_err());
        let zero = Recurring::every(Duration::ZERO).into_parts(0).unwrap_err();
        assert!(matches!(zero, Error::Invalid(_)), "{zero}");
    }

    #[test]
    fn default_ids_come_from_the_definition() {
        let (id, ..) = Recurring::every(Duration::from_secs(60))
            .into_parts(0)
            .unwrap();
        assert_eq!(id.as_str(), "every 60000ms");
        let (id, ..) = Recurring::cron("0 */5 * * * *")
            .unwrap()
            .into_parts(0)
            .unwrap();
        assert_eq!(id.as_str(), "cron 0 */5 * * * *");
    }
}
