//! Reading a queue: its length, one task, pages of an index across partitions, dead letters,
//! the counts and counters — and purging old dead letters. Every script here touches a
//! bounded number of entries (a page, a batch), never a whole set.

use super::keys::partition_of;
use super::shared::{PAGE, Shared, number, redis_args};
use crate::inspect::{QueueStats, TaskFilter, TaskInfo, TaskState, percentile};
use crate::protocol::{stale_cursor, system_time};
use crate::recurring::Spec;
use crate::{Cursor, DeadLetter, Error, Page, RecurringPage, TaskId};

/// One entry of a list page: id, record, lease end, payload length (or payload), and its
/// position (score in the index, schedule sequence).
struct Row {
    id: String,
    meta: String,
    lease: Option<u64>,
    last: Vec<u8>,
    score: u64,
    seq: u64,
}

impl Shared {
    pub(crate) async fn len(&self) -> Result<usize, Error> {
        let mut total = 0;
        for keys in &self.parts {
            let (due, inflight): (usize, usize) = self
                .call(|mut connection| {
                    let mut pipe = redis::pipe();
                    pipe.zcard(&keys.due).zcard(&keys.inflight);
                    async move { pipe.query_async(&mut connection).await }
                })
                .await?;
            total += due + inflight;
        }
        Ok(total)
    }

    /// Pauses (`true`) or resumes claiming on every partition; a resume wakes the idle
    /// workers of each.
    pub(crate) async fn pause(&self, pause: bool) -> Result<(), Error> {
        for keys in &self.parts {
            let _: i64 = self
                .invoke_write(
                    keys,
                    &self.scripts.pause,
                    &[&keys.paused, &keys.idle],
                    redis_args!["tw-pause", if pause { "1" } else { "0" }],
                )
                .await?;
        }
        Ok(())
    }

