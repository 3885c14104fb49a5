//! The pages: overview, lists by state, the task page (search by id lands there), the
//! recurring schedules. Each reads the store once or twice, in bounded calls.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use axum::extract::{FromRequestParts, NestedPath, Path, Query, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{Html, IntoResponse, Response};

use super::html::{self, Frame, Tab, action, escape, href, query_value, table, time};
use super::{Board, lock};
use crate::units::short;
use crate::{
    CatchUp, Cursor, Error, QueueStats, RecurringKind, TaskFilter, TaskId, TaskInfo, TaskState,
};

/// A list page's default length, and the most it may ask for.
const PAGE: usize = 50;
const PAGE_MAX: usize = 500;
/// How many tasks the overview shows of the next due and of the dead.
const GLIMPSE: usize = 5;

/// Where the board is mounted, and the outcome of the action the browser comes from.
pub(super) struct Ctx {
    pub(super) base: String,
    notice: Option<String>,
    refresh: Option<u32>,
}

impl FromRequestParts<Arc<Board>> for Ctx {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        board: &Arc<Board>,
    ) -> Result<Ctx, Self::Rejection> {
        let base = parts
            .extensions
            .get::<NestedPath>()
            .map(|nested| nested.as_str().trim_end_matches('/').to_owned())
            .unwrap_or_default();
        let notice = parts
            .uri
            .query()
            .unwrap_or_default()
            .split('&')
            .find_map(|pair| pair.strip_prefix("notice="))
            .and_then(|n| n.parse().ok())
            .and_then(|n| board.notice_text(n));
        // `?refresh=N`: the page reloads itself every N seconds (5 to 300), no script needed.
        let refresh = parts
            .uri
            .query()
            .unwrap_or_default()
            .split('&')
            .find_map(|pair| pair.strip_prefix("refresh="))
            .and_then(|n| n.parse::<u32>().ok())
            .filter(|n| (5..=300).contains(n));
        Ok(Ctx {
            base,
            notice,
            refresh,
        })
    }
}

impl Ctx {
    pub(super) fn frame<'a>(&'a self, board: &'a Board) -> Frame<'a> {
        Frame {
            base: &self.base,
            title: &board.title,
            notice: self.notice.as_deref(),
            paused: board.paused.load(Ordering::Relaxed),
            refresh: self.refresh,
        }
    }
}

/// Why a page or an action could not be answered.
#[derive(Debug)]
pub(super) enum Failure {
    Store(Error),
    Timeout(Duration),
    BadRequest(String),
    Forbidden(String),
}

impl Failure {
    /// The error page.
    pub(super) fn page(&self, board: &Board, ctx: &Ctx) -> Response {
        let (status, heading, text) = match self {
            Failure::Store(Error::Invalid(why)) => {
                (StatusCode::BAD_REQUEST, "Not done", why.clone())
            }
            Failure::Store(error) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "The store did not answer",
                error.to_string(),
            ),
            Failure::Timeout(after) => (
                StatusCode::GATEWAY_TIMEOUT,
                "The store did not answer",
                format!("no answer within {}", short(*after)),
            ),
            Failure::BadRequest(why) => (StatusCode::BAD_REQUEST, "Not done", why.clone()),
            Failure::Forbidden(why) => (StatusCode::FORBIDDEN, "Refused", why.clone()),
        };
        let body = format!("<p class=error id=error>{}</p>", escape(&text));
        let page = html::page(&ctx.frame(board), Tab::Task, heading, &body);
        (status, Html(page)).into_response()
    }
}

fn ok(page: String) -> Response {
    Html(page).into_response()
}

