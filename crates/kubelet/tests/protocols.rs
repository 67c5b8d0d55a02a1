//! The remote command and port-forward protocols, driven by test clients over in-memory pipes:
//! the versions and encodings kubectl no longer uses, and the failure paths (timeouts, bad or
//! unexpected streams, backend errors) that real clients do not produce on demand.

use std::sync::Arc;
use std::time::Duration;

use crate::common::backend::FakeBackend;
use crate::common::spdy_client::{Client, Event};
use crate::common::within;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use futures::{SinkExt, StreamExt};
use tensile_kubelet::spdy::{Headers, RstStatus};
use tensile_kubelet::{
    ExecRequest, PodRef, RemoteCommandVersion, StreamError, StreamOptions, StreamingConfig,
    WsEncoding, serve_exec_spdy, serve_exec_websocket, serve_portforward_spdy,
    serve_portforward_tunnel, serve_portforward_websocket,
};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

fn pod() -> PodRef {
    PodRef {
        namespace: "ns1".into(),
        name: "pod1".into(),
        uid: None,
    }
}

fn exec(command: &[&str], options: StreamOptions) -> ExecRequest {
    ExecRequest {
        pod: pod(),
        container: "main".into(),
        command: command.iter().map(|s| s.to_string()).collect(),
        options,
    }
}

fn opts(stdin: bool, stdout: bool, stderr: bool, tty: bool) -> StreamOptions {
    StreamOptions::new(stdin, stdout, stderr, tty).unwrap()
}

fn hdr(kind: &str) -> Headers {
    Headers::new().with("streamType", kind)
}

/// Starts an exec over SPDY; returns the client and the server's result.
fn spdy_exec(
    version: RemoteCommandVersion,
    request: ExecRequest,
    config: StreamingConfig,
) -> (Client, tokio::task::JoinHandle<Result<(), StreamError>>) {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn(async move {
        serve_exec_spdy(a, version, request, FakeBackend::new(), &config).await
    });
    (Client::new(b), server)
}

#[tokio::test]
async fn v4_status_is_json_and_streams_end() {
    let (client, server) = spdy_exec(
        RemoteCommandVersion::V4,
        exec(&["echo", "hi"], opts(false, true, false, false)),
        StreamingConfig::default(),
    );
    let mut error = client.open(hdr("error")).await;
    let mut stdout = client.open(hdr("stdout")).await;
    error.replied().await.unwrap();
    stdout.replied().await.unwrap();
    assert_eq!(
        within(5, "stdout", stdout.read_to_end()).await.unwrap(),
        b"hi\n"
    );
    let status = within(5, "status", error.read_to_end()).await.unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status).unwrap();
    assert_eq!(status["status"], "Success");
    within(5, "GOAWAY", client.wait_state(|s| s.goaway.is_some())).await;
    client.close().await;
    within(5, "server done", server).await.unwrap().unwrap();
}

#[tokio::test]
async fn pre_v4_statuses_are_text_and_only_on_failure() {
    for version in [
        RemoteCommandVersion::V1,
        RemoteCommandVersion::V2,
        RemoteCommandVersion::V3,
    ] {
        for (command, expect) in [(&["exit", "0"][..], ""), (&["exit", "3"][..], "exit")] {
            let (client, server) = spdy_exec(
                version,
                exec(command, opts(false, true, false, false)),
                StreamingConfig::default(),
            );
            let mut error = client.open(hdr("error")).await;
            let mut stdout = client.open(hdr("stdout")).await;
            stdout.replied().await.unwrap();
            assert_eq!(stdout.read_to_end().await.unwrap(), b"");
            let text = String::from_utf8(error.read_to_end().await.unwrap()).unwrap();
            if expect.is_empty() {
                assert_eq!(text, "", "{version:?}");
            } else {
                assert!(
                    text.contains("non-zero exit code") && text.contains('3'),
                    "{text}"
                );
                assert!(!text.starts_with('{'), "{version:?} must not send JSON");
            }
            client.close().await;
            within(5, "server done", server).await.unwrap().unwrap();
        }
    }
}

