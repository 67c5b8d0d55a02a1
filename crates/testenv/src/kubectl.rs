//! The real `kubectl` against a one-cluster TestEnv (simulator or real control planes), for
//! tests: every failure panics with what the cluster holds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test's failure

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::TestEnv;

/// One cluster and kubectl pointed at it.
#[derive(Debug)]
pub struct Env {
    pub env: TestEnv,
    pub runtime: tokio::runtime::Runtime,
    pub kubeconfig: PathBuf,
}

impl Env {
    pub fn start() -> Self {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let env = runtime.block_on(TestEnv::start(1)).unwrap();
        let kubeconfig = env.clusters[0].kubeconfig.clone();
        Self {
            env,
            runtime,
            kubeconfig,
        }
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("kubectl");
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--request-timeout=20s")
            .args(args);
        c
    }

    pub fn run(&self, args: &[&str], envs: &[(&str, &str)], stdin: Option<&[u8]>) -> Output {
        let mut c = self.cmd(args);
        c.envs(envs.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(bytes) = stdin {
            input.write_all(bytes).unwrap();
        }
        drop(input);
        child.wait_with_output().unwrap()
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args, &[], None);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.state()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// What the cluster holds, for the message of a failed test.
    pub fn state(&self) -> String {
        let out = self.run(
            &[
                "get",
                "nodes,all,pvc,pdb,controllerrevisions,events",
                "-o",
                "wide",
            ],
            &[],
            None,
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits, with a deadline, until `f` holds.
    pub fn until(&self, what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !f() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}\n{}",
                self.state()
            );
            // The sleep is made inside the runtime: a tokio timer needs one to exist.
            self.runtime.block_on(async {
                tokio::time::sleep(Duration::from_millis(200)).await;
            });
        }
    }

    pub fn apply(&self, name: &str, manifest: &str) {
        let file = self.kubeconfig.with_file_name(format!("{name}.yaml"));
        std::fs::write(&file, manifest).unwrap();
        self.ok(&["apply", "-f", file.to_str().unwrap()]);
    }

    pub fn jsonpath(&self, what: &[&str], path: &str) -> String {
        let mut args = vec!["get"];
        args.extend_from_slice(what);
        let path = format!("jsonpath={path}");
        args.extend(["-o", &path]);
        self.ok(&args)
    }
}

/// A kubectl process that is killed when the test ends, pass or fail.
#[derive(Debug)]
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
