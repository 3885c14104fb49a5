//! Who may connect to the Redis-shared queue. Each test starts its own `redis-server` on
//! loopback: with `requirepass`, with ACL users (one that may do everything, and three that
//! each lack one permission the queue needs), with TLS under a throwaway CA made with
//! `openssl` (what a write's return promises with replicas is in `redis_replicas.rs`). Refused credentials and untrusted certificates are [`Error::Denied`] at once,
//! never [`Error::Unreachable`] after the retry budget, and no password ever shows in an
//! error, a `Debug` output or a trace line (every test's traces, and the `log` records of the
//! redis crate, go to one captured buffer).
#![cfg(feature = "redis")]

mod support;

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use support::redis_server::{self, RedisServer};
use tokio_wheel::Wheel;
use tokio_wheel_durable::{Builder, DurableQueue, Error, Task};

/// A hang guard, not a figure: a call that never answers fails the test after this.
const HANG: Duration = Duration::from_secs(60);

// Distinctive, so a leak cannot hide behind a common word.
const REQUIREPASS: &str = "rq-Secret-4f1e9a";
const WRONG_PASSWORD: &str = "wrong-Secret-77c2b0";
const WORKER_PASSWORD: &str = "acl-Secret-0b93d5";
const LIMITED_PASSWORD: &str = "limited-Secret-e1a7";
const CHANGED_PASSWORD: &str = "changed-Secret-5d08c3";

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// Every trace line of this test binary — the crate's `tracing` events at every level and
/// the redis crate's `log` records — formatted into one buffer.
fn traces() -> &'static Mutex<Vec<u8>> {
    static TRACES: OnceLock<&'static Mutex<Vec<u8>>> = OnceLock::new();
    TRACES.get_or_init(|| {
        let buffer: &'static Mutex<Vec<u8>> = Box::leak(Box::new(Mutex::new(Vec::new())));
        use tracing_subscriber::util::SubscriberInitExt;
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || Capture(buffer))
            .finish()
            .try_init() // also routes `log` records here (tracing-log)
            .expect("the only subscriber of this test binary");
        buffer
    })
}