#[tokio::test]
async fn resize_stream_reaches_the_backend_over_spdy() {
    let (client, _server) = spdy_exec(
        RemoteCommandVersion::V4,
        exec(&["sizes", "2"], opts(false, true, false, true)),
        StreamingConfig::default(),
    );
    let _error = client.open(hdr("error")).await;
    let mut stdout = client.open(hdr("stdout")).await;
    let resize = client.open(hdr("resize")).await;
    // Go's json.Encoder writes one object per write, newline-terminated.
    resize
        .write(b"{\"Width\":80,\"Height\":24}\n")
        .await
        .unwrap();
    resize.write(b"{\"Width\":120,").await.unwrap();
    resize.write(b"\"Height\":40}\n").await.unwrap();
    assert_eq!(
        within(5, "sizes", stdout.read_to_end()).await.unwrap(),
        b"80x24\n120x40\n"
    );
}

#[tokio::test]
async fn unexpected_and_duplicate_streams_are_refused() {
    let (client, _server) = spdy_exec(
        RemoteCommandVersion::V4,
        exec(&["echo", "ok"], opts(false, true, false, false)),
        StreamingConfig::default(),
    );
    let mut bogus = client.open(hdr("bogus")).await;
    let mut stdin = client.open(hdr("stdin")).await; // not requested
    let mut error = client.open(hdr("error")).await;
    let mut error2 = client.open(hdr("error")).await;
    let mut stdout = client.open(hdr("stdout")).await;
    assert_eq!(bogus.replied().await, Err(RstStatus::PROTOCOL_ERROR));
    assert_eq!(stdin.replied().await, Err(RstStatus::PROTOCOL_ERROR));
    assert_eq!(error2.replied().await, Err(RstStatus::PROTOCOL_ERROR));
    assert_eq!(
        within(5, "stdout", stdout.read_to_end()).await.unwrap(),
        b"ok\n"
    );
    let status = error.read_to_end().await.unwrap();
    assert!(String::from_utf8_lossy(&status).contains("Success"));
}

#[tokio::test(start_paused = true)]
async fn missing_streams_time_out() {
    let config = StreamingConfig {
        stream_creation_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let (client, server) = spdy_exec(
        RemoteCommandVersion::V4,
        exec(&["echo", "x"], opts(false, true, false, false)),
        config,
    );
    let mut error = client.open(hdr("error")).await;
    error.replied().await.unwrap();
    // stdout never comes.
    let result = within(60, "creation timeout", server).await.unwrap();
    assert!(
        matches!(result, Err(StreamError::StreamCreationTimeout(_))),
        "{result:?}"
    );
    within(5, "connection closed", client.wait_state(|s| s.closed)).await;
}

#[tokio::test]
async fn client_leaving_cancels_the_command() {
    let backend = FakeBackend::new();
    let (a, b) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn({
        let backend = Arc::clone(&backend);
        async move {
            let request = exec(&["sleep"], opts(false, true, false, false));
            serve_exec_spdy(
                a,
                RemoteCommandVersion::V4,
                request,
                backend,
                &Default::default(),
            )
            .await
        }
    });
    let client = Client::new(b);
    let mut error = client.open(hdr("error")).await;
    let mut stdout = client.open(hdr("stdout")).await;
    error.replied().await.unwrap();
    stdout.replied().await.unwrap();
    client.close().await;
    within(10, "server gives up on a gone client", server)
        .await
        .unwrap()
        .unwrap();
}

/// A WebSocket client over a pipe, the server side served directly (no HTTP handshake).
async fn ws_exec(
    version: RemoteCommandVersion,
    encoding: WsEncoding,
    request: ExecRequest,
) -> WebSocketStream<tokio::io::DuplexStream> {
    let (a, b) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let _ = serve_exec_websocket(
            a,
            version,
            encoding,
            request,
            FakeBackend::new(),
            &Default::default(),
        )
        .await;
    });
    WebSocketStream::from_raw_socket(b, Role::Client, None).await
}

async fn collect(ws: &mut WebSocketStream<tokio::io::DuplexStream>) -> Vec<Message> {
    let mut out = Vec::new();
    while let Some(Ok(m)) = within(5, "message", ws.next()).await {
        if m.is_close() {
            break;
        }
        out.push(m);
    }
    out
}

