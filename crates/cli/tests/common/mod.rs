//! Shared helpers for the end-to-end tests of the `trireme` binary.
//!
//! - [`TestNode`]: one `trireme node run` process on a temporary data dir,
//!   free ports, killed (SIGKILL) on drop; can be killed and restarted on the
//!   same data dir.
//! - [`run`] / [`run_fail`]: run an outside tool with a timeout.
//! - [`nbd_client`]: a small synchronous NBD client that records what was
//!   acknowledged (used by the crash, byte-flip and full-pool tests).
#![allow(dead_code)]

pub mod block;
pub mod nbd_client;
pub mod replicated;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Path of the binary under test.
pub fn trireme_bin() -> &'static str {
    env!("CARGO_BIN_EXE_trireme")
}

/// How long a node may take to print "ready".
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Default timeout of a CLI call.
pub const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// True when running under CI (where a skip is a failure).
pub fn in_ci() -> bool {
    std::env::var("CI")
        .map(|v| !v.is_empty() && v != "0" && v != "false")
        .unwrap_or(false)
}

/// Skip the current test with a reason, unless in CI, where a missing
/// prerequisite must fail the run. Use as `if let Some(r) = ... { skip(r); return; }`.
pub fn skip(reason: &str) {
    if in_ci() {
        panic!("prerequisite missing in CI: {reason}");
    }
    eprintln!("SKIPPED: {reason}");
    println!("SKIPPED: {reason}");
}

/// Whether an executable is on PATH.
pub fn have_tool(name: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name} >/dev/null 2>&1"))
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Returns Some(reason) if one of the tools is missing.
pub fn missing_tools(tools: &[&str]) -> Option<String> {
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !have_tool(t)).collect();
    if missing.is_empty() {
        None
    } else {
        Some(format!("missing tools: {}", missing.join(", ")))
    }
}

/// The API and NBD ports from a line like
/// `trireme node ready: api http://127.0.0.1:P nbd 127.0.0.1:Q unix ...`.
pub fn ready_ports(line: &str) -> Option<(u16, u16)> {
    let port_after = |key: &str| -> Option<u16> {
        let rest = &line[line.find(key)? + key.len()..];
        let address = rest.split_whitespace().next()?;
        address.rsplit(':').next()?.parse().ok()
    };
    Some((port_after("api http://")?, port_after(" nbd ")?))
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    stable_port("127.0.0.1")
}

/// A port free on `ip` now, for a listener that must get it back after a
/// restart (a node keeps its API and NBD ports: the cluster knows it by its
/// API address). It lies below the kernel's ephemeral range, where no
/// outgoing connection and no `bind(0)` can take it while the node is
/// down; this process hands each port out once, counting from a start
/// that differs between test processes.
pub fn stable_port(ip: &str) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;
    const LOWEST: u32 = 10_000;
    static RANGE: OnceLock<(u32, u32)> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (first, end) = *RANGE.get_or_init(|| {
        let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
            .unwrap_or(32_768);
        assert!(
            ephemeral_start > LOWEST + 1_000,
            "the ephemeral port range starts at {ephemeral_start}: no room below it for test ports"
        );
        NEXT.store(std::process::id().wrapping_mul(7_919), Ordering::Relaxed);
        (LOWEST, ephemeral_start)
    });
    for _ in 0..(end - first) {
        let port = first + NEXT.fetch_add(1, Ordering::Relaxed) % (end - first);
        if TcpListener::bind((ip, port as u16)).is_ok() {
            return port as u16;
        }
    }
    panic!("no free port on {ip} between {first} and {end}");
}

/// A temporary directory removed on drop (on the same disk as the target dir,
/// not tmpfs, so that sparse pool files and fsync behave like a real disk).
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let base = std::env::var_os("TRIREME_TEST_TMP")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
        std::fs::create_dir_all(&base).unwrap();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        // Tests of one binary run in parallel threads of one process: the
        // clock alone gave two of them the same directory (and one node's
        // lock to the other). A counter makes each name unique, and
        // `create_dir` refuses one that exists.
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = base.join(format!("{tag}-{}-{made}-{nanos}", std::process::id()));
        std::fs::create_dir(&path)
            .unwrap_or_else(|error| panic!("cannot make {}: {error}", path.display()));
        TempDir { path }
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("TRIREME_KEEP_TMP").is_none() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Result of an outside command.
pub struct CmdOut {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
}

