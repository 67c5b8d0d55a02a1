//! Helpers of the end-to-end tests of the `tensile` binary.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // test code; not every test uses all

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed (and reaped) on drop.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Killed {
    /// Stops the process as Ctrl-C does (SIGINT), giving it `within` to clean up (a
    /// `tensile up --k8s-bin` stops its control planes), then kills it.
    pub fn interrupt(mut self, within: Duration) {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-INT", &pid]).status();
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Spawns `command` with its stdout and stderr collected, line by line, as they come.
pub fn spawn_collecting(
    command: &mut Command,
) -> (Killed, std::sync::Arc<std::sync::Mutex<String>>) {
    use std::io::BufRead as _;
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    for stream in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let out = out.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stream)
                .lines()
                .map_while(Result::ok)
            {
                let mut o = out.lock().unwrap();
                o.push_str(&line);
                o.push('\n');
            }
        });
    }
    (Killed(child), out)
}

pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--request-timeout=20s")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn until(what: &str, f: impl FnMut() -> bool) {
    until_within(Duration::from_secs(60), what, f);
}

/// [`until`], with another deadline (real control planes start in seconds alone, in a minute
/// or more beside other tests on two cores).
pub fn until_within(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::park_timeout(Duration::from_millis(200));
    }
}

/// `kubectl port-forward TARGET :PORT` from `kubeconfig` with `env` set, running; the local
/// port it listens on.
pub fn port_forward(
    kubeconfig: &Path,
    target: &str,
    port: u16,
    env: &[(&str, &str)],
) -> (Killed, u16) {
    let mut pf = Killed(
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["port-forward", target, &format!(":{port}")])
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let local = tensile_testenv::forwarded_port(pf.0.stdout.take().unwrap()).unwrap();
    (pf, local)
}

/// `kubectl port-forward TARGET :PORT` from `kubeconfig`, then bytes sent through it come back
/// (the simulated containers echo on their declared ports).
pub fn port_forward_echo(kubeconfig: &Path, target: &str, port: u16) {
    let (_pf, local) = port_forward(kubeconfig, target, port, &[]);
    let mut s = std::net::TcpStream::connect(("127.0.0.1", local)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"hello through two clusters").unwrap();
    let mut got = vec![0u8; 26];
    s.read_exact(&mut got).unwrap();
    assert_eq!(got, b"hello through two clusters");
}