struct Capture(&'static Mutex<Vec<u8>>);

impl std::io::Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn captured() -> String {
    String::from_utf8_lossy(&traces().lock().unwrap()).into_owned()
}

/// No password of this file in the captured traces, nor in `shown` (errors and `Debug`
/// outputs the test formatted).
fn assert_no_password_in(shown: &[String]) {
    let traces = captured();
    for secret in [
        REQUIREPASS,
        WRONG_PASSWORD,
        WORKER_PASSWORD,
        LIMITED_PASSWORD,
        CHANGED_PASSWORD,
    ] {
        assert!(!traces.contains(secret), "a password is in the traces");
        for text in shown {
            assert!(!text.contains(secret), "a password is shown: {text}");
        }
    }
}

/// `redis://<userinfo>127.0.0.1:<port>/`, `userinfo` being e.g. `":pw@"` or `"user:pw@"`.
fn url_as(server: &RedisServer, userinfo: &str) -> String {
    format!("redis://{userinfo}127.0.0.1:{}/", server.port())
}

/// A plain connection, for looking at (or changing) a server from outside the queue.
fn raw(url: &str) -> redis::Connection {
    redis::Client::open(url).unwrap().get_connection().unwrap()
}

/// Opening as `who` fails as it should: denied, and said to be permanent (so nothing retries
/// it as if the server were away). Returns the error.
async fn denied(who: &str, builder: Builder, url: &str, name: &str, wheel: &Wheel) -> Error {
    let error = tokio::time::timeout(HANG, builder.redis(url, name, wheel))
        .await
        .unwrap_or_else(|_| panic!("{who}: no answer at all"))
        .expect_err(&format!("the server refuses {who}"));
    assert!(error.is_denied(), "{who}: {error:?}");
    assert!(!error.is_transient(), "{who}: {error:?}");
    error
}

/// Both ways an error is shown.
fn shown(error: &Error) -> [String; 2] {
    [format!("{error:?}"), format!("{error}")]
}

/// A task goes in, comes out with its payload, and is acked: the whole way through.
async fn round_trip(queue: &DurableQueue, id: &str) {
    let payload = format!("payload of {id}");
    queue
        .schedule(Task::new(payload.clone()).id(id).after(ms(20)))
        .await
        .unwrap();
    let mut deliveries = queue.deliveries();
    let delivery = tokio::time::timeout(HANG, deliveries.next())
        .await
        .expect("a delivery at all")
        .expect("the stream is open");
    assert_eq!(delivery.id().as_str(), id);
    assert_eq!(delivery.payload(), payload.as_bytes());
    delivery.ack().await.unwrap();
    assert_eq!(queue.len().await.unwrap(), 0);
}

/// `requirepass`: the password in the URL (`redis://:password@…`) is admitted the whole way;
/// a wrong one (WRONGPASS) and none at all (NOAUTH) are refused when the queue opens, at once.
#[tokio::test]
async fn requirepass_admits_the_password_and_denies_a_wrong_or_missing_one_at_once() {
    traces();
    let Some(server) = redis_server::start_with(&["--requirepass", REQUIREPASS]) else {
        return;
    };
    let wheel = Wheel::new();
    let builder = DurableQueue::builder();
    let queue = builder
        .clone()
        .redis(
            &url_as(&server, &format!(":{REQUIREPASS}@")),
            "pass",
            &wheel,
        )
        .await
        .expect("the right password is admitted");
    round_trip(&queue, "with-password").await;

    let wrong = denied(
        "a wrong password",
        builder.clone(),
        &url_as(&server, &format!(":{WRONG_PASSWORD}@")),
        "pass",
        &wheel,
    )
    .await;
    let missing = denied(
        "no password",
        builder.clone(),
        &server.url(),
        "pass",
        &wheel,
    )
    .await;
    assert!(
        format!("{missing}").contains("NOAUTH"),
        "says the server wants a password: {missing}"
    );
    let mut texts = vec![format!("{queue:?}"), format!("{builder:?}")];
    texts.extend(shown(&wrong));
    texts.extend(shown(&missing));
    assert_no_password_in(&texts);
}

/// The password changes under a running queue and its connections are dropped: the next
/// write is refused at once — not retried for 10 s as if the server were down, then reported
/// unreachable.
#[tokio::test]
async fn a_password_changed_under_a_running_queue_is_denied_at_once() {
    traces();
    let Some(server) = redis_server::start_with(&["--requirepass", REQUIREPASS]) else {
        return;
    };
    let url = url_as(&server, &format!(":{REQUIREPASS}@"));
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .redis(&url, "changed", &wheel)
        .await
        .unwrap();
    round_trip(&queue, "before-the-change").await;

    let mut admin = raw(&url);
    let () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", CHANGED_PASSWORD])
        .query(&mut admin)
        .unwrap();
    for kind in ["normal", "pubsub"] {
        let _: u64 = redis::cmd("CLIENT")
            .arg(&["KILL", "TYPE", kind])
            .query(&mut admin)
            .unwrap();
    }
    let error = tokio::time::timeout(HANG, queue.schedule(Task::new("x").id("after-the-change")))
        .await
        .expect("an answer at all")
        .expect_err("the old password is refused");
    assert!(error.is_denied(), "{error:?}");
    assert!(!error.is_transient(), "{error:?}");
    let mut texts = vec![format!("{queue:?}")];
    texts.extend(shown(&error));
    assert_no_password_in(&texts);
}

/// ACL users: one with every permission the queue needs, and four lacking one each — keys,
/// scripts, the wake channels (Redis 7 gives a new user no channels), or `TIME`, which the
/// scripts call for the server's clock (an outside attack found that one admitted at open and
/// refused at its first `schedule`, as an `Io` error). The limited ones are
/// refused when the queue opens, with the server's NOPERM, not later at some call (or never:
/// a worker that cannot subscribe would wait for wake-ups forever).
#[tokio::test]
async fn acl_users_are_admitted_by_password_and_one_lacking_a_permission_is_denied_at_open() {
    traces();
    let Some(server) = redis_server::start() else {
        return;
    };
    let mut admin = raw(&server.url());
    for (user, rules) in [
        ("worker", "~* &* +@all"),
        ("nokeys", "&* +@all"),
        ("noscripts", "~* &* +@all -eval -evalsha"),
        ("nochannels", "~* resetchannels +@all"),
        ("notime", "~* &* +@all -time"),
    ] {
        let password = if user == "worker" {
            WORKER_PASSWORD
        } else {
            LIMITED_PASSWORD
        };
        let mut command = redis::cmd("ACL");
        command.arg("SETUSER").arg(user).arg("reset").arg("on");
        command.arg(format!(">{password}"));
        command.arg(rules.split(' ').collect::<Vec<_>>());
        let () = command.query(&mut admin).unwrap();
    }
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .redis(
            &url_as(&server, &format!("worker:{WORKER_PASSWORD}@")),
            "acl",
            &wheel,
        )
        .await
        .expect("the ACL user is admitted");
    round_trip(&queue, "as-worker").await;

    let mut texts = vec![format!("{queue:?}")];
    for (who, userinfo) in [
        (
            "worker with a wrong password",
            format!("worker:{WRONG_PASSWORD}@"),
        ),
        ("an unknown user", format!("nobody:{WORKER_PASSWORD}@")),
    ] {
        let error = denied(
            who,
            Builder::default(),
            &url_as(&server, &userinfo),
            "acl",
            &wheel,
        )
        .await;
        texts.extend(shown(&error));
    }
    for (user, missing) in [
        ("nokeys", "keys"),
        ("noscripts", "evalsha"),
        ("nochannels", "channels"),
        ("notime", "time"),
    ] {
        let url = url_as(&server, &format!("{user}:{LIMITED_PASSWORD}@"));
        let error = denied(user, Builder::default(), &url, "acl", &wheel).await;
        let text = format!("{error}").to_lowercase();
        assert!(
            text.contains("noperm") && text.contains(missing),
            "{user}: says which permission is missing: {error}"
        );
        texts.extend(shown(&error));
    }
    assert_no_password_in(&texts);
}

/// A server at its client limit answers "ERR max number of clients reached" — also to
/// `AUTH`, which the redis crate reports as a failed password. That is a server that cannot
/// take one more client now: [`Error::Unreachable`] (transient), never [`Error::Denied`]; a
/// wrong password is still denied at once.
#[tokio::test]
async fn a_server_at_its_client_limit_is_unreachable_not_denied() {
    traces();
    let Some(server) =
        redis_server::start_with(&["--maxclients", "1", "--requirepass", REQUIREPASS])
    else {
        return;
    };
    let url = url_as(&server, &format!(":{REQUIREPASS}@"));
    // Hold the only client slot (the server's own start-up probe may still hold it a moment).
    // Tries until it gets the slot (a bounded number of tries, not a time limit).
    let held = (0..3_000)
        .find_map(|_| {
            let connection = redis::Client::open(url.as_str()).unwrap().get_connection();
            if let Ok(mut connection) = connection
                && redis::cmd("PING").query::<String>(&mut connection).is_ok()
            {
                return Some(connection);
            }
            std::thread::sleep(ms(20));
            None
        })
        .expect("the only client slot was never free");
    let wheel = Wheel::new();
    let error = DurableQueue::builder()
        .redis(&url, "full", &wheel)
        .await
        .expect_err("no slot for the queue");
    assert!(
        matches!(error, Error::Unreachable(_)) && error.is_transient(),
        "{error:?}"
    );
    drop(held);
    let wrong = url_as(&server, &format!(":{WRONG_PASSWORD}@"));
    denied(
        "a wrong password",
        Builder::default(),
        &wrong,
        "full",
        &wheel,
    )
    .await;
}

/// The same replies from a proxy that answers `AUTH` for the server, deterministically: a
/// client limit and each busy code (`LOADING`, `BUSY`, `MASTERDOWN`, `TRYAGAIN`) are
/// unreachable, a `WRONGPASS` is denied.
#[tokio::test]
async fn busy_replies_to_auth_are_unreachable_and_wrongpass_is_denied() {
    traces();
    let Some(server) = redis_server::start_with(&["--requirepass", REQUIREPASS]) else {
        return;
    };
    let proxy = support::proxy::Proxy::start(server.addr()).await;
    let url = proxy
        .url()
        .replace("redis://", &format!("redis://:{REQUIREPASS}@"));
    let wheel = Wheel::new();
    for busy in [
        "-ERR max number of clients reached",
        "-LOADING Redis is loading the dataset in memory",
        "-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
        "-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        "-TRYAGAIN Multiple keys request during rehashing of slot",
    ] {
        proxy.disarm();
        proxy.inject("AUTH", support::proxy::Fault::Answer(busy), usize::MAX);
        let error = DurableQueue::builder()
            .redis(&url, "busy", &wheel)
            .await
            .expect_err("the proxy answers every AUTH");
        assert!(matches!(error, Error::Unreachable(_)), "{busy}: {error:?}");
    }
    proxy.disarm();
    proxy.inject(
        "AUTH",
        support::proxy::Fault::Answer(
            "-WRONGPASS invalid username-password pair or user is disabled.",
        ),
        usize::MAX,
    );
    denied("WRONGPASS", Builder::default(), &url, "busy", &wheel).await;
    proxy.disarm();
    let queue = DurableQueue::builder()
        .redis(&url, "busy", &wheel)
        .await
        .expect("admitted once the proxy stops answering");
    round_trip(&queue, "after-busy").await;
}

/// A running queue whose reconnect meets a busy `AUTH` retries, as for a dropped connection,
/// and the call succeeds once the server admits it.
#[tokio::test]
async fn a_reconnect_refused_as_busy_is_retried_until_the_server_admits_it() {
    traces();
    let Some(server) = redis_server::start_with(&["--requirepass", REQUIREPASS]) else {
        return;
    };
    let proxy = support::proxy::Proxy::start(server.addr()).await;
    let url = proxy
        .url()
        .replace("redis://", &format!("redis://:{REQUIREPASS}@"));
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .redis(&url, "busy", &wheel)
        .await
        .unwrap();
    queue.schedule(Task::new("a").id("before")).await.unwrap();
    proxy.inject(
        "AUTH",
        support::proxy::Fault::Answer("-ERR max number of clients reached"),
        4,
    );
    let mut admin = raw(&url_as(&server, &format!(":{REQUIREPASS}@")));
    let () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut admin)
        .unwrap();
    queue
        .schedule(Task::new("b").id("after"))
        .await
        .expect("retried until admitted, not denied");
    assert!(proxy.injected() >= 1, "a reconnect met the busy AUTH");
    assert_eq!(queue.len().await.unwrap(), 2);
}