impl CmdOut {
    pub fn success(&self) -> bool {
        self.status == Some(0) && !self.timed_out
    }
    pub fn describe(&self, what: &str) -> String {
        format!(
            "command: {what}\nexit: {:?}{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status,
            if self.timed_out { " (TIMED OUT)" } else { "" },
            tail(&self.stdout, 4000),
            tail(&self.stderr, 4000)
        )
    }
}

fn tail(s: &str, n: usize) -> &str {
    if s.len() <= n {
        s
    } else {
        let mut i = s.len() - n;
        while !s.is_char_boundary(i) {
            i += 1;
        }
        &s[i..]
    }
}

/// Shell-like rendering of a command for messages.
pub fn render(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        let a = a.to_string_lossy();
        if a.contains(' ') || a.is_empty() {
            s.push_str(&format!("'{a}'"));
        } else {
            s.push_str(&a);
        }
    }
    s
}

/// Run a command with a timeout (SIGKILL on expiry), capturing its output.
pub fn exec(cmd: &mut Command, timeout: Duration) -> CmdOut {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {}: {e}", render(cmd)));
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t1 = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let t2 = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        match child.try_wait().unwrap() {
            Some(st) => break st,
            None => {
                if Instant::now() >= deadline {
                    timed_out = true;
                    let _ = child.kill();
                    break child.wait().unwrap();
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    };
    let stdout = String::from_utf8_lossy(&t1.join().unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&t2.join().unwrap()).into_owned();
    CmdOut {
        status: status.code(),
        stdout,
        stderr,
        timed_out,
    }
}

/// Run a command that must succeed within `timeout`; returns stdout.
pub fn run_t(cmd: &mut Command, timeout: Duration) -> String {
    let what = render(cmd);
    let out = exec(cmd, timeout);
    assert!(out.success(), "command failed\n{}", out.describe(&what));
    out.stdout
}

/// Run a command that must succeed within 120 s; returns stdout.
pub fn run(cmd: &mut Command) -> String {
    run_t(cmd, Duration::from_secs(120))
}

/// Run a command that must fail (non-zero exit, no timeout); returns the output.
pub fn run_fail(cmd: &mut Command) -> CmdOut {
    let what = render(cmd);
    let out = exec(cmd, Duration::from_secs(120));
    assert!(!out.timed_out, "command timed out\n{}", out.describe(&what));
    assert!(
        out.status != Some(0),
        "command unexpectedly succeeded\n{}",
        out.describe(&what)
    );
    out
}

/// Build a Command from a program and args.
pub fn cmd<S: AsRef<std::ffi::OsStr>>(prog: &str, args: &[S]) -> Command {
    let mut c = Command::new(prog);
    c.args(args);
    c
}

/// A deterministic xorshift PRNG (no dependency needed).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// Seeded from the clock; the seed is printed so a failure can be replayed
    /// with TRIREME_TEST_SEED.
    pub fn from_env_or_time(what: &str) -> Rng {
        let seed = std::env::var("TRIREME_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        eprintln!("{what}: seed {seed} (replay with TRIREME_TEST_SEED={seed})");
        Rng::new(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// Write `size` bytes of pseudo-random data to `path`.
pub fn random_file(path: &Path, size: u64, seed: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        rng.fill(&mut buf[..n]);
        f.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
    f.flush().unwrap();
}

/// sha256 of a file, via sha256sum.
pub fn sha256(path: &Path) -> String {
    let out = run(&mut cmd("sha256sum", &[path]));
    out.split_whitespace().next().unwrap().to_string()
}

/// Offsets of every copy of `needle` in a (sparse) file, reading only its
/// data extents (SEEK_DATA/SEEK_HOLE): a default pool is a sparse file of
/// tens of GiB with a few MiB written.
pub fn find_in_sparse_file(path: &Path, needle: &[u8]) -> Vec<u64> {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    const WINDOW: u64 = 16 << 20;
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let size = file.metadata().unwrap().len();
    let fd = file.as_raw_fd();
    let mut hits = Vec::new();
    let mut position: u64 = 0;
    let mut buffer = vec![0u8; (WINDOW as usize) + needle.len()];
    while position < size {
        // SAFETY: lseek on an open descriptor has no memory effects.
        let data = unsafe { libc::lseek(fd, position as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            break; // no more data
        }
        let data = data as u64;
        let hole = unsafe { libc::lseek(fd, data as libc::off_t, libc::SEEK_HOLE) };
        let end = if hole < 0 { size } else { hole as u64 };
        let mut at = data;
        while at < end {
            // Overlap windows by the needle's length so a copy across a
            // window boundary is still found.
            let want = (end - at).min(WINDOW) as usize + needle.len();
            let want = want.min((size - at) as usize);
            let got = file.read_at(&mut buffer[..want], at).unwrap();
            let window = &buffer[..got];
            if got >= needle.len() {
                for (index, candidate) in window.windows(needle.len()).enumerate() {
                    if index as u64 >= WINDOW {
                        break;
                    }
                    if candidate[0] == needle[0] && candidate == needle {
                        hits.push(at + index as u64);
                    }
                }
            }
            at += WINDOW;
        }
        position = end;
    }
    hits.sort_unstable();
    hits.dedup();
    hits
}

/// Poll `f` until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A minimal HTTP/1.1 request over a raw TCP socket: returns (status, body).
/// Used for malformed bodies that a well-behaved client would never send.
pub fn http_raw(
    port: u16,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> (u16, String) {
    http_request(
        &format!("127.0.0.1:{port}"),
        method,
        path,
        content_type,
        &[],
        body,
    )
}

fn http_request(
    address: &str,
    method: &str,
    path: &str,
    content_type: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    let mut s = TcpStream::connect(address).expect("connect to API");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    let text = String::from_utf8_lossy(&resp).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad HTTP response to {method} {path}: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A line announcing readiness: the word "ready" on its own (not "already").
pub fn is_ready_line(line: &str) -> bool {
    line.to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .any(|w| w == "ready")
}

/// How a [`TestNode`] is started.
#[derive(Clone, Debug, Default)]
pub struct NodeSpec {
    /// `--name` (default: "test").
    pub name: Option<String>,
    /// `--join ADDRESS --token TOKEN`.
    pub join: Option<(String, String)>,
    /// The IP to listen on (default 127.0.0.1).
    pub ip: Option<String>,
    /// Run inside this network namespace (`ip netns exec NS ...`).
    pub netns: Option<String>,
    /// More arguments for `node run`.
    pub args: Vec<String>,
}

/// One `trireme node run` process.
pub struct TestNode {
    pub dir: TempDir,
    pub nbd_port: u16,
    pub api_port: u16,
    pub spec: NodeSpec,
    child: Option<Child>,
    starts: u32,
}

impl TestNode {
    /// Start a node on a fresh data dir and wait for "ready".
    pub fn start() -> TestNode {
        Self::start_with(NodeSpec::default())
    }

    /// Start a node as `spec` says, on a fresh data dir.
    pub fn start_with(spec: NodeSpec) -> TestNode {
        let dir = TempDir::new("node");
        // Inside a network namespace the node has the namespace's ports to
        // itself: there the kernel picks them (port 0; the ready line names
        // them).
        let port = |spec: &NodeSpec| match (&spec.netns, &spec.ip) {
            (Some(_), _) => 0,
            (None, ip) => stable_port(ip.as_deref().unwrap_or("127.0.0.1")),
        };
        let (nbd_port, api_port) = (port(&spec), port(&spec));
        let mut n = TestNode {
            dir,
            nbd_port,
            api_port,
            spec,
            child: None,
            starts: 0,
        };
        n.launch();
        n
    }

    pub fn ip(&self) -> String {
        self.spec.ip.clone().unwrap_or_else(|| "127.0.0.1".into())
    }

    /// `HOST:PORT` of the REST API.
    pub fn api_address(&self) -> String {
        format!("{}:{}", self.ip(), self.api_port)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join(format!("node-{}.log", self.starts))
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("node not running").id()
    }

    pub fn api_url(&self) -> String {
        format!("http://{}", self.api_address())
    }

    /// nbd://127.0.0.1:PORT/NAME
    pub fn uri(&self, volume: &str) -> String {
        format!("nbd://127.0.0.1:{}/{}", self.nbd_port, volume)
    }

    fn launch(&mut self) {
        assert!(self.child.is_none());
        self.starts += 1;
        let mut c = self.node_command();
        let what = render(&c);
        let mut child = c
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let logpath = self.log_path();
        std::thread::spawn(move || {
            // Keep draining stdout for the node's whole life, copying it to the log.
            let mut log = std::fs::OpenOptions::new().append(true).open(logpath).ok();
            let mut sent = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(l) = log.as_mut() {
                    // One write per line: `writeln!` on a File makes several
                    // writes, and the node's stderr (same file, O_APPEND) can
                    // land between them and split the line.
                    let _ = l.write_all(format!("[stdout] {line}\n").as_bytes());
                }
                if !sent && is_ready_line(&line) {
                    let _ = tx.send(line.clone());
                    sent = true;
                }
            }
        });
        self.child = Some(child);
        match rx.recv_timeout(READY_TIMEOUT) {
            Ok(line) => {
                let (api_port, nbd_port) = ready_ports(&line)
                    .unwrap_or_else(|| panic!("no ports in the ready line: {line}"));
                self.api_port = api_port;
                self.nbd_port = nbd_port;
            }
            Err(_) => {
                let status = self.child.as_mut().unwrap().try_wait().ok().flatten();
                let log = self.log_tail();
                self.kill9();
                panic!(
                    "node did not print \"ready\" within {READY_TIMEOUT:?} (exit: {status:?})\ncommand: {what}\n--- node log ---\n{log}"
                );
            }
        }
    }

    /// Starts the node again on its data dir expecting it to refuse: waits
    /// (bounded) for it to exit and returns its output.
    pub fn start_refused(&mut self) -> CmdOut {
        self.kill9();
        self.starts += 1;
        let mut c = self.node_command();
        let what = render(&c);
        let out = exec(&mut c, READY_TIMEOUT);
        assert!(
            !out.timed_out && !out.success(),
            "the node did not refuse to start\n{}",
            out.describe(&what)
        );
        out
    }

    /// Waits (bounded) for the node to exit on its own; its exit status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut()?;
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `trireme node run` on this node's data dir, ports and spec; stderr
    /// goes to the current log file.
    fn node_command(&self) -> Command {
        let data = self.data_dir();
        std::fs::create_dir_all(&data).unwrap();
        // Append mode for both writers (the node's stderr, and the thread
        // copying its stdout below), so neither overwrites the other's lines.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        // A restarted node keeps its ports: the cluster knows it by its
        // API address.
        let ip = self.ip();
        let mut c = match &self.spec.netns {
            Some(namespace) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", namespace]).arg(trireme_bin());
                c
            }
            None => Command::new(trireme_bin()),
        };
        c.args(["node", "run", "--data-dir"])
            .arg(&data)
            .arg("--nbd-listen")
            .arg(format!("{ip}:{}", self.nbd_port))
            .arg("--nbd-socket")
            .arg(data.join("nbd.sock"))
            .arg("--api-listen")
            .arg(format!("{ip}:{}", self.api_port))
            .arg("--name")
            .arg(self.spec.name.as_deref().unwrap_or("test"))
            .args(&self.spec.args)
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        if let Some((address, token)) = &self.spec.join {
            c.args(["--join", address, "--token", token]);
        }
        c
    }

    /// The end of the current node log.
    pub fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        tail(&s, 6000).to_string()
    }

    /// SIGKILL the node and reap it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM the node and wait (bounded) for a clean exit; asserts exit 0.
    pub fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                assert!(
                    st.success(),
                    "node exited with {st:?} after SIGTERM\n--- node log ---\n{}",
                    self.log_tail()
                );
                return;
            }
            if Instant::now() >= deadline {
                let _ = c.kill();
                let _ = c.wait();
                panic!(
                    "node did not exit within 30 s of SIGTERM\n--- node log ---\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Start again on the same data dir (after kill9 or stop).
    pub fn restart(&mut self) {
        self.kill9();
        self.launch();
    }

    /// Whether the process is still alive.
    pub fn alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().unwrap().is_none(),
            None => false,
        }
    }

    /// A `trireme --api URL --output json ARGS...` command (run inside the
    /// node's network namespace, if it has one).
    pub fn cli_cmd(&self, args: &[&str]) -> Command {
        let mut c = match &self.spec.netns {
            Some(namespace) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", namespace]).arg(trireme_bin());
                c
            }
            None => Command::new(trireme_bin()),
        };
        // Off loopback, clients need the admin token, as people would.
        if self.ip() != "127.0.0.1" {
            if let Ok(token) = std::fs::read_to_string(self.data_dir().join("admin.token")) {
                c.env("TRIREME_TOKEN", token.trim());
            }
        }
        c.arg("--api")
            .arg(self.api_url())
            .args(["--output", "json"])
            .args(args);
        c
    }

    /// Run the CLI, assert success, return stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let mut c = self.cli_cmd(args);
        let what = render(&c);
        let out = exec(&mut c, CLI_TIMEOUT);
        assert!(
            out.success(),
            "CLI failed\n{}\n--- node log ---\n{}",
            out.describe(&what),
            self.log_tail()
        );
        out.stdout
    }

    /// Run the CLI and parse its JSON output.
    pub fn cli_json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.cli(args);
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("trireme {args:?}: output is not JSON ({e}): {out}"))
    }

    /// Run the CLI expecting failure; returns output.
    pub fn cli_fail(&self, args: &[&str]) -> CmdOut {
        run_fail(&mut self.cli_cmd(args))
    }

    /// Create a volume on the default pool.
    pub fn create_volume(&self, name: &str, size: &str) {
        self.cli(&["volume", "create", name, "--size", size]);
    }

    /// GET /api/v1/health answers 200.
    pub fn healthy(&self) -> bool {
        match std::panic::catch_unwind(|| {
            http_raw(
                self.api_port,
                "GET",
                "/api/v1/health",
                "application/json",
                b"",
            )
        }) {
            Ok((code, _)) => code == 200,
            Err(_) => false,
        }
    }

    /// Assert the node is alive and healthy.
    pub fn assert_healthy(&mut self) {
        assert!(
            self.alive(),
            "node process died\n--- node log ---\n{}",
            self.log_tail()
        );
        assert!(
            self.healthy(),
            "health check failed\n--- node log ---\n{}",
            self.log_tail()
        );
    }

    /// `pool scan NAME` as JSON.
    /// The CLI exits non-zero when the pool is not clean, still printing the
    /// report; so any exit is accepted as long as stdout is the JSON report.
    pub fn scan(&self, pool: &str) -> serde_json::Value {
        let mut c = self.cli_cmd(&["pool", "scan", pool]);
        let what = render(&c);
        let out = exec(&mut c, Duration::from_secs(300));
        match serde_json::from_str::<serde_json::Value>(&out.stdout) {
            Ok(v) if !out.timed_out && v.is_object() => v,
            _ => panic!(
                "pool scan gave no JSON report\n{}\n--- node log ---\n{}",
                out.describe(&what),
                self.log_tail()
            ),
        }
    }

    /// Assert a scan is clean: accounting matches, no mismatch, no problem.
    pub fn assert_scan_clean(&self, pool: &str) {
        let r = self.scan(pool);
        let counted = &r["allocated_chunks_counted"];
        let accounted = &r["allocated_chunks_accounted"];
        assert!(
            counted.is_u64(),
            "scan report lacks allocated_chunks_counted: {r}"
        );
        assert_eq!(counted, accounted, "chunk accounting differs: {r}");
        let mism = r["checksum_mismatches"]
            .as_array()
            .map(|a| a.len())
            .unwrap_or(usize::MAX);
        assert_eq!(mism, 0, "checksum mismatches: {r}");
        let probs = r["problems"]
            .as_array()
            .map(|a| a.len())
            .unwrap_or(usize::MAX);
        assert_eq!(probs, 0, "scan problems: {r}");
        if let Some(clean) = r.get("clean") {
            assert_eq!(clean, true, "scan says not clean: {r}");
        }
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        if std::thread::panicking() && self.child.is_some() {
            eprintln!(
                "--- node log ({}) ---\n{}",
                self.log_path().display(),
                self.log_tail()
            );
        }
        self.kill9();
    }
}

