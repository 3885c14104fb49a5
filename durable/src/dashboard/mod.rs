//! The board: a web dashboard for a queue (feature `dashboard`), what asynqmon, bull-board
//! and Sidekiq's Web UI are for theirs.
//!
//! ```no_run
//! # async fn serve(queue: tokio_wheel_durable::DurableQueue) -> std::io::Result<()> {
//! // Mounted inside an app's own axum server: the board lives under /queue.
//! let app = axum::Router::new().nest("/queue", tokio_wheel_durable::dashboard::router(queue));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await
//! # }
//! ```
//!
//! Or on its own: `twq --redis URL --queue NAME dashboard` (feature `cli`).
//!
//! # Pages
//!
//! - **Overview** (`/`): how many tasks wait, are in flight and are dead; the counters; how
//!   late deliveries are (p50 / p99); a chart of deliveries and failures a minute over the
//!   last hour; the next tasks due and the first dead letters with their reasons; pause /
//!   resume, redrive all, purge.
//! - **Lists** (`/tasks/pending`, `/tasks/in-flight`, `/tasks/dead`): pages of tasks in
//!   one state, paged by the same [`Cursor`](crate::Cursor) as
//!   [`DurableQueue::list_page`].
//! - **Search by id** and the **task page** (`/task?id=…`): state, due time, attempts, lease
//!   end, reason, and the payload (as text when it is UTF-8, else as a hex dump); cancel,
//!   reschedule, redrive.
//! - **Recurring schedules** (`/recurring`), each with a cancel.
//!
//! # Safety
//!
//! - **No script at all.** Pages are HTML rendered on the server (the chart is inline SVG);
//!   every response forbids scripts through its Content-Security-Policy, and everything that
//!   came from the store is escaped, so a payload holding markup is shown as text.
//! - **Actions are POSTs with an anti-forgery token** (a random secret per board, checked in
//!   constant time; a cross-site request is refused whatever it carries). A destructive one
//!   (cancel, redrive all, purge) must be confirmed by a tick. Each action is logged
//!   (`tracing`, target `tokio_wheel_durable::dashboard`) and answered with what it did.
//! - [`Dashboard::read_only`] shows no action and refuses every POST (403).
//! - [`Dashboard::token`]: every request must carry the token, as `Authorization: Bearer`,
//!   or once as `?token=…` (the board then sets a cookie and sends the browser on without it).
//! - Looking writes nothing: with [`Dashboard::act_through`], the pages read through one
//!   handle (a read-only one, [`Builder::read_only`](crate::Builder)) and the handle that
//!   writes is opened at the first action.
//!
//! # Cost
//!
//! A page is one or two bounded store calls (a list page is one
//! [`list_page`](DurableQueue::list_page) of at most 500; the overview is a
//! [`stats`](DurableQueue::stats) and two pages of 5), so pages stay fast with millions of
//! tasks. The chart's counters are read every [`Dashboard::sample_every`] (10 s) while the
//! board lives.

mod actions;
mod chart;
mod guard;
mod html;
mod pages;

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::routing::{get, post};
use tokio::sync::OnceCell;

use crate::{DurableQueue, Error};

use self::chart::History;

/// The board for `queue`, with the defaults of [`Dashboard::new`]: actions on, no token.
/// Mount it with [`axum::Router::nest`] or serve it as it is.
pub fn router(queue: DurableQueue) -> Router {
    Dashboard::new(queue).router()
}

type Opener = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<DurableQueue, Error>> + Send>> + Send + Sync,
>;

/// A board with its settings; [`router`](Dashboard::router) makes the axum router.
///
/// ```no_run
/// # use std::time::Duration;
/// # use tokio_wheel_durable::{DurableQueue, dashboard::Dashboard};
/// # fn board(queue: DurableQueue) -> axum::Router {
/// Dashboard::new(queue)
///     .title("orders")
///     .token(std::env::var("BOARD_TOKEN").unwrap())
///     .sample_every(Duration::from_secs(30))
///     .router()
/// # }
/// ```
pub struct Dashboard {
    queue: DurableQueue,
    opener: Option<Opener>,
    read_only: bool,
    token: Option<String>,
    title: String,
    sample_every: Duration,
    call_timeout: Duration,
    hidden: Vec<String>,
    local_only: bool,
}

