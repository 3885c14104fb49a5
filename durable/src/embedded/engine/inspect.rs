//! Inspection inside a step: get, paged lists and their cursors, dead letters, purge, stats.

use super::*;

impl StepState<'_> {
    pub(super) fn purge(
        &mut self,
        tasks: &mut Tasks<'_>,
        before_ms: u64,
    ) -> Result<(u64, bool), Error> {
        let page = tasks.ordered(Table::Dead, None, STEP_LIMIT)?;
        let full = page.len() == STEP_LIMIT;
        let mut removed = 0;
        for (dead_ms, _, id) in page {
            if dead_ms >= before_ms {
                return Ok((removed, true));
            }
            let record = tasks.get(&id)?.ok_or_else(|| missing(&id))?;
            tasks.delete(&id, &record)?;
            removed += 1;
        }
        Ok((removed, !full))
    }

    pub(super) fn info(&self, id: &str, record: &Record) -> TaskInfo {
        let state = match record.state {
            State::Pending | State::Recurring => TaskState::Pending,
            State::Dead => TaskState::Dead {
                reason: record.reason.clone(),
            },
            State::InFlight => TaskState::InFlight {
                attempt: record.attempts,
                lease_until: system_time(self.lease_end(id)),
            },
        };
        TaskInfo {
            id: TaskId::from(id),
            state,
            due: system_time(record.due_ms),
            attempts: record.attempts,
            payload_len: usize::try_from(record.payload_len).unwrap_or(usize::MAX),
            reason: (record.state == State::Dead).then(|| record.reason.clone()),
        }
    }

    /// When `id`'s lease ends (a buffered claim: as if handed out now).
    pub(super) fn lease_end(&self, id: &str) -> u64 {
        self.flights
            .of(id)
            .and_then(|f| f.lease_until)
            .unwrap_or_else(|| self.now.saturating_add(self.settings.lease_ms()))
    }

    pub(super) fn get(
        &mut self,
        tasks: &mut Tasks<'_>,
        id: &str,
    ) -> Result<Option<TaskInfo>, Error> {
        Ok(tasks.get(id)?.map(|record| self.info(id, &record)))
    }

    pub(super) fn list(
        &mut self,
        tasks: &mut Tasks<'_>,
        filter: TaskFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<TaskInfo>, Error> {
        if filter == TaskFilter::InFlight {
            // Few (bounded by the streams' prefetch), and in memory: sorted here. Claims still
            // in a stream's buffer sort after every delivery handed out (their reported lease
            // end slides with the clock, so it cannot order pages).
            let mut flights: Vec<(u64, String)> = self
                .flights
                .tokens
                .keys()
                .map(|id| {
                    let end = self.flights.of(id).and_then(|f| f.lease_until);
                    (end.unwrap_or(u64::MAX), id.clone())
                })
                .collect();
            flights.sort_unstable();
            let start = match after {
                None => 0,
                Some(after) => {
                    let position = flights.iter().position(|(_, id)| id == after);
                    position.ok_or_else(|| stale_cursor(after, filter))? + 1
                }
            };
            let mut page = Vec::new();
            for (_, id) in flights.into_iter().skip(start).take(limit) {
                let record = tasks.get(&id)?.ok_or_else(|| missing(&id))?;
                page.push(self.info(&id, &record));
            }
            return Ok(page);
        }
        let (table, cursor) = self.cursor(tasks, filter, after)?;
        let mut page = Vec::new();
        for (_, _, id) in tasks.ordered(table, cursor, limit)? {
            let record = tasks.get(&id)?.ok_or_else(|| missing(&id))?;
            page.push(self.info(&id, &record));
        }
        Ok(page)
    }

    /// A page after a position: the index's own key for pending tasks (due, seq) and dead
    /// letters (time of death, seq); (lease end, id) for the flights in memory, claims still
    /// in a buffer last (as if their lease ended at `u64::MAX`).
    pub(super) fn list_page(
        &mut self,
        tasks: &mut Tasks<'_>,
        filter: TaskFilter,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, Error> {
        let mut found: Vec<(u64, u64, String)> = Vec::new();
        if filter == TaskFilter::InFlight {
            let mut flights: Vec<(u64, String)> = self
                .flights
                .tokens
                .keys()
                .map(|id| {
                    let end = self.flights.of(id).and_then(|f| f.lease_until);
                    (end.unwrap_or(u64::MAX), id.clone())
                })
                .filter(|(end, id)| {
                    cursor.is_none_or(|c| (*end, id.as_str()) > (c.first, c.id.as_str()))
                })
                .collect();
            flights.sort_unstable();
            found.extend(
                flights
                    .into_iter()
                    .take(limit)
                    .map(|(end, id)| (end, 0, id)),
            );
        } else {
            let table = match filter {
                TaskFilter::Dead => Table::Dead,
                _ => Table::Pending,
            };
            found = tasks.ordered(table, cursor.map(|c| (c.first, c.seq)), limit)?;
        }
        let mut items = Vec::with_capacity(found.len());
        for (_, _, id) in &found {
            let record = tasks.get(id)?.ok_or_else(|| missing(id))?;
            items.push(self.info(id, &record));
        }
        let next = (found.len() == limit)
            .then(|| found.pop())
            .flatten()
            .map(|(first, seq, id)| Cursor {
                filter,
                first,
                seq,
                id,
            });
        Ok(Page { items, next })
    }

    /// The index and the position after `after` in it, for the pending or dead list.
    pub(super) fn cursor(
        &self,
        tasks: &mut Tasks<'_>,
        filter: TaskFilter,
        after: Option<&str>,
    ) -> Result<(Table, Option<(u64, u64)>), Error> {
        let table = match filter {
            TaskFilter::Dead => Table::Dead,
            _ => Table::Pending,
        };
        let Some(after) = after else {
            return Ok((table, None));
        };
        let record = tasks.get(after)?;
        let position = match (filter, record) {
            (TaskFilter::Dead, Some(r)) if r.state == State::Dead => (r.dead_ms, r.seq),
            (TaskFilter::Pending, Some(r))
                if matches!(r.state, State::Pending | State::Recurring) =>
            {
                (r.due_ms, r.seq)
            }
            _ => return Err(stale_cursor(after, filter)),
        };
        Ok((table, Some(position)))
    }

    pub(super) fn dead_letters(
        &mut self,
        tasks: &mut Tasks<'_>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, Error> {
        let (_, mut cursor) = self.cursor(tasks, TaskFilter::Dead, after)?;
        let mut letters = Vec::new();
        while letters.len() < limit {
            let page =
                tasks.ordered(Table::Dead, cursor, (limit - letters.len()).min(STEP_LIMIT))?;
            let Some(&(dead_ms, seq, _)) = page.last() else {
                break;
            };
            cursor = Some((dead_ms, seq));
            for (_, _, id) in page {
                let record = tasks.get(&id)?.ok_or_else(|| missing(&id))?;
                letters.push(DeadLetter {
                    payload: tasks.payload(&id)?.unwrap_or_default(),
                    id: TaskId::from(id),
                    attempts: record.attempts,
                    reason: record.reason,
                });
            }
        }
        Ok(letters)
    }

    /// One task's payload, or `None` if there is no task of that id.
    pub(super) fn payload(
        &mut self,
        tasks: &mut Tasks<'_>,
        id: &str,
    ) -> Result<Option<Vec<u8>>, Error> {
        if tasks.get(id)?.is_none() {
            return Ok(None);
        }
        Ok(Some(tasks.payload(id)?.unwrap_or_default()))
    }

    /// Up to `limit` recurring schedules among the next [`STEP_LIMIT`] entries of the
    /// pending index after `cursor`: a schedule is pending at its next due time, among the
    /// tasks, so this looks through them (one bounded range per call). `next` is the position
    /// of the last entry looked at, `None` once the index ended.
    pub(super) fn recurring_page(
        &mut self,
        tasks: &mut Tasks<'_>,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<RecurringPage, Error> {
        let entries =
            tasks.ordered(Table::Pending, cursor.map(|c| (c.first, c.seq)), STEP_LIMIT)?;
        let ended = entries.len() < STEP_LIMIT;
        let mut items = Vec::new();
        let mut last = None;
        for (first, seq, id) in entries {
            if items.len() == limit {
                break;
            }
            let record = tasks.get(&id)?.ok_or_else(|| missing(&id))?;
            if record.state == State::Recurring {
                items.push(Spec::decode(&record.reason)?.info(&id, record.payload_len));
            }
            last = Some((first, seq, id));
        }
        let stopped_early = items.len() == limit && last.is_some();
        let next = (stopped_early || !ended)
            .then_some(last)
            .flatten()
            .map(|(first, seq, id)| Cursor {
                filter: TaskFilter::Pending,
                first,
                seq,
                id,
            });
        Ok(RecurringPage { items, next })
    }

    pub(super) fn stats(&mut self, tasks: &mut Tasks<'_>) -> Result<QueueStats, Error> {
        let mut samples = self.lateness.samples();
        let c = *self.counters;
        Ok(QueueStats {
            pending: tasks.count(Table::Pending)?,
            in_flight: tasks.count(Table::InFlight)?,
            dead: tasks.count(Table::Dead)?,
            delivered: c.delivered,
            acked: c.acked,
            retried: c.retried,
            dead_lettered: c.dead_lettered,
            expired: c.expired,
            returned: c.returned,
            lateness_p50: percentile(&mut samples, 50),
            lateness_p99: percentile(&mut samples, 99),
            eviction_policy_unknown: false,
            paused: *self.paused,
        })
    }
}
