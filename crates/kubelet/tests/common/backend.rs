//! A fake container runtime: `echo` prints its arguments, `err` prints them to stderr, `exit N`
//! exits with N, `cat` copies stdin to stdout, `sizes` prints terminal sizes as they arrive;
//! port-forward connects to an echo server, except port 9999 which refuses and port 7070, a
//! server that reads until the client half-closes, then answers `got N bytes: <them>` and closes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tensile_kubelet::{
    AttachRequest, BackendError, ExecIo, ExecRequest, ExitStatus, PortForwardRequest,
    PortForwardStream, StreamBackend,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, Default)]
pub struct FakeBackend {
    pub execs: AtomicUsize,
    pub forwards: AtomicUsize,
}

impl FakeBackend {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
}

async fn write_line(w: &mut Option<tensile_kubelet::BoxWriter>, line: String) {
    if let Some(w) = w.as_mut() {
        let _ = w.write_all(line.as_bytes()).await;
    }
}

impl StreamBackend for FakeBackend {
    async fn exec(&self, request: ExecRequest, mut io: ExecIo) -> ExitStatus {
        self.execs.fetch_add(1, Ordering::SeqCst);
        let args = request.command.get(1..).unwrap_or_default().join(" ");
        match request.command.first().map(String::as_str) {
            Some("echo") => {
                write_line(&mut io.stdout, format!("{args}\n")).await;
                ExitStatus::Success
            }
            Some("err") => {
                write_line(&mut io.stderr, format!("{args}\n")).await;
                ExitStatus::Success
            }
            Some("exit") => match args.trim().parse::<i32>() {
                Ok(0) => ExitStatus::Success,
                Ok(n) => ExitStatus::ExitCode(n),
                Err(_) => ExitStatus::Error(format!("bad exit code {args:?}")),
            },
            Some("cat") => {
                let (Some(mut input), Some(mut out)) = (io.stdin.take(), io.stdout.take()) else {
                    return ExitStatus::Error("cat needs stdin and stdout".into());
                };
                match tokio::io::copy(&mut input, &mut out).await {
                    Ok(_) => ExitStatus::Success,
                    Err(e) => ExitStatus::Error(e.to_string()),
                }
            }
            Some("sizes") => {
                let Some(mut sizes) = io.resize.take() else {
                    return ExitStatus::Error("no resize channel".into());
                };
                let want: usize = args.trim().parse().unwrap_or(1);
                for _ in 0..want {
                    let Some(s) = sizes.recv().await else { break };
                    write_line(&mut io.stdout, format!("{}x{}\n", s.width, s.height)).await;
                }
                ExitStatus::Success
            }
            Some("sleep") => {
                std::future::pending::<()>().await;
                ExitStatus::Success
            }
            _ => ExitStatus::Error(format!("unknown command {:?}", request.command)),
        }
    }

    async fn attach(&self, request: AttachRequest, mut io: ExecIo) -> ExitStatus {
        write_line(
            &mut io.stdout,
            format!("attached to {}\n", request.container),
        )
        .await;
        if let (Some(mut input), Some(mut out)) = (io.stdin.take(), io.stdout.take()) {
            let _ = tokio::io::copy(&mut input, &mut out).await;
        }
        ExitStatus::Success
    }

    async fn port_forward(
        &self,
        request: PortForwardRequest,
    ) -> Result<PortForwardStream, BackendError> {
        self.forwards.fetch_add(1, Ordering::SeqCst);
        if request.port == 9999 {
            return Err(BackendError::new("connection refused"));
        }
        if request.port == 7070 {
            let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
            tokio::spawn(async move {
                let mut got = Vec::new();
                if theirs.read_to_end(&mut got).await.is_ok() {
                    let mut reply = format!("got {} bytes: ", got.len()).into_bytes();
                    reply.extend_from_slice(&got);
                    let _ = theirs.write_all(&reply).await;
                }
                let _ = theirs.shutdown().await;
            });
            return Ok(PortForwardStream::new(ours));
        }
        let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match theirs.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if theirs.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = theirs.shutdown().await;
        });
        Ok(PortForwardStream::new(ours))
    }
}

impl tensile_kubelet::KubeletBackend for FakeBackend {
    async fn logs(
        &self,
        pod: tensile_kubelet::PodRef,
        container: String,
        options: tensile_kubelet::LogOptions,
    ) -> Result<tensile_kubelet::LogStream, BackendError> {
        if pod.name != "web" {
            return Err(BackendError::new(format!("pod {} not found", pod.name)));
        }
        let lines = [
            format!("{container} line 1\n"),
            format!("{container} line 2\n"),
        ];
        let skip = options
            .tail_lines
            .map_or(0, |t| lines.len().saturating_sub(t as usize));
        let text: String = lines[skip..].concat();
        Ok(Box::pin(futures::stream::once(async move {
            Ok(bytes::Bytes::from(text))
        })))
    }

    async fn pods(&self) -> Result<Vec<k8s_openapi::api::core::v1::Pod>, BackendError> {
        Ok(vec![
            serde_json::from_value(
                serde_json::json!({"metadata": {"name": "web", "namespace": "default"}}),
            )
            .unwrap(),
        ])
    }

    async fn stats(&self) -> Result<tensile_kubelet::stats::Summary, BackendError> {
        Ok(tensile_kubelet::stats::Summary {
            node: tensile_kubelet::stats::NodeStats {
                node_name: "node-1".into(),
                ..Default::default()
            },
            pods: Vec::new(),
        })
    }
}