/// `/`: the counts, the counters, lateness, the chart, the next due and the dead.
pub(super) async fn overview(State(board): State<Arc<Board>>, ctx: Ctx) -> Response {
    board.start_sampling();
    let now = SystemTime::now();
    let read = async {
        let stats = board.call(board.looking.stats()).await?;
        let next = board
            .call(board.looking.list_page(TaskFilter::Pending, None, GLIMPSE))
            .await?;
        let dead = board
            .call(board.looking.list_page(TaskFilter::Dead, None, GLIMPSE))
            .await?;
        Ok::<_, Failure>((stats, next.items, dead.items))
    };
    let (stats, next, dead) = match read.await {
        Ok(read) => read,
        Err(failure) => return failure.page(&board, &ctx),
    };
    board.paused.store(stats.paused, Ordering::Relaxed);
    let base = &ctx.base;
    let mut body = match ctx.refresh {
        Some(every) => format!(
            "<p class=muted>Refreshing every {every} s. <a id=refresh href=\"{}\">Stop</a></p>",
            href(base, "")
        ),
        None => format!(
            "<p class=muted><a id=refresh href=\"{}?refresh=10\">Refresh every 10 s</a></p>",
            href(base, "")
        ),
    };
    body.push_str(&cards(&stats));
    if stats.eviction_policy_unknown {
        body.push_str(
            "<p class=warning id=eviction-warning>The Redis server's eviction policy could not \
             be read (this user may run neither CONFIG GET nor INFO): make sure \
             <code>maxmemory-policy</code> is <code>noeviction</code>, or the queue's keys may \
             be evicted.</p>",
        );
    }
    body.push_str("<h2>Deliveries and failures, a bar a minute</h2>");
    body.push_str(&lock(&board.history).render(now));
    body.push_str(&counters(&stats));
    let _ = write!(
        body,
        "<h2>Next due</h2>{}<p><a href=\"{}\">All pending →</a></p>",
        task_rows("next-due", &next, TaskFilter::Pending, base, now, None),
        href(base, "/tasks/pending")
    );
    let _ = write!(
        body,
        "<h2>Dead letters</h2>{}<p><a href=\"{}\">All dead →</a></p>",
        task_rows("dead-glimpse", &dead, TaskFilter::Dead, base, now, None),
        href(base, "/tasks/dead")
    );
    if !board.read_only {
        body.push_str("<h2>Actions</h2>");
        body.push_str(&if stats.paused {
            action(base, &board.csrf, "/actions/resume", "", "Resume", false)
        } else {
            action(base, &board.csrf, "/actions/pause", "", "Pause", false)
        });
        body.push_str(&action(
            base,
            &board.csrf,
            "/actions/redrive-all",
            "",
            "Redrive all dead letters",
            true,
        ));
        body.push_str(&action(
            base,
            &board.csrf,
            "/actions/purge",
            "<label>older than <input name=older_than value=7d size=6 \
             aria-label=\"older than\"></label>",
            "Purge dead letters",
            true,
        ));
    }
    ok(html::page(
        &ctx.frame(&board),
        Tab::Overview,
        "Overview",
        &body,
    ))
}

fn cards(stats: &QueueStats) -> String {
    let card = |class: &str, n: String, k: &str| {
        format!(
            "<div class=\"card {class}\" id=count-{class}><div class=n>{n}</div><div class=k>{k}</div></div>"
        )
    };
    [
        card("pending", stats.pending.to_string(), "pending"),
        card("in-flight", stats.in_flight.to_string(), "in flight"),
        card("dead", stats.dead.to_string(), "dead"),
        card("p50", short(stats.lateness_p50), "lateness p50"),
        card("p99", short(stats.lateness_p99), "lateness p99"),
        card(
            "state",
            if stats.paused { "paused" } else { "running" }.to_owned(),
            "claiming",
        ),
    ]
    .into_iter()
    .fold("<div class=cards>".to_owned(), |out, c| out + &c)
        + "</div>"
}

