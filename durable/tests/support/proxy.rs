//! A loopback TCP proxy between a client and a real server that breaks connections on cue:
//! when a chunk the client sends contains a chosen pattern (e.g. a script's name argument),
//! it either drops the connection before the command reaches the server, or forwards it and
//! drops the connection before the reply comes back (the command ran; its answer is lost), or
//! answers in the server's place (a server that is busy, say).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The command never reaches the server.
    DropRequest,
    /// The server runs the command; its reply is lost with the connection.
    LoseReply,
    /// The proxy answers the chunk itself: this reply (a RESP line, without its `\r\n`) for
    /// the first command in it, `+OK` for each further one; the server never sees it.
    Answer(&'static str),
}

struct Rule {
    pattern: Vec<u8>,
    fault: Fault,
    remaining: usize,
}

#[derive(Default)]
struct State {
    rules: Mutex<Vec<Rule>>,
    injected: AtomicUsize,
    connections: AtomicUsize,
}

pub struct Proxy {
    port: u16,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a loopback port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        let task = tokio::spawn({
            let state = state.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    state.connections.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(relay(client, upstream, state.clone()));
                }
            }
        });
        Proxy { port, state, task }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The next `times` client chunks containing `pattern` meet `fault`.
    pub fn inject(&self, pattern: &str, fault: Fault, times: usize) {
        self.state.rules.lock().unwrap().push(Rule {
            pattern: pattern.as_bytes().to_vec(),
            fault,
            remaining: times,
        });
    }

    /// Faults armed and not yet met.
    pub fn pending(&self) -> usize {
        self.state
            .rules
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.remaining)
            .sum()
    }

    /// Drops every fault armed and not yet met.
    pub fn disarm(&self) {
        self.state.rules.lock().unwrap().clear();
    }

    /// How many faults were injected so far.
    pub fn injected(&self) -> usize {
        self.state.injected.load(Ordering::SeqCst)
    }

    /// How many connections clients opened through the proxy.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

async fn relay(client: TcpStream, upstream: SocketAddr, state: Arc<State>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Set when a reply must be lost: nothing more goes back to the client.
    let mute = Arc::new(AtomicBool::new(false));
    // What goes back to the client: the server's bytes, and the proxy's own answers.
    let (down_tx, mut down_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        while let Some(bytes) = down_rx.recv().await {
            if client_write.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    let downstream = tokio::spawn({
        let mute = mute.clone();
        let down_tx = down_tx.clone();
        async move {
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                let n = match server_read.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if mute.load(Ordering::SeqCst) {
                    return;
                }
                if down_tx.send(buffer[..n].to_vec()).is_err() {
                    return;
                }
            }
        }
    });
    let mut buffer = vec![0u8; 64 * 1024];
    // Once a reply is to be lost: the client's bytes still reach the server until then (the
    // rest of a command split over several reads), and then the connection goes.
    let mut cut_at: Option<tokio::time::Instant> = None;
    loop {
        let read = client_read.read(&mut buffer);
        let n = match cut_at {
            None => read.await,
            Some(at) => match tokio::time::timeout_at(at, read).await {
                Ok(read) => read,
                Err(_) => break,
            },
        };
        let n = match n {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if cut_at.is_some() {
            if server_write.write_all(&buffer[..n]).await.is_err() {
                break;
            }
            continue;
        }
        let chunk = &buffer[..n];
        let fault = {
            let mut rules = state.rules.lock().unwrap();
            rules
                .iter_mut()
                .find(|r| r.remaining > 0 && contains(chunk, &r.pattern))
                .map(|rule| {
                    rule.remaining -= 1;
                    rule.fault
                })
        };
        match fault {
            None => {
                if server_write.write_all(chunk).await.is_err() {
                    break;
                }
            }
            Some(Fault::DropRequest) => {
                state.injected.fetch_add(1, Ordering::SeqCst);
                break;
            }
            Some(Fault::Answer(first)) => {
                state.injected.fetch_add(1, Ordering::SeqCst);
                // One reply per command of the chunk (each starts a line with `*`).
                let commands = chunk.windows(3).filter(|w| w == b"\r\n*").count() + 1;
                let mut reply = format!("{first}\r\n");
                for _ in 1..commands {
                    reply.push_str("+OK\r\n");
                }
                if down_tx.send(reply.into_bytes()).is_err() {
                    break;
                }
            }
            Some(Fault::LoseReply) => {
                state.injected.fetch_add(1, Ordering::SeqCst);
                mute.store(true, Ordering::SeqCst);
                if server_write.write_all(chunk).await.is_err() {
                    break;
                }
                // Give the server time to run it before the connection goes.
                cut_at = Some(tokio::time::Instant::now() + Duration::from_millis(100));
            }
        }
    }
    downstream.abort();
    // The writer ends once what was already relayed is written (then its half drops).
    drop(down_tx);
    let _ = tokio::time::timeout(Duration::from_millis(100), writer).await;
    // Dropping both halves closes both connections.
}
