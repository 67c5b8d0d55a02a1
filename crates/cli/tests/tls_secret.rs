//! `--tls-secret` end to end, with the `tensile` binary on a cluster from `TestEnv` (simulated,
//! or real control planes with `TENSILE_K8S_BIN`): two webhook replicas serve one certificate,
//! and a restarted one serves it again and leaves the caBundle as it was while the API server
//! keeps calling it; the extender keeps its CA across restarts (kube-scheduler's `caData` set
//! once) and writes it with `--write-ca`; a Secret of that name that is not ours stops either
//! at start with an error naming it, and is left alone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde_json::{Value, json};
use tensile_testenv::{ClusterSpec, TestEnv};

mod common;
use common::{Killed, kubectl, until};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn(dir: &Path, name: &str, args: &[String]) -> Killed {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    Killed(
        Command::new(env!("CARGO_BIN_EXE_tensile"))
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

fn log(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
}

fn jsonpath(kc: &Path, what: &[&str], path: &str) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let expr = format!("jsonpath={path}");
    args.extend_from_slice(&["-o", &expr]);
    kubectl(kc, &args).1
}

/// A key of Secret `kube-system/name`, decoded.
fn secret_key(kc: &Path, name: &str, key: &str) -> String {
    let escaped = key.replace('.', "\\.");
    let b64 = jsonpath(
        kc,
        &["secret", "-n", "kube-system", name],
        &format!("{{.data.{escaped}}}"),
    );
    String::from_utf8(B64.decode(b64.trim()).unwrap()).unwrap()
}

/// The leaf certificate (DER) that `port` presents to a client trusting `ca_pem`, or why the
/// handshake failed.
fn presented(port: u16, ca_pem: &str) -> Result<Vec<u8>, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(tensile_testenv::presented_certificate(
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        "localhost",
        ca_pem,
    ))
}

fn der(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

fn upper() -> (tokio::runtime::Runtime, TestEnv) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let env = runtime
        .block_on(TestEnv::start_with(vec![ClusterSpec::new("upper", 0)]))
        .unwrap();
    (runtime, env)
}

/// `tensile ARGS` run to its end (within a minute): status and stderr.
fn run_to_exit(args: &[String]) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tensile"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("`tensile {}` did not stop", args.join(" "));
        }
        std::thread::park_timeout(Duration::from_millis(100));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status.success(), err)
}

const WEBHOOK_SECRET: &str = "tensile-webhook-tls";

#[test]
fn webhook_replicas_serve_one_certificate_and_a_restart_leaves_the_ca_bundle_alone() {
    let (_runtime, env) = upper();
    let upper = env.clusters[0].kubeconfig.clone();
    let dir = env.dir().to_path_buf();
    let ports = [free_port(), free_port()];
    // The shipped configuration, calling the first replica.
    let mut config: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/webhook/mutating-webhook-configuration.yaml"
        ))
        .unwrap(),
    )
    .unwrap();
    for hook in config["webhooks"].as_array_mut().unwrap() {
        hook["clientConfig"] = json!({"url": format!("https://127.0.0.1:{}/mutate", ports[0])});
    }
    let file = dir.join("webhook-configuration.json");
    std::fs::write(&file, config.to_string()).unwrap();
    let (ok, _, err) = kubectl(&upper, &["apply", "-f", &file.display().to_string()]);
    assert!(ok, "{err}");
    let webhook = |port: u16, name: &str| {
        spawn(
            &dir,
            name,
            &[
                "webhook".into(),
                "--address=127.0.0.1".into(),
                format!("--port={port}"),
                "--webhook-configuration=tensile-webhook".into(),
                format!("--tls-secret=kube-system/{WEBHOOK_SECRET}"),
                format!("--kubeconfig={}", upper.display()),
            ],
        )
    };
    // Started together: one creates the Secret, the other reads it.
    let a = webhook(ports[0], "webhook-a");
    let _b = webhook(ports[1], "webhook-b");
    for name in ["webhook-a", "webhook-b"] {
        until(&format!("{name} serving"), || {
            log(&dir, name).contains("webhook serving")
        });
    }
    let ca = secret_key(&upper, WEBHOOK_SECRET, "ca.crt");
    let leaf = der(&secret_key(&upper, WEBHOOK_SECRET, "tls.crt"));
    let configuration = ["mutatingwebhookconfiguration", "tensile-webhook"];
    let bundle = jsonpath(
        &upper,
        &configuration,
        "{.webhooks[0].clientConfig.caBundle}",
    );
    assert_eq!(B64.decode(&bundle).unwrap(), ca.as_bytes());
    for port in ports {
        assert_eq!(presented(port, &ca).unwrap(), leaf, "port {port}");
    }
    let version = jsonpath(&upper, &configuration, "{.metadata.resourceVersion}");
    let virtual_pod = |name: &str| {
        kubectl(
            &upper,
            &[
                "run",
                name,
                "--image=nginx:1.27",
                "--labels=virtual-pod=true",
            ],
        )
    };
    let (ok, _, err) = virtual_pod("before");
    assert!(ok, "the API server calls the webhook it trusts: {err}");

    drop(a);
    let _a = webhook(ports[0], "webhook-a-again");
    until("the restarted webhook serving", || {
        log(&dir, "webhook-a-again").contains("webhook serving")
    });
    assert_eq!(presented(ports[0], &ca).unwrap(), leaf);
    assert_eq!(
        jsonpath(&upper, &configuration, "{.metadata.resourceVersion}"),
        version,
        "the caBundle was not written again"
    );
    let (ok, _, err) = virtual_pod("after");
    assert!(ok, "the restarted webhook is trusted: {err}");
}