/// The permission check at open covers every partition: an ACL user whose key patterns
/// admit only partition 0 (and the config key) is denied at open with `partitions(4)`,
/// naming the keys, while one admitted to every partition opens.
#[tokio::test]
async fn a_user_admitted_to_one_partition_only_is_denied_at_open() {
    traces();
    let Some(server) = redis_server::start() else {
        return;
    };
    let mut admin = raw(&server.url());
    // Partition p of queue "parts" has the hash tag `parts~p~k` (`redis/keys.rs`).
    for (user, keys) in [
        ("onepart", "~tw:{parts}:* ~tw:{parts~0~*"),
        ("allparts", "~tw:{parts}:* ~tw:{parts~*"),
    ] {
        let mut command = redis::cmd("ACL");
        command.arg("SETUSER").arg(user).arg("reset").arg("on");
        command.arg(format!(">{LIMITED_PASSWORD}"));
        command.arg(keys.split(' ').collect::<Vec<_>>());
        command.arg("&*").arg("+@all");
        let () = command.query(&mut admin).unwrap();
    }
    let wheel = Wheel::new();
    let url = url_as(&server, &format!("onepart:{LIMITED_PASSWORD}@"));
    let error = denied(
        "a user of partition 0 only",
        Builder::default().partitions(4),
        &url,
        "parts",
        &wheel,
    )
    .await;
    let text = format!("{error}").to_lowercase();
    assert!(text.contains("noperm") && text.contains("keys"), "{error}");
    let url = url_as(&server, &format!("allparts:{LIMITED_PASSWORD}@"));
    let queue = DurableQueue::builder()
        .partitions(4)
        .redis(&url, "parts", &wheel)
        .await
        .expect("a user of every partition is admitted");
    round_trip(&queue, "in-some-partition").await;
}