#[tokio::test]
async fn base64_channels_carry_output_and_status() {
    let mut ws = ws_exec(
        RemoteCommandVersion::V4,
        WsEncoding::Base64,
        exec(&["echo", "hi"], opts(false, true, false, false)),
    )
    .await;
    let msgs = collect(&mut ws).await;
    let texts: Vec<String> = msgs
        .iter()
        .map(|m| m.to_text().unwrap().to_string())
        .collect();
    // The "connected" signal on stdout, the output, the status.
    assert_eq!(texts[0], "1");
    assert_eq!(texts[1], format!("1{}", B64.encode("hi\n")));
    assert!(texts[2].starts_with('3'));
    let status: serde_json::Value =
        serde_json::from_slice(&B64.decode(&texts[2][1..]).unwrap()).unwrap();
    assert_eq!(status["status"], "Success");
}

#[tokio::test]
async fn v1_websocket_channels_send_text_errors() {
    let mut ws = ws_exec(
        RemoteCommandVersion::V1,
        WsEncoding::Binary,
        exec(&["exit", "3"], opts(false, true, false, false)),
    )
    .await;
    let msgs = collect(&mut ws).await;
    let bins: Vec<Vec<u8>> = msgs
        .iter()
        .map(|m| m.clone().into_data().to_vec())
        .collect();
    assert_eq!(bins[0], [1]);
    assert_eq!(bins[1][0], 3);
    let text = String::from_utf8_lossy(&bins[1][1..]);
    assert!(
        text.contains("exit code") && !text.starts_with('{'),
        "{text}"
    );
}

#[tokio::test]
async fn v5_close_ends_stdin_and_other_channels_are_ignored() {
    let mut ws = ws_exec(
        RemoteCommandVersion::V5,
        WsEncoding::Binary,
        exec(&["cat"], opts(true, true, false, false)),
    )
    .await;
    ws.send(Message::binary(b"\x00abc".to_vec())).await.unwrap();
    ws.send(Message::binary(b"\x07ignored".to_vec()))
        .await
        .unwrap();
    ws.send(Message::binary(Vec::new())).await.unwrap();
    ws.send(Message::binary(b"\x00def".to_vec())).await.unwrap();
    ws.send(Message::binary(vec![255, 0])).await.unwrap();
    let msgs = collect(&mut ws).await;
    let mut stdout = Vec::new();
    let mut status = None;
    for m in msgs {
        let d = m.into_data();
        match d.first() {
            Some(1) => stdout.extend_from_slice(&d[1..]),
            Some(3) => status = Some(d[1..].to_vec()),
            _ => {}
        }
    }
    assert_eq!(stdout, b"abcdef");
    assert!(String::from_utf8_lossy(&status.unwrap()).contains("Success"));
}

/// Port-forward over SPDY with the test client.
fn spdy_port_forward(config: StreamingConfig) -> (Client, Arc<FakeBackend>) {
    let (a, b) = tokio::io::duplex(256 * 1024);
    let backend = FakeBackend::new();
    let be = Arc::clone(&backend);
    tokio::spawn(async move {
        let _ = serve_portforward_spdy(a, pod(), be, &config).await;
    });
    (Client::new(b), backend)
}

fn pf(kind: &str, port: &str, id: Option<&str>) -> Headers {
    let mut h = Headers::new().with("streamType", kind).with("port", port);
    if let Some(id) = id {
        h.add("requestID", id);
    }
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairs_in_either_order_and_many_at_once() {
    let (client, _) = spdy_port_forward(StreamingConfig::default());
    let mut tasks = Vec::new();
    for i in 0..50u32 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let id = i.to_string();
            let (mut data, mut error) = if i % 2 == 0 {
                let e = client.open(pf("error", "8080", Some(&id))).await;
                (client.open(pf("data", "8080", Some(&id))).await, e)
            } else {
                let d = client.open(pf("data", "8080", Some(&id))).await;
                (d, client.open(pf("error", "8080", Some(&id))).await)
            };
            data.replied().await.unwrap();
            error.replied().await.unwrap();
            let payload: Vec<u8> = (0..20_000u32).map(|j| (j * 7 + i) as u8).collect();
            for c in payload.chunks(4096) {
                data.write(c).await.unwrap();
            }
            data.fin().await.unwrap();
            assert!(data.read_to_end().await.unwrap() == payload, "pair {i}");
            assert_eq!(error.read_to_end().await.unwrap(), b"", "pair {i}");
        }));
    }
    within(60, "50 forwarded connections", async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
}