fn counters(stats: &QueueStats) -> String {
    let rows: Vec<Vec<String>> = [
        ("delivered", stats.delivered),
        ("acked", stats.acked),
        ("retried", stats.retried),
        ("dead-lettered", stats.dead_lettered),
        ("lease ran out", stats.expired),
        ("returned unread", stats.returned),
    ]
    .iter()
    .map(|(name, n)| vec![(*name).to_owned(), n.to_string()])
    .collect();
    format!(
        "<h2>Counters since the queue was made</h2>{}",
        table("counters", &["counter", "count"], &rows)
    )
}

/// A table of tasks, each id linking to its page; with `redrive` (the anti-forgery token), a
/// dead letter's row carries its own redrive button, which comes back to the list.
fn task_rows(
    id: &str,
    tasks: &[TaskInfo],
    filter: TaskFilter,
    base: &str,
    now: SystemTime,
    redrive: Option<&str>,
) -> String {
    if tasks.is_empty() {
        return format!("<p class=muted id={id}>No {} tasks.</p>", filter.name());
    }
    let last = match filter {
        TaskFilter::InFlight => "lease ends",
        TaskFilter::Dead => "reason",
        _ => "payload",
    };
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|task| {
            let link = format!(
                "<a class=task-link href=\"{}?id={}\">{}</a>",
                href(base, "/task"),
                query_value(task.id.as_str()),
                escape(task.id.as_str())
            );
            let last = match &task.state {
                TaskState::InFlight { lease_until, .. } => time(*lease_until, now),
                TaskState::Dead { reason } => escape(reason),
                _ => format!("{} bytes", task.payload_len),
            };
            let mut row = vec![link, time(task.due, now), task.attempts.to_string(), last];
            if let (Some(csrf), TaskState::Dead { .. }) = (redrive, &task.state) {
                let fields = format!(
                    "<input type=hidden name=id value=\"{}\">\
                     <input type=hidden name=back value=dead>",
                    escape(task.id.as_str())
                );
                row.push(action(
                    base,
                    csrf,
                    "/actions/redrive",
                    &fields,
                    "Redrive",
                    false,
                ));
            }
            row
        })
        .collect();
    let mut head = vec!["id", "due", "attempts", last];
    if redrive.is_some() && filter == TaskFilter::Dead {
        head.push("");
    }
    table(id, &head, &rows)
}

fn filter_of(state: &str) -> Option<(TaskFilter, Tab, &'static str)> {
    match state {
        "pending" => Some((TaskFilter::Pending, Tab::Pending, "Pending")),
        "in-flight" => Some((TaskFilter::InFlight, Tab::InFlight, "In flight")),
        "dead" => Some((TaskFilter::Dead, Tab::Dead, "Dead letters")),
        _ => None,
    }
}

/// The `cursor` and `limit` of a paged list.
fn paging(query: &HashMap<String, String>) -> Result<(Option<Cursor>, usize), Failure> {
    let cursor = match query.get("cursor").filter(|c| !c.is_empty()) {
        Some(text) => Some(text.parse::<Cursor>().map_err(|_| {
            Failure::BadRequest(format!(
                "{text:?} is not a cursor (follow the board's own links)"
            ))
        })?),
        None => None,
    };
    let limit = match query.get("limit") {
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=PAGE_MAX).contains(n))
            .ok_or_else(|| {
                Failure::BadRequest(format!("limit must be a number from 1 to {PAGE_MAX}"))
            })?,
        None => PAGE,
    };
    Ok((cursor, limit))
}

/// The "next page" link, if there is one.
fn next_link(base: &str, path: &str, next: Option<&Cursor>, limit: usize) -> String {
    let limit = if limit == PAGE {
        String::new()
    } else {
        format!("&limit={limit}")
    };
    match next {
        Some(cursor) => format!(
            "<p><a id=next-page href=\"{}?cursor={}{limit}\">Next page →</a></p>",
            href(base, path),
            query_value(&cursor.to_string())
        ),
        None => "<p class=muted id=end-of-list>End of the list.</p>".to_owned(),
    }
}

