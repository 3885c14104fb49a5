//! The task model on a [`Store`](super::store::Store)'s tables: records, the indexes that
//! keep them in order, payloads and counters. Every change to a task goes through
//! [`Tasks::put`] or [`Tasks::delete`], which keep the indexes in step with the record.
//!
//! Format 2 (integers little-endian in values, big-endian in index keys so byte order is
//! numeric order):
//!
//! | table | key | value |
//! |---|---|---|
//! | `Records` | id | `[2][state][due u64][seq u64][attempts u32][payload length u64][dead at u64][reason length u32][reason]` |
//! | `Payloads` | id | payload |
//! | `Pending` | due, seq | id (pending tasks and recurring schedules, by next due time) |
//! | `Dead` | dead at, seq | id |
//! | `InFlight` | id | nothing |
//! | `Meta` | name | u64 (`format`, `seq`, and the counters) |

use super::store::{RedbStore, Store, Table, Transaction};
use crate::Error;

/// The record format this version writes.
pub(crate) const FORMAT: u64 = 2;
const HEADER: usize = 1 + 1 + 8 + 8 + 4 + 8 + 8 + 4;

/// Where a task is in its life, as its record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Pending,
    InFlight,
    Dead,
    /// A recurring schedule: `due` is its next occurrence, `reason` its definition.
    Recurring,
}

/// A task's record: everything but its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) state: State,
    /// Due time (ms since the Unix epoch): for a recurring schedule, its next occurrence.
    pub(crate) due_ms: u64,
    /// Schedule order, for ties in due time.
    pub(crate) seq: u64,
    /// Deliveries so far.
    pub(crate) attempts: u32,
    pub(crate) payload_len: u64,
    /// When it went to the dead letters (ms), for a dead task.
    pub(crate) dead_ms: u64,
    /// Why it is dead; for a recurring schedule, its definition.
    pub(crate) reason: String,
}

impl Record {
    fn encode(&self) -> Vec<u8> {
        let mut buffer = Vec::with_capacity(HEADER + self.reason.len());
        buffer.push(FORMAT as u8);
        buffer.push(match self.state {
            State::Pending => 0,
            State::InFlight => 1,
            State::Dead => 2,
            State::Recurring => 3,
        });
        buffer.extend_from_slice(&self.due_ms.to_le_bytes());
        buffer.extend_from_slice(&self.seq.to_le_bytes());
        buffer.extend_from_slice(&self.attempts.to_le_bytes());
        buffer.extend_from_slice(&self.payload_len.to_le_bytes());
        buffer.extend_from_slice(&self.dead_ms.to_le_bytes());
        buffer.extend_from_slice(&(self.reason.len() as u32).to_le_bytes());
        buffer.extend_from_slice(self.reason.as_bytes());
        buffer
    }

    fn decode(id: &str, bytes: &[u8]) -> Result<Record, Error> {
        let corrupt = |why: &str| Error::Corrupt(format!("task {id:?}: {why}"));
        if bytes.len() < HEADER || u64::from(bytes[0]) != FORMAT {
            return Err(corrupt("unknown record format"));
        }
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        let state = match bytes[1] {
            0 => State::Pending,
            1 => State::InFlight,
            2 => State::Dead,
            3 => State::Recurring,
            _ => return Err(corrupt("unknown state")),
        };
        let reason_len = u32_at(38) as usize;
        let reason = bytes
            .get(HEADER..HEADER + reason_len)
            .ok_or_else(|| corrupt("truncated reason"))?;
        Ok(Record {
            state,
            due_ms: u64_at(2),
            seq: u64_at(10),
            attempts: u32_at(18),
            payload_len: u64_at(22),
            dead_ms: u64_at(30),
            reason: String::from_utf8_lossy(reason).into_owned(),
        })
    }

    /// This record's entry in the ordered indexes, if it has one there.
    fn order_key(&self) -> Option<(Table, [u8; 16])> {
        match self.state {
            State::Pending | State::Recurring => Some((Table::Pending, key(self.due_ms, self.seq))),
            State::Dead => Some((Table::Dead, key(self.dead_ms, self.seq))),
            State::InFlight => None,
        }
    }
}

/// An index key: two numbers, big-endian, so byte order is numeric order.
pub(crate) fn key(first: u64, second: u64) -> [u8; 16] {
    let mut key = [0; 16];
    key[..8].copy_from_slice(&first.to_be_bytes());
    key[8..].copy_from_slice(&second.to_be_bytes());
    key
}

fn unkey(bytes: &[u8]) -> Option<(u64, u64)> {
    let first = u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?);
    let second = u64::from_be_bytes(bytes.get(8..16)?.try_into().ok()?);
    Some((first, second))
}

/// The queue's counters, kept in the store so they survive restarts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) delivered: u64,
    pub(crate) acked: u64,
    pub(crate) retried: u64,
    pub(crate) dead_lettered: u64,
    pub(crate) expired: u64,
    pub(crate) returned: u64,
}

