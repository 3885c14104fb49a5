//! A real browser for the board's tests: Debian's `chromium`, driven through its
//! `chromedriver` (WebDriver) by fantoccini. One chromedriver per test, on a free port;
//! headless, with the flags this closed network needs.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;

use super::redis_server::skip_or_fail;

pub struct Driver {
    child: Child,
    port: u16,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn found(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Starts chromedriver, or explains what is missing (a failure in CI: `apt-get install -y
/// chromium chromium-driver`).
pub fn start() -> Option<Driver> {
    if !found("chromedriver") || !found("chromium") {
        skip_or_fail(
            "the board's browser tests need chromium and chromedriver (apt-get install -y chromium chromium-driver)",
        );
        return None;
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "chromedriver did not listen within 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(Driver {
        child,
        port,
        _profile: tempfile::tempdir().unwrap(),
    })
}

impl Driver {
    /// A fresh headless browser session (its own profile, so its own cookies).
    pub async fn session(&self) -> Client {
        let profile = tempfile::tempdir().unwrap().keep();
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,1000",
            &format!("--user-data-dir={}", profile.display()),
        ];
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({ "binary": "/usr/bin/chromium", "args": args }),
        );
        ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .expect("a chromium session through chromedriver")
    }
}

/// The text of the first element `css` selects.
pub async fn text(client: &Client, css: &str) -> String {
    match client.find(Locator::Css(css)).await {
        Ok(element) => element.text().await.unwrap(),
        Err(e) => panic!(
            "no {css} on {:?}: {e}\n{}",
            client.current_url().await,
            client.source().await.unwrap_or_default()
        ),
    }
}

/// How many elements `css` selects.
pub async fn count(client: &Client, css: &str) -> usize {
    client.find_all(Locator::Css(css)).await.unwrap().len()
}

/// Clicks the submit button of the form `css` selects, as a person would, and waits until
/// the browser has left the page.
pub async fn press(client: &Client, form_css: &str) {
    let page = client.find(Locator::Css("html")).await.unwrap();
    click(client, form_css).await;
    let started = Instant::now();
    // The old page's root goes stale once the next page replaced it.
    while page.tag_name().await.is_ok() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "pressing {form_css} led nowhere"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Clicks the submit button of the form `css` selects, without waiting for a next page.
pub async fn click(client: &Client, form_css: &str) {
    let button = format!("{form_css} button[type=submit]");
    client
        .find(Locator::Css(&button))
        .await
        .unwrap_or_else(|e| panic!("no {button}: {e}"))
        .click()
        .await
        .unwrap();
}

/// Ticks the "I mean it" box of the form `css` selects.
pub async fn tick(client: &Client, form_css: &str) {
    let box_css = format!("{form_css} input[name=confirm]");
    client
        .find(Locator::Css(&box_css))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// Types `text` into the field named `name` of the form `css` selects (clearing it first).
pub async fn type_into(client: &Client, form_css: &str, name: &str, text: &str) {
    let field_css = format!("{form_css} input[name={name}]");
    let field = client.find(Locator::Css(&field_css)).await.unwrap();
    field.clear().await.unwrap();
    field.send_keys(text).await.unwrap();
}
