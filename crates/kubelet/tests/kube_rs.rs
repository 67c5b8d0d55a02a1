//! Interop with kube-rs' own kubelet client (`kubelet-debug`), which talks WebSocket straight
//! to a kubelet: `v5.channel.k8s.io` for exec/attach, `v4.channel.k8s.io` channels for
//! port-forward. The virtual node reaches lower clusters with this same client stack.

use crate::common::front::Front;
use crate::common::within;
use futures::SinkExt;
use kube::api::{AttachParams, TerminalSize};
use kube::core::kubelet_debug::KubeletDebugParams;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn client(front: &Front) -> kube::Client {
    let mut config = kube::Config::new(front.url().parse().unwrap());
    config.accept_invalid_certs = true;
    kube::Client::try_from(config).unwrap()
}

const POD: KubeletDebugParams<'static> = KubeletDebugParams {
    name: "pod1",
    namespace: "ns1",
    pod_uid: None,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_reports_output_and_status() {
    let front = Front::start().await;
    let client = client(&front);
    let ap = AttachParams::default().stderr(false);
    let mut proc = within(
        30,
        "exec",
        client.kubelet_node_exec(&POD, "main", ["echo", "hi"], &ap),
    )
    .await
    .unwrap();
    let mut out = String::new();
    let mut stdout = proc.stdout().unwrap();
    let status = proc.take_status().unwrap();
    within(30, "stdout", stdout.read_to_string(&mut out))
        .await
        .unwrap();
    assert_eq!(out, "hi\n");
    let status = within(30, "status", status).await.unwrap();
    assert_eq!(status.status.as_deref(), Some("Success"));
    within(30, "join", proc.join()).await.unwrap();
    let served = front.served();
    assert_eq!(served[0].protocol.as_deref(), Some("v5.channel.k8s.io"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_arrive_as_status() {
    let front = Front::start().await;
    let client = client(&front);
    let ap = AttachParams::default().stderr(false);
    let mut proc = client
        .kubelet_node_exec(&POD, "main", ["exit", "3"], &ap)
        .await
        .unwrap();
    let status = within(30, "status", proc.take_status().unwrap())
        .await
        .unwrap();
    assert_eq!(status.status.as_deref(), Some("Failure"));
    assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"));
    // kube-rs hands back the k8s-openapi Status, which a backend can pass straight through.
    assert_eq!(
        tensile_kubelet::ExitStatus::from_status(&status),
        tensile_kubelet::ExitStatus::ExitCode(3)
    );
    let causes = status.details.unwrap().causes.unwrap();
    assert_eq!(causes[0].reason.as_deref(), Some("ExitCode"));
    assert_eq!(causes[0].message.as_deref(), Some("3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_close_signal_ends_input() {
    let front = Front::start().await;
    let client = client(&front);
    let ap = AttachParams::default().stdin(true).stderr(false);
    let mut proc = client
        .kubelet_node_exec(&POD, "main", ["cat"], &ap)
        .await
        .unwrap();
    let mut stdin = proc.stdin().unwrap();
    let mut stdout = proc.stdout().unwrap();
    let status = proc.take_status().unwrap();
    let input: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let expected = input.clone();
    let writer = tokio::spawn(async move {
        stdin.write_all(&input).await.unwrap();
        // v5: dropping stdin sends CLOSE [255, 0]; the server's `cat` then sees EOF.
        stdin.shutdown().await.unwrap();
    });
    let mut got = Vec::new();
    within(30, "echoed stdin", stdout.read_to_end(&mut got))
        .await
        .unwrap();
    writer.await.unwrap();
    assert!(got == expected, "got {} bytes", got.len());
    let status = within(30, "status", status).await.unwrap();
    assert_eq!(status.status.as_deref(), Some("Success"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_resizes_reach_the_backend() {
    let front = Front::start().await;
    let client = client(&front);
    let ap = AttachParams::interactive_tty();
    let mut proc = client
        .kubelet_node_exec(&POD, "main", ["sizes", "2"], &ap)
        .await
        .unwrap();
    let mut sizes = proc.terminal_size().unwrap();
    let mut stdout = proc.stdout().unwrap();
    sizes
        .send(TerminalSize {
            width: 80,
            height: 24,
        })
        .await
        .unwrap();
    sizes
        .send(TerminalSize {
            width: 132,
            height: 43,
        })
        .await
        .unwrap();
    let mut out = String::new();
    within(30, "sizes echoed", stdout.read_to_string(&mut out))
        .await
        .unwrap();
    assert_eq!(out, "80x24\n132x43\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_streams_output() {
    let front = Front::start().await;
    let client = client(&front);
    let ap = AttachParams::default().stdin(false).stderr(false);
    let mut proc = client.kubelet_node_attach(&POD, "main", &ap).await.unwrap();
    let mut out = String::new();
    within(
        30,
        "attach output",
        proc.stdout().unwrap().read_to_string(&mut out),
    )
    .await
    .unwrap();
    assert_eq!(out, "attached to main\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_over_websocket_channels() {
    let front = Front::start().await;
    let client = client(&front);
    let mut pf = within(
        30,
        "portforward",
        client.kubelet_node_portforward(&POD, &[80, 81, 9999]),
    )
    .await
    .unwrap();
    let refused = pf.take_error(9999).unwrap();
    let mut tasks = Vec::new();
    for port in [80u16, 81] {
        let mut stream = pf.take_stream(port).unwrap();
        tasks.push(tokio::spawn(async move {
            let payload: Vec<u8> = (0..100_000u32).map(|i| (i as u16 ^ port) as u8).collect();
            stream.write_all(&payload).await.unwrap();
            let mut got = vec![0u8; payload.len()];
            stream.read_exact(&mut got).await.unwrap();
            assert!(got == payload, "port {port}");
        }));
    }
    within(30, "echo through both ports", async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    let msg = within(30, "error for the refused port", refused)
        .await
        .unwrap();
    assert!(
        msg.contains("error forwarding port 9999") && msg.contains("connection refused"),
        "{msg}"
    );
    let served = front.served();
    assert_eq!(served[0].protocol.as_deref(), Some("v4.channel.k8s.io"));
    pf.abort();
}