impl fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dashboard")
            .field("read_only", &self.read_only)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("title", &self.title)
            .field("act_through", &self.opener.is_some())
            .field("sample_every", &self.sample_every)
            .field("call_timeout", &self.call_timeout)
            .field("hidden", &self.hidden.len())
            .field("local_only", &self.local_only)
            .finish_non_exhaustive()
    }
}

impl Dashboard {
    /// A board on `queue`: pages and actions through it, titled "queue", no token, the
    /// counters read every 10 s, each store call given up on after 5 s.
    pub fn new(queue: DurableQueue) -> Dashboard {
        Dashboard {
            queue,
            opener: None,
            read_only: false,
            token: None,
            title: "queue".to_owned(),
            sample_every: Duration::from_secs(10),
            call_timeout: Duration::from_secs(5),
            hidden: Vec::new(),
            local_only: false,
        }
    }

    /// No action is shown and every POST is refused with 403.
    pub fn read_only(mut self, on: bool) -> Dashboard {
        self.read_only = on;
        self
    }

    /// Every request must carry `token`: an `Authorization: Bearer` header, the cookie the
    /// board sets, or a `?token=` query (which the board turns into that cookie). Compared in
    /// constant time.
    ///
    /// # Panics
    ///
    /// If `token` is empty.
    pub fn token(mut self, token: impl Into<String>) -> Dashboard {
        let token = token.into();
        assert!(!token.is_empty(), "a board's token must not be empty");
        self.token = Some(token);
        self
    }

    /// The name shown at the top of every page (the queue's name, say). Never show a URL
    /// holding a password here.
    pub fn title(mut self, title: impl Into<String>) -> Dashboard {
        self.title = title.into();
        self
    }

    /// Actions go through the handle `open` returns, opened at the first action and kept;
    /// the pages go on reading through the board's own handle. With a read-only handle for
    /// the pages ([`Builder::read_only`](crate::Builder)), looking at the board writes
    /// nothing to the store until an action is taken.
    pub fn act_through<F, Fut>(mut self, open: F) -> Dashboard
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<DurableQueue, Error>> + Send + 'static,
    {
        self.opener = Some(Arc::new(move || Box::pin(open())));
        self
    }

    /// How often the chart's counters are read (default 10 s; at least 100 ms).
    pub fn sample_every(mut self, period: Duration) -> Dashboard {
        self.sample_every = period.max(Duration::from_millis(100));
        self
    }

    /// How long a page or an action waits for the store before it answers 504 (default 5 s).
    pub fn call_timeout(mut self, timeout: Duration) -> Dashboard {
        self.call_timeout = timeout;
        self
    }

    /// Never shows `secret` (a Redis password, say): wherever it would appear in a page — a
    /// payload, a reason, an error message — it shows as `***`. May be called more than once.
    pub fn hide(mut self, secret: impl Into<String>) -> Dashboard {
        let secret = secret.into();
        if !secret.is_empty() {
            self.hidden.push(secret);
        }
        self
    }

    /// Answers only requests addressed to this machine by a loopback name (`Host` of
    /// `localhost`, `127.0.0.1` or `[::1]`, any port); any other gets 421. For a board on
    /// loopback without a token: a web page elsewhere that points its own name at
    /// 127.0.0.1 (DNS rebinding) would otherwise be same-origin with the board. `twq
    /// dashboard` turns it on when it listens on loopback without `--token-file`.
    pub fn local_only(mut self, on: bool) -> Dashboard {
        self.local_only = on;
        self
    }