/// `/tasks/{pending|in-flight|dead}?cursor=…&limit=…`: one page of a list.
pub(super) async fn list(
    State(board): State<Arc<Board>>,
    ctx: Ctx,
    Path(state): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let Some((filter, tab, heading)) = filter_of(&state) else {
        return not_found(State(board), ctx).await;
    };
    let read = async {
        let (cursor, limit) = paging(&query)?;
        let page = board
            .call(board.looking.list_page(filter, cursor.as_ref(), limit))
            .await?;
        Ok::<_, Failure>((page, limit, cursor.is_some()))
    };
    let (page, limit, paged) = match read.await {
        Ok(read) => read,
        Err(failure) => return failure.page(&board, &ctx),
    };
    let base = &ctx.base;
    let path = format!("/tasks/{state}");
    let mut body = String::new();
    if paged {
        let _ = write!(
            body,
            "<p><a id=first-page href=\"{}\">← First page</a></p>",
            href(base, &path)
        );
    }
    let redrive = (!board.read_only).then_some(board.csrf.as_str());
    body.push_str(&task_rows(
        "tasks",
        &page.items,
        filter,
        base,
        SystemTime::now(),
        redrive,
    ));
    body.push_str(&next_link(base, &path, page.next.as_ref(), limit));
    ok(html::page(&ctx.frame(&board), tab, heading, &body))
}

/// `/task?id=…`: one task (what search by id lands on), with its payload and actions.
pub(super) async fn task(
    State(board): State<Arc<Board>>,
    ctx: Ctx,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let Some(given) = query.get("id").filter(|id| !id.trim().is_empty()) else {
        return Failure::BadRequest("give a task's id to search for".into()).page(&board, &ctx);
    };
    let mut id = TaskId::from(given.as_str());
    let read = async {
        let mut info = board.call(board.looking.get(&id)).await?;
        // Typed into the search box with a stray space: the id as written first (an id may
        // hold spaces at its ends), then trimmed.
        if info.is_none() && given.trim() != given {
            id = TaskId::from(given.trim());
            info = board.call(board.looking.get(&id)).await?;
        }
        let payload = match &info {
            Some(_) => board.call(board.looking.payload(&id)).await?,
            None => None,
        };
        Ok::<_, Failure>((info, payload))
    };
    let (info, payload) = match read.await {
        Ok(read) => read,
        Err(failure) => return failure.page(&board, &ctx),
    };
    let frame = ctx.frame(&board);
    let Some(info) = info else {
        let body = format!(
            "<p id=not-found>No task has the id <code>{}</code> (it may have been acked, \
             cancelled or purged).</p>",
            escape(id.as_str())
        );
        let page = html::page(&frame, Tab::Task, "Not found", &body);
        return (StatusCode::NOT_FOUND, Html(page)).into_response();
    };
    let now = SystemTime::now();
    let (state, extra) = match &info.state {
        TaskState::Pending => ("pending", Vec::new()),
        TaskState::InFlight {
            attempt,
            lease_until,
        } => (
            "in flight",
            vec![
                ("attempt", attempt.to_string()),
                ("lease ends", time(*lease_until, now)),
            ],
        ),
        TaskState::Dead { reason } => ("dead", vec![("reason", escape(reason))]),
    };
    let mut rows = vec![
        ("id", format!("<code>{}</code>", escape(id.as_str()))),
        ("state", format!("<span id=task-state>{state}</span>")),
        ("due", time(info.due, now)),
        ("attempts", info.attempts.to_string()),
        ("payload", format!("{} bytes", info.payload_len)),
    ];
    rows.extend(extra);
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|(k, v)| vec![k.to_owned(), v])
        .collect();
    let mut body = table("task", &["", ""], &rows);
    if !board.read_only {
        body.push_str(&task_actions(&ctx.base, &board.csrf, &id, &info.state));
    }
    body.push_str("<h2>Payload</h2>");
    body.push_str(&match payload {
        Some(bytes) => html::payload(&bytes),
        None => "<p class=muted>The payload is gone (the task finished meanwhile).</p>".into(),
    });
    ok(html::page(&frame, Tab::Task, "Task", &body))
}