/// A whole session with a password — including the server restarting under it, so the
/// queue reconnects and traces its retries — and refused connects, with every trace line of
/// them captured: no password in any error, `Debug` output or trace, nor in the error for a
/// URL that cannot be parsed.
#[tokio::test]
async fn passwords_never_appear_in_errors_debug_output_or_traces() {
    traces();
    let Some(mut server) = redis_server::start_with(&["--requirepass", REQUIREPASS]) else {
        return;
    };
    let wheel = Wheel::new();
    let builder = DurableQueue::builder().lease(Duration::from_secs(5));
    let url = url_as(&server, &format!(":{REQUIREPASS}@"));
    let queue = builder
        .clone()
        .redis(&url, "secrets", &wheel)
        .await
        .unwrap();
    round_trip(&queue, "before-restart").await;

    server.stop();
    let scheduling = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.schedule(Task::new("x").id("during-restart")).await })
    };
    tokio::time::sleep(ms(300)).await;
    server.restart();
    scheduling
        .await
        .unwrap()
        .expect("retried until the server is back");
    let mut deliveries = queue.deliveries();
    let delivery = tokio::time::timeout(HANG, deliveries.next())
        .await
        .expect("a delivery at all")
        .unwrap();
    delivery.ack().await.unwrap();
    drop(deliveries);

    let wrong = denied(
        "a wrong password",
        builder.clone(),
        &url_as(&server, &format!(":{WRONG_PASSWORD}@")),
        "secrets",
        &wheel,
    )
    .await;
    let unparsable = builder
        .clone()
        .redis(
            &format!("redis://:{WRONG_PASSWORD}@127.0.0.1:notaport/"),
            "secrets",
            &wheel,
        )
        .await
        .expect_err("not a URL");
    assert!(matches!(unparsable, Error::Invalid(_)), "{unparsable:?}");
    queue.close().await;

    let traces = captured();
    assert!(
        traces.contains("redis unreachable; retrying"),
        "the capture saw the retries of the restart:\n{traces}"
    );
    let mut texts = vec![format!("{queue:?}"), format!("{builder:?}")];
    texts.extend(shown(&wrong));
    texts.extend(shown(&unparsable));
    assert_no_password_in(&texts);
}