/// A client that half-closes its data stream has sent everything; the pod's reply still comes
/// back, until the pod's side closes (port 7070 answers only after its input ended, like
/// `nc -l` or any server that reads a whole request). Over SPDY and over SPDY tunnelled in
/// WebSocket.
#[tokio::test]
async fn a_half_closed_data_stream_still_gets_the_reply() {
    let (spdy, _) = spdy_port_forward(StreamingConfig::default());
    let (a, b) = tokio::io::duplex(256 * 1024);
    tokio::spawn(async move {
        let _ = serve_portforward_tunnel(a, pod(), FakeBackend::new(), &Default::default()).await;
    });
    let ws = WebSocketStream::from_raw_socket(b, Role::Client, None).await;
    let tunnel = Client::new(ws_bytes(ws));
    for (transport, client) in [("SPDY", spdy), ("WebSocket tunnel", tunnel)] {
        for round in 0..3 {
            let id = round.to_string();
            let mut error = client.open(pf("error", "7070", Some(&id))).await;
            let mut data = client.open(pf("data", "7070", Some(&id))).await;
            within(5, "replies", data.replied()).await.unwrap();
            data.write(b"hello\n").await.unwrap();
            data.fin().await.unwrap();
            let got = within(10, "the reply", data.read_to_end()).await.unwrap();
            assert_eq!(
                String::from_utf8_lossy(&got),
                "got 6 bytes: hello\n",
                "{transport}, round {round}"
            );
            within(5, "error stream", error.replied()).await.unwrap();
            assert_eq!(
                within(5, "error stream end", error.read_to_end())
                    .await
                    .unwrap(),
                b"",
                "{transport}, round {round}"
            );
        }
    }
}

/// The bytes of a client WebSocket's binary messages, as a byte stream (what kubectl's
/// tunnelling connection does).
fn ws_bytes(ws: WebSocketStream<tokio::io::DuplexStream>) -> tokio::io::DuplexStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mine, theirs) = tokio::io::duplex(256 * 1024);
    tokio::spawn(async move {
        let (mut sink, mut stream) = ws.split();
        let (mut r, mut w) = tokio::io::split(theirs);
        let up = async move {
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n @ 1..) = r.read(&mut buf).await {
                if sink.send(Message::binary(buf[..n].to_vec())).await.is_err() {
                    return;
                }
            }
            let _ = sink.close().await;
        };
        let down = async move {
            while let Some(Ok(m)) = stream.next().await {
                if let Message::Binary(b) = m
                    && w.write_all(&b).await.is_err()
                {
                    return;
                }
            }
            let _ = w.shutdown().await;
        };
        tokio::join!(up, down);
    });
    mine
}

#[tokio::test]
async fn old_clients_without_request_ids_pair_by_stream_id() {
    let (client, _) = spdy_port_forward(StreamingConfig::default());
    let mut error = client.open(pf("error", "80", None)).await;
    let mut data = client.open(pf("data", "80", None)).await;
    data.replied().await.unwrap();
    data.write(b"legacy").await.unwrap();
    data.fin().await.unwrap();
    assert_eq!(
        within(5, "echo", data.read_to_end()).await.unwrap(),
        b"legacy"
    );
    error.replied().await.unwrap();
    assert_eq!(error.read_to_end().await.unwrap(), b"");
}

#[tokio::test]
async fn bad_port_forward_streams_are_refused() {
    let (client, _) = spdy_port_forward(StreamingConfig::default());
    for h in [
        Headers::new()
            .with("streamtype", "data")
            .with("requestid", "1"),
        pf("data", "0", Some("1")),
        pf("data", "65536", Some("1")),
        pf("data", "http", Some("1")),
        pf("stdin", "80", Some("1")),
    ] {
        let mut s = client.open(h).await;
        assert_eq!(
            within(5, "refusal", s.replied()).await,
            Err(RstStatus::PROTOCOL_ERROR)
        );
    }
}