#[test]
fn the_extender_keeps_its_ca_across_restarts_and_writes_it_for_kube_scheduler() {
    let (_runtime, env) = upper();
    let upper = env.clusters[0].kubeconfig.clone();
    let dir = env.dir().to_path_buf();
    let extender = |port: u16, name: &str| {
        spawn(
            &dir,
            name,
            &[
                "scheduler".into(),
                "--address=127.0.0.1".into(),
                format!("--port={port}"),
                "--tls-secret=kube-system/tensile-scheduler-tls".into(),
                format!("--write-ca={}", dir.join(format!("{name}.pem")).display()),
                format!("--kubeconfig={}", upper.display()),
                // Any cluster will do as a lower one here.
                format!("--cluster=lower-1={}", upper.display()),
            ],
        )
    };
    let first = free_port();
    let a = extender(first, "first");
    until("the first extender's CA file", || {
        dir.join("first.pem").exists()
    });
    let ca = std::fs::read_to_string(dir.join("first.pem")).unwrap();
    assert_eq!(ca, secret_key(&upper, "tensile-scheduler-tls", "ca.crt"));
    let leaf = der(&secret_key(&upper, "tensile-scheduler-tls", "tls.crt"));
    until("the first extender serving", || {
        presented(first, &ca).is_ok()
    });
    assert_eq!(presented(first, &ca).unwrap(), leaf);
    drop(a);

    let second = free_port();
    let _b = extender(second, "second");
    until("the second extender serving", || {
        presented(second, &ca).is_ok()
    });
    assert_eq!(presented(second, &ca).unwrap(), leaf);
    assert_eq!(
        std::fs::read_to_string(dir.join("second.pem")).unwrap(),
        ca,
        "the caData kube-scheduler was given stays valid"
    );
}

#[test]
fn a_secret_that_is_not_ours_stops_the_start_with_its_name() {
    let (_runtime, env) = upper();
    let upper = env.clusters[0].kubeconfig.clone();
    let (ok, _, err) = kubectl(
        &upper,
        &[
            "create",
            "secret",
            "generic",
            "someone-elses",
            "-n",
            "kube-system",
            "--from-literal=tls.crt=theirs",
        ],
    );
    assert!(ok, "{err}");
    let version = jsonpath(
        &upper,
        &["secret", "-n", "kube-system", "someone-elses"],
        "{.metadata.resourceVersion}",
    );
    let kubeconfig = format!("--kubeconfig={}", upper.display());
    let secret = "--tls-secret=kube-system/someone-elses".to_owned();
    for args in [
        vec![
            "webhook".to_owned(),
            "--address=127.0.0.1".into(),
            format!("--port={}", free_port()),
            secret.clone(),
            kubeconfig.clone(),
        ],
        vec![
            "scheduler".to_owned(),
            "--address=127.0.0.1".into(),
            format!("--port={}", free_port()),
            secret.clone(),
            kubeconfig.clone(),
            format!("--cluster=lower-1={}", upper.display()),
        ],
    ] {
        let (ok, err) = run_to_exit(&args);
        assert!(!ok, "{err}");
        assert!(
            err.contains(
                "Secret kube-system/someone-elses is not ours (it has no label tensile-kube.io/owner)"
            ),
            "{err}"
        );
    }
    assert_eq!(
        jsonpath(
            &upper,
            &["secret", "-n", "kube-system", "someone-elses"],
            "{.metadata.resourceVersion}",
        ),
        version,
        "left alone"
    );
}
