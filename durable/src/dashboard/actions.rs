//! The actions: each a POST carrying the anti-forgery token, answered by a redirect to the
//! page it concerns, where the outcome is shown.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use axum::extract::{Form, Path, State};
use axum::http::StatusCode;
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::Board;
use super::guard::{cross_site, same_secret};
use super::html::{href, query_value};
use super::pages::{Ctx, Failure};
use crate::units::{after_now, parse_duration, parse_time, rfc3339, short};
use crate::{DurableQueue, TaskFilter, TaskId, TaskState};

/// How many dead letters one press of "redrive all" moves (the rest wait for the next press).
const REDRIVE_ALL_MAX: usize = 10_000;

/// `POST /actions/{action}`.
pub(super) async fn act(
    State(board): State<Arc<Board>>,
    ctx: Ctx,
    Path(action): Path<String>,
    headers: HeaderMap,
    Form(form): Form<HashMap<String, String>>,
) -> Response {
    if board.read_only {
        return Failure::Forbidden("this board is read-only: it takes no action".into())
            .page(&board, &ctx);
    }
    let token = form.get("csrf").map(String::as_str).unwrap_or_default();
    if !same_secret(token, &board.csrf) || cross_site(&headers) {
        tracing::warn!(
            target: "tokio_wheel_durable::dashboard",
            action = %action,
            "board action refused: no valid anti-forgery token, or sent from another site"
        );
        return Failure::Forbidden(
            "the form's anti-forgery token is missing or stale (reload the page and try again)"
                .into(),
        )
        .page(&board, &ctx);
    }
    match perform(&board, &action, &form).await {
        Ok((text, to)) => {
            tracing::info!(target: "tokio_wheel_durable::dashboard", action = %action, "{text}");
            let notice = board.notice(text);
            let separator = if to.contains('?') { '&' } else { '?' };
            let location = format!("{}{separator}notice={notice}", href(&ctx.base, &to));
            let mut response = StatusCode::SEE_OTHER.into_response();
            if let Ok(location) = HeaderValue::from_str(&location) {
                response.headers_mut().insert(header::LOCATION, location);
            }
            response
        }
        Err(failure) => {
            tracing::warn!(
                target: "tokio_wheel_durable::dashboard",
                action = %action,
                failure = ?failure,
                "board action not done"
            );
            failure.page(&board, &ctx)
        }
    }
}