#[tokio::test]
async fn duplicate_streams_are_reset_and_reported() {
    let (client, _) = spdy_port_forward(StreamingConfig::default());
    let mut error = client.open(pf("error", "80", Some("7"))).await;
    let mut error2 = client.open(pf("error", "80", Some("7"))).await;
    error.replied().await.unwrap();
    error2.replied().await.unwrap();
    assert_eq!(
        within(5, "reset", error2.next_event()).await,
        Some(Event::Reset(RstStatus::CANCEL))
    );
    let Some(Event::Data(msg)) = within(5, "error text", error.next_event()).await else {
        panic!("expected an error message");
    };
    assert!(String::from_utf8_lossy(&msg).contains("error stream already assigned"));
}

#[tokio::test]
async fn backend_failures_are_written_on_the_error_stream() {
    let (client, backend) = spdy_port_forward(StreamingConfig::default());
    let mut error = client.open(pf("error", "9999", Some("1"))).await;
    let mut data = client.open(pf("data", "9999", Some("1"))).await;
    let msg = String::from_utf8(within(5, "error", error.read_to_end()).await.unwrap()).unwrap();
    assert!(
        msg.contains("error forwarding port 9999 to pod pod1") && msg.contains("refused"),
        "{msg}"
    );
    assert_eq!(data.read_to_end().await.unwrap(), b"");
    assert_eq!(
        backend.forwards.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn incomplete_pairs_time_out() {
    let config = StreamingConfig {
        stream_creation_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let (client, backend) = spdy_port_forward(config);
    let mut error = client.open(pf("error", "80", Some("lonely"))).await;
    error.replied().await.unwrap();
    let Some(Event::Data(msg)) = within(60, "timeout message", error.next_event()).await else {
        panic!("expected a message");
    };
    assert!(String::from_utf8_lossy(&msg).contains("timed out waiting for streams"));
    assert_eq!(
        within(5, "reset", error.next_event()).await,
        Some(Event::Reset(RstStatus::CANCEL))
    );
    // The session is still usable.
    let mut e = client.open(pf("error", "80", Some("2"))).await;
    let mut d = client.open(pf("data", "80", Some("2"))).await;
    d.write(b"x").await.unwrap();
    d.fin().await.unwrap();
    assert_eq!(within(5, "echo", d.read_to_end()).await.unwrap(), b"x");
    e.replied().await.unwrap();
    assert_eq!(
        backend.forwards.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
}

#[tokio::test]
async fn base64_port_forward_channels() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let _ = serve_portforward_websocket(
            a,
            WsEncoding::Base64,
            pod(),
            vec![80],
            FakeBackend::new(),
            &Default::default(),
        )
        .await;
    });
    let mut ws = WebSocketStream::from_raw_socket(b, Role::Client, None).await;
    let port = B64.encode(80u16.to_le_bytes());
    let first = within(5, "data prefix", ws.next()).await.unwrap().unwrap();
    let second = within(5, "error prefix", ws.next()).await.unwrap().unwrap();
    assert_eq!(first.to_text().unwrap(), format!("0{port}"));
    assert_eq!(second.to_text().unwrap(), format!("1{port}"));
    ws.send(Message::text(format!("0{}", B64.encode("ping"))))
        .await
        .unwrap();
    let echo = within(5, "echo", ws.next()).await.unwrap().unwrap();
    assert_eq!(echo.to_text().unwrap(), format!("0{}", B64.encode("ping")));
    ws.close(None).await.unwrap();
}

#[tokio::test]
async fn streams_opened_once_running_are_refused() {
    let (client, _server) = spdy_exec(
        RemoteCommandVersion::V4,
        exec(&["cat"], opts(true, true, false, false)),
        StreamingConfig::default(),
    );
    let _error = client.open(hdr("error")).await;
    let stdin = client.open(hdr("stdin")).await;
    let mut stdout = client.open(hdr("stdout")).await;
    stdout.replied().await.unwrap();
    stdin.write(b"a").await.unwrap();
    // The echo proves the command runs, so setup is over.
    assert_eq!(
        within(5, "echo", stdout.next_event()).await,
        Some(Event::Data("a".into()))
    );
    let mut extra = client.open(hdr("stdout")).await;
    assert_eq!(
        within(5, "refusal", extra.replied()).await,
        Err(RstStatus::REFUSED_STREAM)
    );
    stdin.write(b"bc").await.unwrap();
    stdin.fin().await.unwrap();
    assert_eq!(
        within(5, "rest", stdout.read_to_end()).await.unwrap(),
        b"bc"
    );
}