/// The actions a task in `state` allows.
fn task_actions(base: &str, csrf: &str, id: &TaskId, state: &TaskState) -> String {
    let id_field = format!(
        "<input type=hidden name=id value=\"{}\">",
        escape(id.as_str())
    );
    match state {
        TaskState::Pending => {
            let reschedule = format!(
                "{id_field}<label>due <input name=when size=22 required aria-label=\"due\" \
                 placeholder=\"10m, or 2026-12-01T09:00:00Z\"></label>"
            );
            action(base, csrf, "/actions/cancel", &id_field, "Cancel", true)
                + &action(
                    base,
                    csrf,
                    "/actions/reschedule",
                    &reschedule,
                    "Reschedule",
                    false,
                )
        }
        TaskState::Dead { .. } => action(
            base,
            csrf,
            "/actions/redrive",
            &id_field,
            "Redrive (pending, due now)",
            false,
        ),
        _ => "<p class=muted>In flight: its worker finishes it; if the worker is gone, the \
              lease running out brings it back.</p>"
            .to_owned(),
    }
}

/// `/recurring?cursor=…`: the recurring schedules, each with a cancel.
pub(super) async fn recurring(
    State(board): State<Arc<Board>>,
    ctx: Ctx,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let read = async {
        let (cursor, limit) = paging(&query)?;
        let page = board
            .call(board.looking.recurring_page(cursor.as_ref(), limit))
            .await?;
        Ok::<_, Failure>((page, limit))
    };
    let (page, limit) = match read.await {
        Ok(read) => read,
        Err(failure) => return failure.page(&board, &ctx),
    };
    let base = &ctx.base;
    let now = SystemTime::now();
    let mut body = if page.items.is_empty() {
        "<p class=muted id=schedules>No recurring schedules.</p>".to_owned()
    } else {
        let mut head = vec!["id", "schedule", "next", "missed", "payload"];
        if !board.read_only {
            head.push("");
        }
        let rows: Vec<Vec<String>> = page
            .items
            .iter()
            .map(|item| {
                let schedule = match &item.kind {
                    RecurringKind::Every(period) => format!("every {}", short(*period)),
                    RecurringKind::Cron(expression) => {
                        format!("cron <code>{}</code>", escape(expression))
                    }
                };
                let catch_up = match item.catch_up {
                    CatchUp::All => "each delivered",
                    _ => "the latest delivered",
                };
                let mut row = vec![
                    escape(item.id.as_str()),
                    schedule,
                    time(item.next, now),
                    catch_up.to_owned(),
                    format!("{} bytes", item.payload_len),
                ];
                if !board.read_only {
                    let id = format!(
                        "<input type=hidden name=id value=\"{}\">",
                        escape(item.id.as_str())
                    );
                    row.push(action(
                        base,
                        &board.csrf,
                        "/actions/cancel-recurring",
                        &id,
                        "Cancel",
                        true,
                    ));
                }
                row
            })
            .collect();
        table("schedules", &head, &rows)
    };
    body.push_str(&next_link(base, "/recurring", page.next.as_ref(), limit));
    ok(html::page(
        &ctx.frame(&board),
        Tab::Recurring,
        "Recurring schedules",
        &body,
    ))
}

/// Any other address.
pub(super) async fn not_found(State(board): State<Arc<Board>>, ctx: Ctx) -> Response {
    let body = format!(
        "<p>There is no such page. <a href=\"{}\">Overview</a></p>",
        href(&ctx.base, "")
    );
    let page = html::page(&ctx.frame(&board), Tab::Task, "Not found", &body);
    (StatusCode::NOT_FOUND, Html(page)).into_response()
}