/// A throwaway CA and a certificate it signed for 127.0.0.1 and localhost, in `dir`, made
/// with the `openssl` CLI; `None` (skipped, failed in CI) without `openssl`.
#[cfg(feature = "redis-tls")]
struct Certificates {
    ca: std::path::PathBuf,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

#[cfg(feature = "redis-tls")]
fn make_certificates(dir: &std::path::Path) -> Option<Certificates> {
    use std::process::{Command, Stdio};
    if Command::new("openssl")
        .arg("version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        redis_server::skip_or_fail(
            "openssl is not on PATH: install it (e.g. `apt-get install -y openssl`) to run the \
             Redis TLS tests",
        );
        return None;
    }
    let openssl = |args: &[&str]| {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    openssl(
        &[
            &["req", "-x509", "-nodes", "-days", "2"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-subj",
                "/CN=tokio-wheel test CA",
            ],
            &["-addext", "basicConstraints=critical,CA:TRUE"],
            &["-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req", "-new", "-nodes"][..],
            &ec,
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        ]
        .concat(),
    );
    std::fs::write(
        dir.join("server.ext"),
        "basicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature,keyEncipherment\n\
         extendedKeyUsage=serverAuth\n\
         subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "server.ext",
        "-out",
        "server.pem",
    ]);
    Some(Certificates {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
    })
}

/// TLS under a private CA: trusted through `tls_root_certificates`, the queue works the whole
/// way; without it (the system's roots do not know the CA) the client refuses the server at
/// once, and says it is the certificate.
#[cfg(feature = "redis-tls")]
#[tokio::test]
async fn tls_with_the_private_ca_works_and_an_untrusted_certificate_is_denied_at_once() {
    traces();
    let dir = tempfile::tempdir().unwrap();
    let Some(certificates) = make_certificates(dir.path()) else {
        return;
    };
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let Some(server) = redis_server::start_tls(&[
        "--tls-cert-file",
        &path(&certificates.cert),
        "--tls-key-file",
        &path(&certificates.key),
        "--tls-ca-cert-file",
        &path(&certificates.ca),
        "--tls-auth-clients",
        "no",
    ]) else {
        return;
    };
    let url = format!("rediss://127.0.0.1:{}/", server.port());
    let ca = std::fs::read(&certificates.ca).unwrap();
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .tls_root_certificates(ca)
        .redis(&url, "tls", &wheel)
        .await
        .expect("the private CA is trusted");
    round_trip(&queue, "over-tls").await;

    let untrusted = denied(
        "an untrusted certificate",
        DurableQueue::builder(),
        &url,
        "tls",
        &wheel,
    )
    .await;
    assert!(
        format!("{untrusted}")
            .to_lowercase()
            .contains("certificate"),
        "says it is the certificate: {untrusted}"
    );
}