    /// The axum router serving the board. Its links are relative to where it is mounted
    /// (`Router::nest`), so it works at the root or under any prefix.
    pub fn router(self) -> Router {
        let board = Arc::new(Board {
            looking: self.queue,
            acting: OnceCell::new(),
            opener: self.opener,
            read_only: self.read_only,
            token: self.token,
            csrf: guard::random_secret(),
            title: self.title,
            history: Mutex::new(History::default()),
            sampling: AtomicBool::new(false),
            sample_every: self.sample_every,
            call_timeout: self.call_timeout,
            paused: AtomicBool::new(false),
            notices: Mutex::new(VecDeque::new()),
            next_notice: AtomicU64::new(1),
            hidden: hidden_forms(self.hidden),
            local_only: self.local_only,
        });
        // Inside a runtime (as an app builds its router), the chart starts counting now;
        // else at the first request.
        if tokio::runtime::Handle::try_current().is_ok() {
            board.start_sampling();
        }
        Router::new()
            .route("/", get(pages::overview))
            .route("/tasks/{state}", get(pages::list))
            .route("/task", get(pages::task))
            .route("/recurring", get(pages::recurring))
            .route("/actions/{action}", post(actions::act))
            .fallback(pages::not_found)
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(&board),
                guard::guard,
            ))
            .with_state(board)
    }
}

/// What the handlers share.
pub(super) struct Board {
    looking: DurableQueue,
    acting: OnceCell<DurableQueue>,
    opener: Option<Opener>,
    read_only: bool,
    token: Option<String>,
    /// The anti-forgery token every action's form carries.
    csrf: String,
    title: String,
    history: Mutex<History>,
    sampling: AtomicBool,
    sample_every: Duration,
    call_timeout: Duration,
    /// As last read (by the sampler, the overview or an action): shown on every page
    /// without a store call of its own.
    paused: AtomicBool,
    /// The outcomes of recent actions, shown once the browser follows the redirect.
    notices: Mutex<VecDeque<(u64, String)>>,
    next_notice: AtomicU64,
    /// The secrets never shown, as written and as a page writes them (escaped), longest
    /// first.
    hidden: Vec<String>,
    local_only: bool,
}

/// Each secret as written and HTML-escaped (how a page would show it), longest first, so a
/// longer secret is masked before one it contains.
fn hidden_forms(secrets: Vec<String>) -> Vec<String> {
    let mut forms: Vec<String> = secrets
        .iter()
        .flat_map(|secret| [secret.clone(), html::escape(secret)])
        .collect();
    forms.sort_by_key(|form| std::cmp::Reverse(form.len()));
    forms.dedup();
    forms
}

/// How many action outcomes the board remembers for their redirects.
const NOTICES: usize = 256;

impl Board {
    /// The handle actions go through (opened at the first action, with `act_through`).
    async fn acting(&self) -> Result<&DurableQueue, Error> {
        match &self.opener {
            None => Ok(&self.looking),
            Some(open) => self.acting.get_or_try_init(|| open()).await,
        }
    }

    /// `call`, given up on after the call timeout.
    async fn call<T>(
        &self,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, pages::Failure> {
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(pages::Failure::Store(error)),
            Err(_) => Err(pages::Failure::Timeout(self.call_timeout)),
        }
    }

    /// Starts reading the counters for the chart, once per board; the reader ends with
    /// the board.
    fn start_sampling(self: &Arc<Board>) {
        if self.sampling.swap(true, Ordering::AcqRel) {
            return;
        }
        let board: Weak<Board> = Arc::downgrade(self);
        let every = self.sample_every;
        tokio::spawn(async move {
            loop {
                let Some(live) = board.upgrade() else { return };
                let read = tokio::time::timeout(live.call_timeout, live.looking.stats()).await;
                if let Ok(Ok(stats)) = read {
                    live.paused.store(stats.paused, Ordering::Relaxed);
                    lock(&live.history).record(SystemTime::now(), &stats);
                }
                drop(live);
                tokio::time::sleep(every).await;
            }
        });
    }

    /// Keeps `text` for the page the browser is sent to; returns its number.
    fn notice(&self, text: String) -> u64 {
        let id = self.next_notice.fetch_add(1, Ordering::Relaxed);
        let mut notices = lock(&self.notices);
        if notices.len() == NOTICES {
            notices.pop_front();
        }
        notices.push_back((id, text));
        id
    }

    fn notice_text(&self, id: u64) -> Option<String> {
        lock(&self.notices)
            .iter()
            .find(|(n, _)| *n == id)
            .map(|(_, text)| text.clone())
    }
}

/// A lock whose holder never panics while holding it; a poisoned one is still usable.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