/// Does `action`; answers what it did and where to show it.
async fn perform(
    board: &Board,
    action: &str,
    form: &HashMap<String, String>,
) -> Result<(String, String), Failure> {
    let confirmed = form.get("confirm").is_some_and(|v| v == "yes");
    let needs_confirm = matches!(
        action,
        "cancel" | "redrive-all" | "purge" | "cancel-recurring"
    );
    if needs_confirm && !confirmed {
        return Err(Failure::BadRequest(
            "not done: tick \"I mean it\" to confirm".into(),
        ));
    }
    let id = || {
        form.get("id")
            .map(|id| TaskId::from(id.as_str()))
            .filter(|id| !id.as_str().is_empty())
            .ok_or_else(|| Failure::BadRequest("no task id given".into()))
    };
    let task_page = |id: &TaskId| format!("/task?id={}", query_value(id.as_str()));
    let queue = board.call(board.acting()).await?;
    match action {
        "cancel" => {
            let id = id()?;
            let done = board.call(queue.cancel(&id)).await?;
            let text = if done {
                format!("Cancelled task {}.", id.as_str())
            } else {
                not_done(board, queue, &id, "cancelled").await
            };
            Ok((text, task_page(&id)))
        }
        "reschedule" => {
            let id = id()?;
            let when = form.get("when").map(|w| w.trim()).unwrap_or_default();
            let at = match parse_duration(when) {
                Ok(after) => after_now(SystemTime::now(), after).map_err(Failure::BadRequest)?,
                Err(_) => parse_time(when).map_err(|_| {
                    Failure::BadRequest(format!(
                        "{when:?} is neither a duration from now (10m, 1h30m) nor a time \
                         (RFC 3339, e.g. 2026-12-01T09:00:00Z)"
                    ))
                })?,
            };
            let done = board.call(queue.reschedule(&id, at)).await?;
            let text = if done {
                format!("Task {} is now due at {}.", id.as_str(), rfc3339(at, false))
            } else {
                not_done(board, queue, &id, "rescheduled").await
            };
            Ok((text, task_page(&id)))
        }
        "redrive" => {
            let id = id()?;
            let done = board.call(queue.redrive(&id)).await?;
            let text = if done {
                format!("Task {} is pending again, due now.", id.as_str())
            } else {
                format!(
                    "Task {} was not a dead letter: nothing redriven.",
                    id.as_str()
                )
            };
            // From the dead list's own button: back to the list (one known place, never an
            // address taken from the form).
            let back = if form.get("back").is_some_and(|b| b == "dead") {
                "/tasks/dead".to_owned()
            } else {
                task_page(&id)
            };
            Ok((text, back))
        }
        "redrive-all" => {
            let moved = redrive_all(board, queue).await?;
            let left = board.call(queue.stats()).await?.dead;
            let mut text = format!("Moved {moved} dead letters back to pending, due now.");
            if left > 0 {
                text.push_str(&format!(" {left} are still dead (press again for more)."));
            }
            Ok((text, String::new()))
        }
        "purge" => {
            let text = form.get("older_than").map(|t| t.trim()).unwrap_or_default();
            let older_than = parse_duration(text).map_err(Failure::BadRequest)?;
            let purged = board.call(queue.purge_dead(older_than)).await?;
            Ok((
                format!(
                    "Purged {purged} dead letters that died more than {} ago.",
                    short(older_than)
                ),
                String::new(),
            ))
        }
        "pause" => {
            board.call(queue.pause()).await?;
            board.paused.store(true, Ordering::Relaxed);
            Ok((
                "Paused: no worker is handed a task until the queue is resumed.".to_owned(),
                String::new(),
            ))
        }
        "resume" => {
            board.call(queue.resume()).await?;
            board.paused.store(false, Ordering::Relaxed);
            Ok(("Resumed: workers claim again.".to_owned(), String::new()))
        }
        "cancel-recurring" => {
            let id = id()?;
            let done = board.call(queue.cancel_recurring(&id)).await?;
            let text = if done {
                format!("Cancelled the recurring schedule {}.", id.as_str())
            } else {
                format!("There was no recurring schedule {}.", id.as_str())
            };
            Ok((text, "/recurring".to_owned()))
        }
        other => Err(Failure::BadRequest(format!("no action {other:?}"))),
    }
}

/// Redrives dead letters a page at a time, at most [`REDRIVE_ALL_MAX`].
async fn redrive_all(board: &Board, queue: &DurableQueue) -> Result<usize, Failure> {
    let mut moved = 0;
    while moved < REDRIVE_ALL_MAX {
        let limit = (REDRIVE_ALL_MAX - moved).min(crate::PAGE_LIMIT);
        let page = board
            .call(queue.list_page(TaskFilter::Dead, None, limit))
            .await?;
        if page.items.is_empty() {
            break;
        }
        let mut this_page = 0;
        for task in &page.items {
            if board.call(queue.redrive(&task.id)).await? {
                this_page += 1;
            }
        }
        moved += this_page;
        // Every one taken meanwhile (by another operator): the next read would show them again.
        if this_page == 0 {
            break;
        }
    }
    Ok(moved)
}

/// Why a cancel or reschedule of `id` did nothing, from what the store holds now.
async fn not_done(board: &Board, queue: &DurableQueue, id: &TaskId, verb: &str) -> String {
    let id_text = id.as_str();
    match board.call(queue.get(id)).await {
        Ok(None) => format!("There is no task {id_text}: nothing {verb}."),
        Ok(Some(info)) => match info.state {
            TaskState::Pending => format!(
                "Task {id_text} is pending but was not {verb}: it is a recurring schedule \
                 (see Recurring schedules), or it moved meanwhile (try again)."
            ),
            TaskState::InFlight { .. } => format!(
                "Task {id_text} is in flight: it cannot be {verb} until its worker finishes it."
            ),
            TaskState::Dead { .. } => {
                format!("Task {id_text} is dead: it cannot be {verb} (redrive it first).")
            }
        },
        Err(_) => format!("Task {id_text} was not {verb}."),
    }
}