/// Output of `qemu-io -f raw URI -c ...` as a checked command.
pub fn qemu_io(uri: &str, cmds: &[&str]) -> Command {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw", uri]);
    for x in cmds {
        c.arg("-c").arg(x);
    }
    c
}

/// Run `exec` and return the CmdOut together with whether it ran OK. Tools
/// such as qemu-io may print an error but exit 0 on some versions, so also
/// look at the output.
pub fn qemu_io_ok(out: &CmdOut) -> bool {
    out.success()
        && !out.stdout.contains("failed")
        && !out.stderr.contains("failed")
        && !out.stdout.contains("error")
        && !out.stderr.contains("error")
}

/// Something on drop: used as cleanup guards (umount, losetup -d, ...).
pub struct Guard<F: FnMut()>(pub Option<F>);

impl<F: FnMut()> Drop for Guard<F> {
    fn drop(&mut self) {
        if let Some(mut f) = self.0.take() {
            f();
        }
    }
}

/// A clean `Output`-like check for a Command that must succeed.
pub fn output_ok(o: &Output) -> bool {
    o.status.success()
}

/// A JSON request to `host:port` with extra headers: returns (status,
/// body). For endpoints the CLI does not call (node-to-node ones).
pub fn http_at(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    http_request(address, method, path, "application/json", headers, body)
}

/// The join token of the cluster `node` belongs to.
pub fn join_token(node: &TestNode) -> String {
    let token = std::fs::read_to_string(node.data_dir().join("admin.token")).unwrap();
    let bearer = format!("Bearer {}", token.trim());
    let (status, body) = http_at(
        &node.api_address(),
        "GET",
        "/api/v1/cluster/join-token",
        &[("Authorization", &bearer)],
        b"",
    );
    assert_eq!(status, 200, "join-token: {body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    json["token"].as_str().unwrap().to_string()
}