impl Counters {
    const NAMES: [&'static str; 6] = [
        "delivered",
        "acked",
        "retried",
        "dead_lettered",
        "expired",
        "returned",
    ];

    fn fields(&mut self) -> [&mut u64; 6] {
        [
            &mut self.delivered,
            &mut self.acked,
            &mut self.retried,
            &mut self.dead_lettered,
            &mut self.expired,
            &mut self.returned,
        ]
    }
}

/// Typed access to the task tables inside one transaction.
pub(crate) struct Tasks<'t> {
    pub(crate) tx: &'t mut dyn Transaction,
}

impl Tasks<'_> {
    pub(crate) fn get(&mut self, id: &str) -> Result<Option<Record>, Error> {
        self.tx
            .get(Table::Records, id.as_bytes())?
            .map(|bytes| Record::decode(id, &bytes))
            .transpose()
    }

    /// Stores `record` for `id`, replacing `old` (what the store holds now) and moving the
    /// index entries with it.
    pub(crate) fn put(
        &mut self,
        id: &str,
        old: Option<&Record>,
        record: &Record,
    ) -> Result<(), Error> {
        self.unindex(id, old)?;
        self.tx
            .insert(Table::Records, id.as_bytes(), &record.encode())?;
        match record.order_key() {
            Some((table, key)) => self.tx.insert(table, &key, id.as_bytes())?,
            None => self.tx.insert(Table::InFlight, id.as_bytes(), &[])?,
        }
        Ok(())
    }

    /// Deletes the task `id` (whose record is `old`) with its payload.
    pub(crate) fn delete(&mut self, id: &str, old: &Record) -> Result<(), Error> {
        self.unindex(id, Some(old))?;
        self.tx.remove(Table::Records, id.as_bytes())?;
        self.tx.remove(Table::Payloads, id.as_bytes())
    }

    fn unindex(&mut self, id: &str, old: Option<&Record>) -> Result<(), Error> {
        let Some(old) = old else { return Ok(()) };
        match old.order_key() {
            Some((table, key)) => self.tx.remove(table, &key),
            None => self.tx.remove(Table::InFlight, id.as_bytes()),
        }
    }

    pub(crate) fn payload(&mut self, id: &str) -> Result<Option<Vec<u8>>, Error> {
        self.tx.get(Table::Payloads, id.as_bytes())
    }

    pub(crate) fn set_payload(&mut self, id: &str, payload: &[u8]) -> Result<(), Error> {
        self.tx.insert(Table::Payloads, id.as_bytes(), payload)
    }

    /// Up to `limit` entries `(first, seq, id)` of the `Pending` or `Dead` index, after
    /// `after` (exclusive).
    pub(crate) fn ordered(
        &mut self,
        table: Table,
        after: Option<(u64, u64)>,
        limit: usize,
    ) -> Result<Vec<(u64, u64, String)>, Error> {
        let after = after.map(|(a, b)| key(a, b));
        let page = self
            .tx
            .range(table, after.as_ref().map(|k| &k[..]), limit)?;
        page.into_iter()
            .map(|(k, id)| {
                let (first, seq) =
                    unkey(&k).ok_or_else(|| Error::Corrupt("an index key is damaged".into()))?;
                let id = String::from_utf8(id)
                    .map_err(|_| Error::Corrupt("an index entry is not an id".into()))?;
                Ok((first, seq, id))
            })
            .collect()
    }

    /// Up to `limit` ids of tasks in flight, in id order, after `after`.
    pub(crate) fn in_flight(
        &mut self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, Error> {
        let page = self
            .tx
            .range(Table::InFlight, after.map(str::as_bytes), limit)?;
        Ok(page
            .into_iter()
            .map(|(id, _)| String::from_utf8_lossy(&id).into_owned())
            .collect())
    }

    pub(crate) fn count(&mut self, table: Table) -> Result<u64, Error> {
        self.tx.len(table)
    }

    pub(crate) fn meta(&mut self, name: &str) -> Result<u64, Error> {
        Ok(self
            .tx
            .get(Table::Meta, name.as_bytes())?
            .and_then(|bytes| {
                bytes
                    .get(..8)
                    .map(|b| u64::from_le_bytes(b.try_into().expect("8")))
            })
            .unwrap_or(0))
    }

    pub(crate) fn set_meta(&mut self, name: &str, value: u64) -> Result<(), Error> {
        self.tx
            .insert(Table::Meta, name.as_bytes(), &value.to_le_bytes())
    }

    pub(crate) fn counters(&mut self) -> Result<Counters, Error> {
        let mut counters = Counters::default();
        for (name, field) in Counters::NAMES.into_iter().zip(counters.fields()) {
            *field = self.meta(name)?;
        }
        Ok(counters)
    }

    /// Writes the counters that differ from `before`.
    pub(crate) fn save_counters(&mut self, before: &Counters, now: &Counters) -> Result<(), Error> {
        let (mut before, mut now) = (*before, *now);
        for ((name, old), new) in Counters::NAMES
            .into_iter()
            .zip(before.fields())
            .zip(now.fields())
        {
            if *old != *new {
                self.set_meta(name, *new)?;
            }
        }
        Ok(())
    }
}

