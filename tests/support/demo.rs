//! The demo servers (`examples/server/`, `examples/grpc.rs`) and the egress demo
//! (`examples/egress.rs`) as child processes, over real TCP.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// Builds the demo server once and returns its path.
pub fn server_binary() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| example_binary("server"))
}

/// Builds the example `name` and returns its path.
fn example_binary(name: &str) -> PathBuf {
    let status = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--example", name])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap_or_else(|e| panic!("run cargo build --example {name}: {e}"));
    assert!(status.success(), "the example {name} builds");
    let mut path = std::env::current_exe().unwrap();
    path.pop(); // deps
    path.pop(); // debug
    path.push("examples");
    path.push(name);
    assert!(path.exists(), "{} exists", path.display());
    path
}

/// Builds the egress demo (`examples/egress.rs`) once and returns its path.
#[allow(dead_code)]
pub fn egress_binary() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| example_binary("egress"))
}

/// Builds the gRPC demo server once and returns its path.
#[allow(dead_code)]
pub fn grpc_binary() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| example_binary("grpc"))
}

/// Runs the demo server with `env` as its only environment, expecting it to refuse to start
/// (exit code 2), and returns what it wrote to standard error.
pub fn start_error(env: &[(&str, &str)]) -> String {
    let out = Command::new(server_binary())
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "exit code for {env:?}: {err}");
    err
}

/// A running demo server, killed when dropped.
pub struct DemoServer {
    child: Child,
    pub addr: SocketAddr,
    pub first_line: String,
    /// The lines it writes after the first, standard output and error mixed.
    lines: std::sync::Mutex<std::sync::mpsc::Receiver<String>>,
}

impl DemoServer {
    /// Starts the server on a free port with `env` as its only environment.
    pub fn start(env: &[(&str, &str)]) -> Self {
        Self::start_binary(server_binary(), "http", env)
    }

    /// Starts the gRPC demo server on a free port with `env` as its only environment.
    #[allow(dead_code)]
    pub fn start_grpc(env: &[(&str, &str)]) -> Self {
        Self::start_binary(grpc_binary(), "grpc", env)
    }

    fn start_binary(binary: &PathBuf, scheme: &str, env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(binary)
            .env_clear()
            .env("BIND", "127.0.0.1:0")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the demo server");
        let mut line = String::new();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut line).unwrap();
        let addr = line
            .strip_prefix(&format!("listening on {scheme}://"))
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| {
                let mut err = String::new();
                let _ = child.stderr.take().unwrap().read_to_string(&mut err);
                panic!("unexpected first line {line:?}, stderr {err:?}")
            })
            .parse()
            .unwrap();
        let (send, lines) = std::sync::mpsc::channel();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        for out in [
            Box::new(stdout) as Box<dyn BufRead + Send>,
            Box::new(stderr),
        ] {
            let send = send.clone();
            std::thread::spawn(move || {
                for line in out.lines().map_while(Result::ok) {
                    let _ = send.send(line);
                }
            });
        }
        DemoServer {
            child,
            addr,
            first_line: line,
            lines: std::sync::Mutex::new(lines),
        }
    }

    /// Waits (up to a minute) for a line the server writes that contains `needle`, and
    /// returns it.
    #[allow(dead_code)]
    pub fn line_with(&self, needle: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.lock().unwrap().recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => panic!("the demo server wrote no line with {needle:?}"),
            }
        }
    }

    /// Sends the server `SIGHUP`.
    #[allow(dead_code)]
    pub fn hangup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -HUP");
    }

    /// GET `path` with extra header lines over a fresh connection: the status and the whole
    /// response, lowercased.
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let response = exchange(self.addr, path, headers);
        let status = response[9..12].parse().unwrap();
        (status, response.to_ascii_lowercase())
    }
}

impl DemoServer {
    /// Sends GET `path` and returns the open connection without reading the answer.
    #[allow(dead_code)]
    pub fn send_only(&self, path: &str) -> TcpStream {
        let mut stream = TcpStream::connect(self.addr).unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).unwrap();
        stream
    }

    /// Kills the server with SIGKILL (`kill -9`): nothing it holds is given back.
    #[allow(dead_code)]
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for DemoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GET `path` from `addr` over a fresh connection, with extra header lines: the whole
/// response.
fn exchange(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> String {
    exchange_as(addr, "GET", path, headers)
}

/// `method` `path` to `addr` over a fresh connection, with extra header lines: the whole
/// response.
fn exchange_as(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> String {
    exchange_with(addr, method, path, headers, "")
}

/// `method` `path` with `body` to `addr` over a fresh connection, with extra header lines:
/// the whole response.
fn exchange_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // The Host a client sends, the address it asked (unless the caller names another).
    let length = body.len();
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {length}\r\n");
    if !headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("host"))
    {
        request.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// `method` `path` to `addr` over a fresh connection: the status and the whole response, as
/// sent.
#[allow(dead_code)]
pub fn request(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    request_with(addr, method, path, &[])
}

/// `method` `path` to `addr` over a fresh connection with extra header lines: the status and
/// the whole response, as sent.
#[allow(dead_code)]
pub fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let response = exchange_as(addr, method, path, headers);
    (response[9..12].parse().unwrap(), response)
}

/// GET `path` from `addr` over a fresh connection, with extra header lines: the status and
/// the body, as sent.
#[allow(dead_code)]
pub fn fetch(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    body_of(&exchange(addr, path, headers))
}

/// POST `body` to `path` of `addr` over a fresh connection, with extra header lines: the
/// status and the body, as sent.
#[allow(dead_code)]
pub fn post(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    body_of(&exchange_with(addr, "POST", path, headers, body))
}

/// The status and the body of `response`, a body sent in chunks joined.
fn body_of(response: &str) -> (u16, String) {
    let status = response[9..12].parse().unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((response, ""));
    // A body sent in chunks: the chunks joined.
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut joined = String::new();
        let mut rest = body;
        while let Some((size, after)) = rest.split_once("\r\n") {
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            if size == 0 {
                break;
            }
            joined.push_str(&after[..size]);
            rest = &after[size + 2..];
        }
        return (status, joined);
    }
    (status, body.to_owned())
}

impl DemoServer {
    /// The address the server answers `/metrics` and `/admin/top` on, from its first line.
    #[allow(dead_code)]
    pub fn admin_addr(&self) -> SocketAddr {
        self.first_line
            .split("admin=http://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|addr| addr.parse().ok())
            .unwrap_or_else(|| panic!("no admin address in {:?}", self.first_line))
    }
}

/// The variables of two servers on `url` under `prefix`.
pub fn shared<'a>(
    url: &'a str,
    prefix: &'a str,
    extra: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("REDIS_URL", url),
        ("PREFIX", prefix),
        ("STORE_TIMEOUT_MS", "10000"),
    ];
    env.extend_from_slice(extra);
    env
}
