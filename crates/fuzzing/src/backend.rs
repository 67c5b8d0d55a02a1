//! A container runtime that answers at once: exec and attach copy stdin to stdout and end, a
//! port echoes what it is sent. The streaming targets need one to get past the protocol's
//! set-up into the streams themselves.

use bytes::Bytes;
use k8s_openapi::api::core::v1::Pod;
use tensile_kubelet::stats::{NodeStats, Summary};
use tensile_kubelet::{
    AttachRequest, BackendError, ExecIo, ExecRequest, ExitStatus, KubeletBackend, LogOptions,
    LogStream, PodRef, PortForwardRequest, PortForwardStream, StreamBackend, StreamOptions,
};
use tokio::io::AsyncWriteExt;

/// The backend of the streaming targets (and of the capture example's kubelet).
#[derive(Debug, Default)]
pub struct Echo;

async fn echo(mut io: ExecIo) -> ExitStatus {
    // What the client sends is read to its end (bounded by the input), then the streams close.
    if let (Some(mut stdin), Some(stdout)) = (io.stdin.take(), io.stdout.as_mut()) {
        let _ = tokio::io::copy(&mut stdin, stdout).await;
    }
    if let Some(stderr) = io.stderr.as_mut() {
        let _ = stderr.write_all(b"done\n").await;
    }
    if let Some(mut sizes) = io.resize.take() {
        while sizes.try_recv().is_ok() {}
    }
    ExitStatus::ExitCode(3)
}

impl StreamBackend for Echo {
    async fn exec(&self, _request: ExecRequest, io: ExecIo) -> ExitStatus {
        echo(io).await
    }

    async fn attach(&self, _request: AttachRequest, io: ExecIo) -> ExitStatus {
        echo(io).await
    }

    async fn port_forward(
        &self,
        _request: PortForwardRequest,
    ) -> Result<PortForwardStream, BackendError> {
        let (ours, theirs) = tokio::io::duplex(4096);
        tokio::spawn(async move {
            let (mut r, mut w) = tokio::io::split(theirs);
            let _ = tokio::io::copy(&mut r, &mut w).await;
            let _ = w.shutdown().await;
        });
        Ok(PortForwardStream::new(ours))
    }
}

pub(crate) fn pod() -> PodRef {
    PodRef {
        namespace: "ns".into(),
        name: "pod".into(),
        uid: None,
    }
}

pub(crate) fn exec_request(options: StreamOptions) -> ExecRequest {
    ExecRequest {
        pod: pod(),
        container: "c".into(),
        command: vec!["sh".into()],
        options,
    }
}

pub(crate) fn attach_request(options: StreamOptions) -> AttachRequest {
    AttachRequest {
        pod: pod(),
        container: "c".into(),
        options,
    }
}

/// The streams a mode byte asks for (stdin, stdout, stderr, tty; stderr never with a
/// terminal, as the kubelet requires).
pub(crate) fn options(bits: u8) -> StreamOptions {
    let tty = bits & 8 != 0;
    StreamOptions {
        stdin: bits & 1 != 0,
        stdout: bits & 2 != 0 || bits & 7 == 0,
        stderr: bits & 4 != 0 && !tty,
        tty,
    }
}

impl KubeletBackend for Echo {
    async fn logs(
        &self,
        pod: PodRef,
        container: String,
        _options: LogOptions,
    ) -> Result<LogStream, BackendError> {
        let text = format!(
            "{}/{} {container}: line 1\nline 2\n",
            pod.namespace, pod.name
        );
        Ok(Box::pin(futures::stream::once(async move {
            Ok(Bytes::from(text))
        })))
    }

    async fn pods(&self) -> Result<Vec<Pod>, BackendError> {
        Ok(Vec::new())
    }

    async fn stats(&self) -> Result<Summary, BackendError> {
        Ok(Summary {
            node: NodeStats {
                node_name: "capture".into(),
                ..NodeStats::default()
            },
            pods: Vec::new(),
        })
    }
}