/// A record of the first format (`tasks` table, payload inline), for migration:
/// `[1][state][due u64][seq u64][attempts u32][lease u64][reason length u32][reason][payload]`.
pub(crate) fn decode_legacy(id: &str, bytes: &[u8]) -> Result<(Record, Vec<u8>), Error> {
    const LEGACY_HEADER: usize = 1 + 1 + 8 + 8 + 4 + 8 + 4;
    let corrupt = |why: &str| Error::Corrupt(format!("task {id:?}: {why}"));
    if bytes.len() < LEGACY_HEADER || bytes[0] != 1 {
        return Err(corrupt("unknown record format"));
    }
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
    let state = match bytes[1] {
        0 => State::Pending,
        1 => State::InFlight,
        2 => State::Dead,
        _ => return Err(corrupt("unknown state")),
    };
    let reason_len = u32_at(30) as usize;
    let reason = bytes
        .get(LEGACY_HEADER..LEGACY_HEADER + reason_len)
        .ok_or_else(|| corrupt("truncated reason"))?;
    let payload = bytes[LEGACY_HEADER + reason_len..].to_vec();
    Ok((
        Record {
            state,
            due_ms: u64_at(2),
            seq: u64_at(10),
            attempts: u32_at(18),
            payload_len: payload.len() as u64,
            dead_ms: 0,
            reason: String::from_utf8_lossy(reason).into_owned(),
        },
        payload,
    ))
}

/// Moves the tasks of a store written in the first format (one `tasks` table, payloads
/// inline) to this format, in pages, then drops the old table. Every old record is decoded
/// before anything is written, so a damaged store is reported and left as it was.
pub(crate) fn migrate_legacy(store: &mut RedbStore, now_ms: u64) -> Result<(), Error> {
    const PAGE: usize = 1000;
    let mut after: Option<String> = None;
    let mut found = false;
    loop {
        let page = store.legacy_page(after.as_deref(), PAGE)?;
        for (id, bytes) in &page {
            decode_legacy(id, bytes)?;
        }
        found |= !page.is_empty();
        match page.last() {
            Some((id, _)) if page.len() == PAGE => after = Some(id.clone()),
            _ => break,
        }
    }
    if !found {
        return Ok(());
    }
    after = None;
    loop {
        let page = store.legacy_page(after.as_deref(), PAGE)?;
        store.transact(&mut |tx| {
            let mut tasks = Tasks { tx };
            let mut next_seq = tasks.meta("seq")?;
            for (id, bytes) in &page {
                let (mut record, payload) = decode_legacy(id, bytes)?;
                if record.state == State::Dead {
                    record.dead_ms = now_ms;
                }
                let old = tasks.get(id)?;
                tasks.put(id, old.as_ref(), &record)?;
                tasks.set_payload(id, &payload)?;
                next_seq = next_seq.max(record.seq + 1);
            }
            tasks.set_meta("seq", next_seq)?;
            tasks.set_meta("format", FORMAT)
        })?;
        match page.last() {
            Some((id, _)) if page.len() == PAGE => after = Some(id.clone()),
            _ => break,
        }
    }
    store.drop_legacy()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: State) -> Record {
        Record {
            state,
            due_ms: 1_700_000_000_000,
            seq: 42,
            attempts: 3,
            payload_len: 7,
            dead_ms: 99,
            reason: "because".into(),
        }
    }

    #[test]
    fn records_round_trip() {
        for state in [
            State::Pending,
            State::InFlight,
            State::Dead,
            State::Recurring,
        ] {
            let original = record(state);
            assert_eq!(Record::decode("t-1", &original.encode()).unwrap(), original);
        }
    }

    #[test]
    fn damaged_records_are_corrupt_not_panics() {
        let mut bytes = record(State::Pending).encode();
        for cut in 0..HEADER {
            assert!(matches!(
                Record::decode("t", &bytes[..cut]),
                Err(Error::Corrupt(_))
            ));
        }
        bytes[1] = 9;
        assert!(matches!(
            Record::decode("t", &bytes),
            Err(Error::Corrupt(_))
        ));
        assert!(decode_legacy("t", &[1, 0, 0]).is_err());
    }

    #[test]
    fn index_keys_sort_numerically() {
        assert!(key(1, u64::MAX) < key(2, 0));
        assert!(key(256, 0) > key(255, u64::MAX));
        assert_eq!(unkey(&key(7, 9)), Some((7, 9)));
    }
}
