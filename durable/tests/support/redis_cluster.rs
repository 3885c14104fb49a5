//! A real Redis Cluster of the test's own: six `redis-server --cluster-enabled yes` nodes on
//! ephemeral loopback ports, joined by `redis-cli --cluster create … --cluster-replicas 1`
//! (three masters, one replica each). Nodes can be killed, restarted and failed over; all are
//! killed when the cluster is dropped.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Node {
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Node {
    fn launch(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ])
            .args(["--cluster-node-timeout", "1500", "--save", ""])
            .args(["--appendonly", "yes", "--appendfsync", "everysec"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on its port, data and cluster config.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

/// One line of `CLUSTER NODES`.
struct Row {
    port: u16,
    master: bool,
    /// A replica's master (its node id).
    of: Option<String>,
    /// The slot ranges a master serves.
    slots: Vec<(u16, u16)>,
}

pub struct Cluster {
    pub nodes: Vec<Node>,
}

/// Whether `redis-server` and `redis-cli` are here; in CI (`CI` set) their absence fails.
fn available() -> bool {
    let found = ["redis-server", "redis-cli"].iter().all(|tool| {
        Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok()
    });
    if !found {
        let message = "redis-server and redis-cli are not on PATH: install them (e.g. \
                       `apt-get install -y redis-server redis-tools`) to run the cluster tests";
        if std::env::var_os("CI").is_some()
            || std::env::var_os("TOKIO_WHEEL_REQUIRE_REDIS").is_some()
        {
            panic!("{message}");
        }
        eprintln!("SKIPPED: {message}");
    }
    found
}

fn free_port() -> u16 {
    // Cluster nodes also listen on port + 10000 (the bus): keep that free too.
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// Starts six nodes and makes them a cluster of three masters with a replica each, or
/// explains what is missing.
pub fn start() -> Option<Cluster> {
    if !available() {
        return None;
    }
    let mut nodes: Vec<Node> = Vec::new();
    for _ in 0..6 {
        let mut port = free_port();
        while nodes.iter().any(|n| n.port == port) {
            port = free_port();
        }
        let mut node = Node {
            port,
            child: None,
            dir: tempfile::tempdir().unwrap(),
        };
        node.launch();
        nodes.push(node);
    }
    let addresses: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let status = Command::new("redis-cli")
        .arg("--cluster")
        .arg("create")
        .args(&addresses)
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("redis-cli --cluster create");
    assert!(status.success(), "redis-cli --cluster create failed");
    let cluster = Cluster { nodes };
    cluster.wait_until_healthy(Duration::from_secs(30));
    Some(cluster)
}

impl Cluster {
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }

    /// Waits until every running node says the cluster is ok, with three masters that each
    /// have a replica in sync.
    pub fn wait_until_healthy(&self, limit: Duration) {
        let start = Instant::now();
        loop {
            let ok = self.nodes.iter().filter(|n| n.is_running()).all(|node| {
                let Ok(client) = redis::Client::open(node.url()) else {
                    return false;
                };
                let Ok(mut c) = client.get_connection() else {
                    return false;
                };
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut c)
                    .unwrap_or_default();
                info.contains("cluster_state:ok")
            });
            if ok && self.masters().len() == 3 {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "the cluster is not healthy after {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `CLUSTER NODES` as seen from a running node: each node that is connected.
    fn topology(&self) -> Vec<Row> {
        let node = self.nodes.iter().find(|n| n.is_running()).expect("a node");
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut node.connection())
            .unwrap();
        let mut rows = Vec::new();
        for line in text.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields.len() < 8 || fields[2].contains("fail") || fields[7] != "connected" {
                continue;
            }
            let port: u16 = fields[1]
                .split(['@', ':'])
                .nth(1)
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            let master = fields[2].contains("master");
            let of = (!master).then(|| fields[3].to_owned());
            let slots = fields[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| {
                    let (a, b) = s.split_once('-').unwrap_or((s, s));
                    Some((a.parse().ok()?, b.parse().ok()?))
                })
                .collect();
            rows.push(Row {
                port,
                master,
                of,
                slots,
            });
        }
        rows
    }

    /// The ports of the masters that serve slots.
    pub fn masters(&self) -> Vec<u16> {
        self.topology()
            .into_iter()
            .filter(|row| row.master && !row.slots.is_empty())
            .map(|row| row.port)
            .collect()
    }

    /// The port of the master serving `slot`; waits (up to 30 s) while no connected master
    /// does, as between a master's death and its replica's promotion.
    pub fn master_of(&self, slot: u16) -> u16 {
        let start = Instant::now();
        loop {
            let found = self
                .topology()
                .into_iter()
                .find(|row| row.master && row.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
                .map(|row| row.port);
            if let Some(port) = found {
                return port;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no master serves slot {slot}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The slot of a key, as the cluster computes it.
    pub fn slot_of(&self, key: &str) -> u16 {
        let node = self.nodes.iter().find(|n| n.is_running()).expect("a node");
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut node.connection())
            .unwrap()
    }

    /// The running replica of the master on `port`; waits (up to 30 s) while none shows as
    /// connected, as just after the cluster was made.
    pub fn replica_of(&self, port: u16) -> u16 {
        let master_id: String = redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.node(port).connection())
            .unwrap();
        let start = Instant::now();
        loop {
            let found = self
                .topology()
                .into_iter()
                .find(|row| !row.master && row.of.as_deref() == Some(master_id.as_str()))
                .map(|row| row.port);
            if let Some(port) = found {
                return port;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the master on {port} has no replica"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn node(&self, port: u16) -> &Node {
        self.nodes.iter().find(|n| n.port == port).expect("a node")
    }

    pub fn node_mut(&mut self, port: u16) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node")
    }

    /// `CLUSTER FAILOVER` on the replica of the master on `port`: a graceful handover.
    /// Returns the new master's port once the cluster has switched.
    pub fn failover(&self, port: u16) -> u16 {
        let replica = self.replica_of(port);
        let _: () = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .query(&mut self.node(replica).connection())
            .unwrap();
        let start = Instant::now();
        while !self.masters().contains(&replica) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the failover did not happen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        replica
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }
}