    /// Whether claiming is paused (on any partition: a pause or resume that failed part-way
    /// reads as paused until done again).
    pub(crate) async fn is_paused(&self) -> Result<bool, Error> {
        for keys in &self.parts {
            let paused: bool = self
                .call(|mut connection| {
                    let key = keys.paused.clone();
                    async move {
                        redis::cmd("EXISTS")
                            .arg(key)
                            .query_async(&mut connection)
                            .await
                    }
                })
                .await?;
            if paused {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Every dead letter, a page of [`PAGE`] at a time so no command grows with the list.
    pub(crate) async fn dead_letters(&self) -> Result<Vec<DeadLetter>, Error> {
        let mut letters = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self.dead_letters_page(after.as_deref(), PAGE).await?;
            let Some(last) = page.last() else { break };
            after = Some(last.id.to_string());
            letters.extend(page);
        }
        Ok(letters)
    }

    pub(crate) async fn get(&self, id: &str) -> Result<Option<TaskInfo>, Error> {
        let keys = self.keys_for(id);
        let reply: Vec<Vec<u8>> = self
            .invoke(
                &self.scripts.get,
                &[&keys.meta, &keys.inflight, &keys.payload],
                redis_args!["tw-get", id],
            )
            .await?;
        let mut fields = reply.into_iter();
        let (Some(meta), Some(lease), Some(len)) = (fields.next(), fields.next(), fields.next())
        else {
            return Ok(None);
        };
        let meta = String::from_utf8(meta).map_err(|_| Error::Io("a record is not text".into()))?;
        task_info(id, &meta, number(&lease), number(&len).unwrap_or(0)).map(Some)
    }

    /// One page of one partition's index, with payload lengths (or payloads), after a
    /// cursor task or a position (score, member).
    async fn page_of(
        &self,
        p: usize,
        filter: TaskFilter,
        after: Start<'_>,
        limit: usize,
        payloads: bool,
    ) -> Result<Vec<Row>, Error> {
        let keys = &self.parts[p];
        let name = match filter {
            TaskFilter::Pending => "pending",
            TaskFilter::InFlight => "inflight",
            TaskFilter::Dead => "dead",
        };
        let reply: redis::Value = self
            .invoke(
                &self.scripts.list,
                &[
                    &keys.meta,
                    &keys.due,
                    &keys.inflight,
                    &keys.dead,
                    &keys.payload,
                ],
                {
                    let (task, score, member) = match &after {
                        Start::First => ("", String::new(), String::new()),
                        Start::After(id) => (*id, String::new(), String::new()),
                        Start::At(cursor) => ("", cursor.first.to_string(), member_of(cursor)),
                    };
                    redis_args![
                        "tw-list",
                        name,
                        task,
                        limit,
                        if payloads { "1" } else { "0" },
                        score,
                        member
                    ]
                },
            )
            .await?;
        let bad = || Error::Io("unexpected reply from the list script".into());
        let stale = || match &after {
            Start::After(id) => stale_cursor(id, filter),
            _ => bad(),
        };
        let items: Vec<Vec<u8>> = match reply {
            redis::Value::SimpleString(text) if text == "STALE" => return Err(stale()),
            redis::Value::BulkString(text) if text == b"STALE" => return Err(stale()),
            other => redis::FromRedisValue::from_redis_value(other).map_err(|_| bad())?,
        };
        let mut page = Vec::new();
        let mut fields = items.into_iter();
        let text = |bytes: Vec<u8>| String::from_utf8(bytes).map_err(|_| bad());
        while let Some(id) = fields.next() {
            let mut field = || fields.next().ok_or_else(bad);
            let (meta, lease, last) = (field()?, field()?, field()?);
            let (score, seq) = (field()?, field()?);
            page.push(Row {
                id: text(id)?,
                meta: text(meta)?,
                lease: number(&lease),
                last,
                score: number(&score).ok_or_else(bad)?,
                seq: number(&seq).ok_or_else(bad)?,
            });
        }
        Ok(page)
    }

    /// A page across partitions: one partition after another (in order within each), the
    /// cursor (a task, or a position taken from one) naming where to go on.
    async fn page(
        &self,
        filter: TaskFilter,
        after: Start<'_>,
        limit: usize,
        payloads: bool,
    ) -> Result<Vec<Row>, Error> {
        let mut p = match &after {
            Start::First => 0,
            Start::After(id) => partition_of(id, self.parts.len()),
            Start::At(cursor) => partition_of(&cursor.id, self.parts.len()),
        };
        let mut start = after;
        let mut page = Vec::new();
        while p < self.parts.len() && page.len() < limit {
            page.extend(
                self.page_of(p, filter, start, limit - page.len(), payloads)
                    .await?,
            );
            start = Start::First;
            p += 1;
        }
        Ok(page)
    }

    pub(crate) async fn list_page(
        &self,
        filter: TaskFilter,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, Error> {
        let start = cursor.map_or(Start::First, Start::At);
        let rows = self.page(filter, start, limit, false).await?;
        let next = (rows.len() == limit)
            .then(|| rows.last())
            .flatten()
            .map(|row| Cursor {
                filter,
                first: row.score,
                seq: row.seq,
                id: row.id.clone(),
            });
        let items = rows
            .into_iter()
            .map(|row| {
                task_info(
                    &row.id,
                    &row.meta,
                    row.lease,
                    number(&row.last).unwrap_or(0),
                )
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(Page { items, next })
    }

    pub(crate) async fn list(
        &self,
        filter: TaskFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<TaskInfo>, Error> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let after = after.map_or(Start::First, Start::After);
        self.page(filter, after, limit, false)
            .await?
            .into_iter()
            .map(|row| {
                task_info(
                    &row.id,
                    &row.meta,
                    row.lease,
                    number(&row.last).unwrap_or(0),
                )
            })
            .collect()
    }

    pub(crate) async fn dead_letters_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, Error> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let after = after.map_or(Start::First, Start::After);
        self.page(TaskFilter::Dead, after, limit, true)
            .await?
            .into_iter()
            .map(|row| {
                let info = task_info(&row.id, &row.meta, row.lease, row.last.len() as u64)?;
                Ok(DeadLetter {
                    id: info.id,
                    payload: row.last,
                    attempts: info.attempts,
                    reason: info.reason.unwrap_or_default(),
                })
            })
            .collect()
    }

    /// Purges dead letters older than `older_than_ms`, a bounded batch per script call.
    pub(crate) async fn purge_dead(&self, older_than_ms: u64) -> Result<u64, Error> {
        let mut removed = 0;
        for keys in &self.parts {
            loop {
                let batch: u64 = self
                    .invoke_write(
                        keys,
                        &self.scripts.purge,
                        &[&keys.meta, &keys.dead, &keys.payload],
                        redis_args!["tw-purge", older_than_ms, PAGE],
                    )
                    .await?;
                removed += batch;
                if batch < PAGE as u64 {
                    break;
                }
            }
        }
        Ok(removed)
    }

    /// The counts and counters, summed over the partitions (each read atomically).
    pub(crate) async fn stats(&self) -> Result<QueueStats, Error> {
        let mut stats = QueueStats::default();
        let mut late = Vec::new();
        for keys in &self.parts {
            let reply: Vec<u64> = self
                .invoke(
                    &self.scripts.stats,
                    &keys.stats_keys(),
                    redis_args!["tw-stats"],
                )
                .await?;
            let field = |i: usize| reply.get(i).copied().unwrap_or(0);
            stats.pending += field(0);
            stats.in_flight += field(1);
            stats.dead += field(2);
            stats.delivered += field(3);
            stats.acked += field(4);
            stats.retried += field(5);
            stats.dead_lettered += field(6);
            stats.expired += field(7);
            stats.returned += field(8);
            late.extend(reply.iter().skip(9).copied());
        }
        stats.lateness_p50 = percentile(&mut late, 50);
        stats.lateness_p99 = percentile(&mut late, 99);
        stats.eviction_policy_unknown = self.eviction.policy_unknown();
        stats.paused = self.is_paused().await?;
        Ok(stats)
    }
}

impl Shared {
    /// One task's payload, if there is such a task (`payload.lua`: reads only).
    pub(crate) async fn payload(&self, id: &str) -> Result<Option<Vec<u8>>, Error> {
        let keys = self.keys_for(id);
        let reply: Vec<Vec<u8>> = self
            .invoke(
                &self.scripts.payload,
                &[&keys.meta, &keys.payload],
                redis_args!["tw-payload", id],
            )
            .await?;
        Ok(reply.into_iter().next())
    }

    /// Recurring schedules after a position, looking through at most [`PAGE`] entries:
    /// partition after partition, in each first the pending index (schedules `r`), then the
    /// in-flight one (schedules `R`, held by a worker making their occurrences). The cursor
    /// is the position of the last entry looked at, its list saying which index and its id
    /// which partition.
    pub(crate) async fn recurring_page(
        &self,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<RecurringPage, Error> {
        let (mut p, mut filter, mut start) = match cursor {
            None => (0, TaskFilter::Pending, Start::First),
            Some(c) => (
                partition_of(&c.id, self.parts.len()),
                c.filter,
                Start::At(c),
            ),
        };
        let mut budget = PAGE;
        let mut items = Vec::new();
        let mut last: Option<(TaskFilter, Row)> = None;
        let mut ended = false;
        'scan: while budget > 0 {
            let rows = self.page_of(p, filter, start, budget, false).await?;
            let exhausted = rows.len() < budget;
            budget -= rows.len();
            let wanted = if filter == TaskFilter::Pending {
                "r|"
            } else {
                "R|"
            };
            for row in rows {
                if row.meta.starts_with(wanted) {
                    let spec = row.meta.splitn(7, '|').nth(6).unwrap_or_default();
                    let len = number(&row.last).unwrap_or(0);
                    items.push(Spec::decode(spec)?.info(&row.id, len));
                }
                last = Some((filter, row));
                if items.len() == limit {
                    break 'scan;
                }
            }
            if !exhausted {
                break;
            }
            // This index of this partition is done: the next one.
            start = Start::First;
            if filter == TaskFilter::Pending {
                filter = TaskFilter::InFlight;
            } else {
                filter = TaskFilter::Pending;
                p += 1;
                if p == self.parts.len() {
                    ended = true;
                    break;
                }
            }
        }
        let next = (!ended)
            .then_some(last)
            .flatten()
            .map(|(filter, row)| Cursor {
                filter,
                first: row.score,
                seq: row.seq,
                id: row.id,
            });
        Ok(RecurringPage { items, next })
    }
}

/// Where a page starts.
#[derive(Clone, Copy)]
enum Start<'a> {
    First,
    /// After this task, where it is now (`list`).
    After(&'a str),
    /// After this position (`list_page`).
    At(&'a Cursor),
}

/// A position's member in its index: `seq:id` zero-padded in the pending set (as
/// `prelude.lua`'s `member`), the id in the others.
fn member_of(cursor: &Cursor) -> String {
    match cursor.filter {
        TaskFilter::Pending => format!("{:020}:{}", cursor.seq, cursor.id),
        _ => cursor.id.clone(),
    }
}

/// A task as its metadata record (`state|due|seq|attempts|token|call|reason`) says.
fn task_info(
    id: &str,
    meta: &str,
    lease: Option<u64>,
    payload_len: u64,
) -> Result<TaskInfo, Error> {
    let bad = || Error::Corrupt(format!("task {id:?} has a damaged record"));
    let mut fields = meta.splitn(7, '|');
    let state = fields.next().ok_or_else(bad)?;
    let due: u64 = fields.next().and_then(|f| f.parse().ok()).ok_or_else(bad)?;
    let attempts: u32 = fields.nth(1).and_then(|f| f.parse().ok()).ok_or_else(bad)?;
    let reason = fields.nth(2).unwrap_or_default().to_owned();
    let (state, reason) = match state {
        "i" => (
            TaskState::InFlight {
                attempt: attempts,
                lease_until: system_time(lease.unwrap_or(0)),
            },
            None,
        ),
        "d" => (
            TaskState::Dead {
                reason: reason.clone(),
            },
            Some(reason),
        ),
        // Pending, or a recurring schedule (`r`; `R` while a worker advances it).
        _ => (TaskState::Pending, None),
    };
    Ok(TaskInfo {
        id: TaskId::from(id),
        state,
        due: system_time(due),
        attempts,
        payload_len: usize::try_from(payload_len).unwrap_or(usize::MAX),
        reason,
    })
}
