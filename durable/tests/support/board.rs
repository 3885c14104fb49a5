//! What the board's tests share: asking the board's router (in-process, a panic reported as
//! status 599), reading its pages (the notice, the listed ids, the next page), and making
//! tasks in a given state.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel_durable::{DurableQueue, Task, TaskId, TaskState};
use tower::ServiceExt;

pub struct Reply {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: String,
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body: String = self.body.chars().take(3000).collect();
        write!(f, "{} {:?}\n{}", self.status, self.headers, body)
    }
}

/// Status of an answer that never came: the handler panicked (a browser sees the connection
/// dropped).
pub const PANICKED: u16 = 599;

pub async fn send(app: &Router, request: Request<Body>) -> Reply {
    let app = app.clone();
    let response = match tokio::spawn(async move { app.oneshot(request).await }).await {
        Ok(response) => response.unwrap(),
        Err(e) => {
            return Reply {
                status: StatusCode::from_u16(PANICKED).unwrap(),
                headers: Default::default(),
                body: format!("the handler panicked: {e}"),
            };
        }
    };
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

pub async fn get(app: &Router, path: &str) -> Reply {
    send(app, Request::get(path).body(Body::empty()).unwrap()).await
}

pub async fn post(app: &Router, path: &str, form: &str) -> Reply {
    let request = Request::post(path)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(form.to_owned()))
        .unwrap();
    send(app, request).await
}

/// The anti-forgery token a page's forms carry.
pub fn csrf(page: &str) -> String {
    let start = page.find("name=csrf value=\"").expect("a form") + "name=csrf value=\"".len();
    let end = page[start..].find('"').unwrap() + start;
    page[start..end].to_owned()
}

/// Percent-encodes everything but unreserved characters.
pub fn enc(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

pub async fn open_file(dir: &tempfile::TempDir, wheel: &Wheel) -> DurableQueue {
    DurableQueue::open(dir.path().join("tasks.redb"), wheel)
        .await
        .unwrap()
}

/// Makes `id` a dead letter with `reason`.
pub async fn dead_letter(queue: &DurableQueue, id: &str, reason: &str) {
    queue.schedule(Task::new(id).id(id)).await.unwrap();
    let mut deliveries = queue.deliveries();
    let delivery = tokio::time::timeout(Duration::from_secs(30), deliveries.next())
        .await
        .expect("the due task is delivered")
        .unwrap();
    assert_eq!(delivery.id().as_str(), id);
    delivery.fail(reason).await.unwrap();
}

pub async fn state_of(queue: &DurableQueue, id: &str) -> Option<TaskState> {
    queue
        .get(&TaskId::from(id))
        .await
        .unwrap()
        .map(|info| info.state)
}

pub const MARKUP: &str =
    "\"'><script>document.title='pwned'</script></pre></textarea><b id=injected>x</b>&amp;";

/// Serves a board on a loopback port (in this process): its base URL.
pub async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}")
}

// ---------------------------------------------------------------------------------------
// Reading pages.

pub fn unescape(text: &str) -> String {
    text.replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

pub fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else if bytes[i] == b'+' {
            out.push(b' ');
            i += 1;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// Every `after…"` value on the page.
pub fn all_after(page: &str, marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = page;
    while let Some(start) = rest.find(marker) {
        rest = &rest[start + marker.len()..];
        let end = rest.find('"').unwrap();
        found.push(rest[..end].to_owned());
        rest = &rest[end..];
    }
    found
}

/// The ids of the task links of a list page (inside `<table id=tasks>`).
pub fn listed_ids(page: &str) -> Vec<String> {
    let table = &page[page.find("<table id=tasks>").map_or(page.len(), |s| s)..];
    all_after(table, "class=task-link href=\"")
        .into_iter()
        .map(|href| {
            let href = unescape(&href);
            let query = &href[href.find("id=").unwrap() + 3..];
            percent_decode(query.split('&').next().unwrap())
        })
        .collect()
}

/// The ids of the schedules on the recurring page (their cancel forms).
pub fn schedule_ids(page: &str) -> Vec<String> {
    page.split("actions-cancel-recurring")
        .skip(1)
        .map(|form| unescape(&all_after(form, "name=id value=\"")[0]))
        .collect()
}

pub fn next_page(page: &str) -> Option<String> {
    all_after(page, "id=next-page href=\"")
        .first()
        .map(|href| unescape(href))
}

/// The notice (or error) text on a page.
pub fn said(page: &str) -> String {
    for marker in ["id=notice role=status>", "id=error>"] {
        if let Some(start) = page.find(marker) {
            let rest = &page[start + marker.len()..];
            return unescape(&rest[..rest.find('<').unwrap()]);
        }
    }
    String::new()
}

/// POSTs an action with the board's token and follows its redirect: (status, what the page
/// it lands on says).
pub async fn act(app: &Router, token: &str, path: &str, form: &str) -> (StatusCode, String) {
    let reply = post(app, path, &format!("csrf={token}&{form}")).await;
    if reply.status == StatusCode::SEE_OTHER {
        let location = reply.headers[header::LOCATION].to_str().unwrap().to_owned();
        let landed = get(app, &location).await;
        (reply.status, said(&landed.body))
    } else {
        (reply.status, said(&reply.body))
    }
}

/// Follows the board's next-page links from `first`: every id listed, in order.
pub async fn page_through(app: &Router, first: &str, recurring: bool) -> Vec<String> {
    let mut ids = Vec::new();
    let mut path = Some(first.to_owned());
    let mut pages = 0;
    while let Some(at) = path {
        let page = get(app, &at).await;
        assert_eq!(page.status, StatusCode::OK, "{at}: {page:?}");
        ids.extend(if recurring {
            schedule_ids(&page.body)
        } else {
            listed_ids(&page.body)
        });
        path = next_page(&page.body);
        pages += 1;
        assert!(pages < 200, "paging never ends at {at}");
    }
    ids
}
