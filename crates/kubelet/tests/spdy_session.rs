//! The SPDY server session against an independent test client over in-memory pipes: streams,
//! half-close, resets, pings, GOAWAY, limits, timeouts and garbage.

use std::time::Duration;

use crate::common::spdy_client::{Client, Event};
use crate::common::within;
use bytes::{BufMut, BytesMut};
use proptest::prelude::*;
use tensile_kubelet::spdy::{
    CodecLimits, Frame, GoAwayStatus, Headers, OpenError, RstStatus, Session, SessionConfig,
    SpdyStream,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn pair(config: SessionConfig) -> (Session, Client) {
    let (a, b) = tokio::io::duplex(64 * 1024);
    (Session::server(a, config).unwrap(), Client::new(b))
}

/// Server side: accept every stream and echo it back in upper case, then FIN.
fn serve_echo(mut session: Session) -> tokio::task::JoinHandle<Session> {
    tokio::spawn(async move {
        while let Some(incoming) = session.accept().await {
            let Some(stream) = incoming.accept() else {
                continue;
            };
            tokio::spawn(echo(stream));
        }
        session
    })
}

async fn echo(stream: SpdyStream) {
    let (mut r, mut w) = stream.into_split();
    let mut buf = vec![0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let upper: Vec<u8> = buf[..n].to_ascii_uppercase();
                if w.write_all(&upper).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = w.shutdown().await;
}

fn hdr(kind: &str) -> Headers {
    Headers::new().with("streamtype", kind)
}

#[tokio::test]
async fn stream_roundtrip_with_half_close() {
    let (session, client) = pair(SessionConfig::default());
    let _server = serve_echo(session);
    let mut s = client.open(hdr("data")).await;
    within(5, "reply", s.replied()).await.unwrap();
    s.write(b"hello ").await.unwrap();
    s.write(b"world").await.unwrap();
    s.fin().await.unwrap();
    let got = within(5, "echo", s.read_to_end()).await.unwrap();
    assert_eq!(got, b"HELLO WORLD");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_streams() {
    let (session, client) = pair(SessionConfig::default());
    let _server = serve_echo(session);
    let mut tasks = Vec::new();
    for i in 0..200u32 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = client.open(hdr("data")).await;
            s.replied().await.unwrap();
            let payload: Vec<u8> = (0..(1000 + i * 97))
                .map(|j| b'a' + ((i + j) % 26) as u8)
                .collect();
            for chunk in payload.chunks(3000) {
                s.write(chunk).await.unwrap();
            }
            s.fin().await.unwrap();
            let got = s.read_to_end().await.unwrap();
            assert_eq!(got, payload.to_ascii_uppercase(), "stream {i}");
        }));
    }
    within(60, "200 streams", async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
}

#[tokio::test]
async fn client_reset_fails_server_reads() {
    let (mut session, client) = pair(SessionConfig::default());
    let mut s = client.open(hdr("data")).await;
    let incoming = within(5, "accept", session.accept()).await.unwrap();
    assert_eq!(incoming.headers().get("streamtype"), Some("data"));
    let mut stream = incoming.accept().unwrap();
    s.replied().await.unwrap();
    s.write(b"partial").await.unwrap();
    s.reset().await.unwrap();
    let mut got = Vec::new();
    let err = within(5, "read after reset", stream.read_to_end(&mut got))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
    assert_eq!(got, b"partial");
    // Writes fail too.
    let err = within(5, "write after reset", stream.write_all(b"x"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
}

#[tokio::test]
async fn server_reset_and_refusal_reach_the_client() {
    let (mut session, client) = pair(SessionConfig::default());
    let mut a = client.open(hdr("a")).await;
    let mut b = client.open(hdr("b")).await;
    let mut c = client.open(hdr("c")).await;
    let ia = session.accept().await.unwrap();
    let ib = session.accept().await.unwrap();
    let ic = session.accept().await.unwrap();
    ia.accept().unwrap().reset();
    ib.reject(RstStatus::PROTOCOL_ERROR);
    drop(ic);
    assert_eq!(a.replied().await, Ok(()));
    assert_eq!(a.next_event().await, Some(Event::Reset(RstStatus::CANCEL)));
    assert_eq!(b.replied().await, Err(RstStatus::PROTOCOL_ERROR));
    assert_eq!(c.replied().await, Err(RstStatus::REFUSED_STREAM));
}

#[tokio::test]
async fn dropping_a_stream_sends_fin() {
    let (mut session, client) = pair(SessionConfig::default());
    let mut s = client.open(hdr("x")).await;
    let mut stream = session.accept().await.unwrap().accept().unwrap();
    stream.write_all(b"bye").await.unwrap();
    drop(stream);
    assert_eq!(s.read_to_end().await, Ok(b"bye".to_vec()));
}

#[tokio::test]
async fn pings_from_the_client_are_echoed() {
    let (session, client) = pair(SessionConfig::default());
    let _server = serve_echo(session);
    // Even ids would be answers to server pings; the server sends none and ignores them.
    client.send(Frame::Ping { id: 2 }).await.unwrap();
    client.send(Frame::Ping { id: 1 }).await.unwrap();
    client.send(Frame::Ping { id: 7 }).await.unwrap();
    let state = within(5, "ping replies", client.wait_state(|s| s.pings.len() >= 2)).await;
    assert_eq!(state.pings, [1, 7]);
}

#[tokio::test]
async fn settings_window_updates_and_unknown_frames_are_ignored() {
    let (session, client) = pair(SessionConfig::default());
    let _server = serve_echo(session);
    client
        .send(Frame::Settings {
            clear: false,
            entries: vec![],
        })
        .await
        .unwrap();
    client
        .send(Frame::WindowUpdate {
            stream_id: 1,
            delta: 1000,
        })
        .await
        .unwrap();
    client
        .send(Frame::Unknown {
            kind: 42,
            flags: 0,
            payload: bytes::Bytes::from_static(b"??"),
        })
        .await
        .unwrap();
    let mut s = client.open(hdr("data")).await;
    s.replied().await.unwrap();
    s.write(b"still fine").await.unwrap();
    s.fin().await.unwrap();
    assert_eq!(
        within(5, "echo", s.read_to_end()).await.unwrap(),
        b"STILL FINE"
    );
}

#[tokio::test]
async fn invalid_stream_ids_are_refused() {
    let (session, client) = pair(SessionConfig::default());
    let _server = serve_echo(session);
    let mut even = client.open_with_id(2, hdr("x")).await;
    assert_eq!(even.replied().await, Err(RstStatus::PROTOCOL_ERROR));
    let mut nine = client.open_with_id(9, hdr("x")).await;
    assert_eq!(nine.replied().await, Ok(()));
    let mut five = client.open_with_id(5, hdr("x")).await;
    assert_eq!(five.replied().await, Err(RstStatus::PROTOCOL_ERROR));
}

#[tokio::test]
async fn stream_limit_refuses_extra_streams() {
    let config = SessionConfig {
        max_streams: 2,
        ..SessionConfig::default()
    };
    let (mut session, client) = pair(config);
    let mut a = client.open(hdr("a")).await;
    let mut b = client.open(hdr("b")).await;
    let mut c = client.open(hdr("c")).await;
    let sa = session.accept().await.unwrap().accept().unwrap();
    let _sb = session.accept().await.unwrap().accept().unwrap();
    assert_eq!(a.replied().await, Ok(()));
    assert_eq!(b.replied().await, Ok(()));
    assert_eq!(c.replied().await, Err(RstStatus::REFUSED_STREAM));
    // Closing one stream in both directions frees a slot.
    drop(sa);
    a.fin().await.unwrap();
    assert_eq!(a.read_to_end().await, Ok(vec![]));
    let mut d = client.open(hdr("d")).await;
    let accepted = within(5, "slot freed", session.accept()).await;
    let accepted = accepted.expect("session alive").accept().unwrap();
    assert_eq!(accepted.headers().get("streamtype"), Some("d"));
    assert_eq!(d.replied().await, Ok(()));
}

#[tokio::test]
async fn client_goaway_ends_accept_but_not_open_streams() {
    let (mut session, client) = pair(SessionConfig::default());
    let mut s = client.open(hdr("x")).await;
    let mut stream = session.accept().await.unwrap().accept().unwrap();
    s.replied().await.unwrap();
    client
        .send(Frame::GoAway {
            last_good_stream_id: 0,
            status: GoAwayStatus::OK,
        })
        .await
        .unwrap();
    assert!(within(5, "accept ends", session.accept()).await.is_none());
    s.write(b"after goaway").await.unwrap();
    s.fin().await.unwrap();
    let mut got = Vec::new();
    within(5, "data after goaway", stream.read_to_end(&mut got))
        .await
        .unwrap();
    assert_eq!(got, b"after goaway");
}

#[tokio::test]
async fn graceful_shutdown_says_goaway_and_waits_for_the_peer() {
    let (mut session, client) = pair(SessionConfig::default());
    let mut s = client.open(hdr("x")).await;
    let mut stream = session.accept().await.unwrap().accept().unwrap();
    stream.write_all(b"last words").await.unwrap();
    drop(stream);
    let shutdown = tokio::spawn(session.shutdown(Duration::from_secs(30)));
    assert_eq!(s.read_to_end().await, Ok(b"last words".to_vec()));
    let state = within(5, "goaway", client.wait_state(|s| s.goaway.is_some())).await;
    assert_eq!(state.goaway, Some((1, GoAwayStatus::OK)));
    // New streams after GOAWAY are refused.
    let mut late = client.open(hdr("late")).await;
    assert_eq!(late.replied().await, Err(RstStatus::REFUSED_STREAM));
    client.close().await;
    within(5, "shutdown once the peer closed", shutdown)
        .await
        .unwrap();
    within(5, "transport closed", client.wait_state(|s| s.closed)).await;
}

#[tokio::test(start_paused = true)]
async fn idle_sessions_are_closed() {
    let config = SessionConfig {
        idle_timeout: Some(Duration::from_secs(60)),
        ..Default::default()
    };
    let (session, client) = pair(config);
    tokio::time::sleep(Duration::from_secs(30)).await;
    client.send(Frame::Ping { id: 1 }).await.unwrap();
    tokio::time::sleep(Duration::from_secs(45)).await;
    assert!(!session.is_closed(), "activity 45 s ago must keep it open");
    within(120, "idle close", session.closed()).await;
    within(5, "transport closed", client.wait_state(|s| s.closed)).await;
}

#[tokio::test(start_paused = true)]
async fn unread_streams_push_back_on_the_peer() {
    // A small inbound budget: once the unread stream holds it, the session stops reading.
    let config = SessionConfig {
        inbound_buffer: 64 * 1024,
        limits: CodecLimits {
            max_data_frame: 16 * 1024,
            ..CodecLimits::default()
        },
        ..SessionConfig::default()
    };
    let (mut session, client) = pair(config);
    let mut s = client.open(hdr("x")).await;
    let mut stream = session.accept().await.unwrap().accept().unwrap();
    s.replied().await.unwrap();
    let chunk = vec![7u8; 16 * 1024];
    let total = 2 * 1024 * 1024;
    let writer = {
        let client = client.clone();
        let id = s.id;
        tokio::spawn(async move {
            let mut sent = 0;
            while sent < total {
                client
                    .send(Frame::Data {
                        stream_id: id,
                        fin: false,
                        data: chunk.clone().into(),
                    })
                    .await
                    .unwrap();
                sent += chunk.len();
            }
            client
                .send(Frame::Data {
                    stream_id: id,
                    fin: true,
                    data: Default::default(),
                })
                .await
                .unwrap();
        })
    };
    // The writer cannot finish: 64 KiB budget + 64 KiB pipe is far below 2 MiB. (Paused
    // clock: this sleep only returns once every task is blocked.)
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!writer.is_finished(), "the peer must be held back");
    let mut n = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    within(30, "drain", async {
        loop {
            let k = stream.read(&mut buf).await.unwrap();
            if k == 0 {
                break;
            }
            n += k;
        }
    })
    .await;
    assert_eq!(n, total);
    writer.await.unwrap();
}

async fn expect_protocol_goaway(client: &Client) {
    let state = within(
        10,
        "GOAWAY",
        client.wait_state(|s| s.goaway.is_some() || s.closed),
    )
    .await;
    if let Some((_, status)) = state.goaway {
        assert_eq!(status, GoAwayStatus::PROTOCOL_ERROR);
    }
    within(10, "close", client.wait_state(|s| s.closed)).await;
}

#[tokio::test]
async fn oversized_data_frames_end_the_session() {
    let config = SessionConfig {
        limits: CodecLimits {
            max_data_frame: 1024,
            ..CodecLimits::default()
        },
        ..SessionConfig::default()
    };
    let (session, client) = pair(config);
    let mut header = BytesMut::new();
    header.put_u32(1);
    header.put_u32(1 << 20);
    client.send_raw(&header).await.unwrap();
    expect_protocol_goaway(&client).await;
    within(5, "session closed", session.closed()).await;
}

#[tokio::test]
async fn header_bombs_end_the_session() {
    let config = SessionConfig {
        limits: CodecLimits {
            max_header_block: 8 * 1024,
            ..CodecLimits::default()
        },
        ..SessionConfig::default()
    };
    let (session, client) = pair(config);
    let _s = client
        .open(Headers::new().with("x", "a".repeat(1 << 20)))
        .await;
    expect_protocol_goaway(&client).await;
    within(5, "session closed", session.closed()).await;
}

#[tokio::test]
async fn wrong_version_ends_the_session() {
    let (session, client) = pair(SessionConfig::default());
    let mut raw = BytesMut::new();
    raw.put_u32(0x8002_0006); // SPDY/2 PING
    raw.put_u32(4);
    raw.put_u32(1);
    client.send_raw(&raw).await.unwrap();
    expect_protocol_goaway(&client).await;
    within(5, "session closed", session.closed()).await;
}

#[tokio::test]
async fn ping_floods_from_a_peer_that_never_reads_are_bounded() {
    let config = SessionConfig {
        max_queued_control: 16,
        ..SessionConfig::default()
    };
    // A tiny pipe that the client never reads: replies pile up in the session.
    let (a, b) = tokio::io::duplex(64);
    let session = Session::server(a, config).unwrap();
    let (_r, mut w) = tokio::io::split(b);
    let mut raw = BytesMut::new();
    for i in 0..10_000u32 {
        raw.put_u32(0x8003_0006);
        raw.put_u32(4);
        raw.put_u32(i * 2 + 1);
    }
    // The session gives up on the peer once its replies pile up.
    tokio::spawn(async move {
        let _ = w.write_all(&raw).await;
    });
    within(10, "abusive peer dropped", session.closed()).await;
}

/// Our client session against our server session.
fn client_pair() -> (Session, Session) {
    let (a, b) = tokio::io::duplex(64 * 1024);
    (
        Session::server(a, SessionConfig::default()).unwrap(),
        Session::client(b, SessionConfig::default()).unwrap(),
    )
}

#[tokio::test]
async fn a_client_session_opens_streams_half_closes_and_reads_the_reply() {
    let (server, client) = client_pair();
    let _server = serve_echo(server);
    for i in 0..3 {
        let stream = within(5, "open", client.open(hdr("data"))).await.unwrap();
        assert_eq!(stream.id(), 2 * i + 1, "client streams are odd, increasing");
        let (mut r, mut w) = stream.into_split();
        w.write_all(b"hello").await.unwrap();
        w.shutdown().await.unwrap();
        let mut got = Vec::new();
        within(5, "reply", r.read_to_end(&mut got)).await.unwrap();
        assert_eq!(got, b"HELLO");
    }
}

#[tokio::test]
async fn a_client_session_sees_refusals_and_goaway() {
    let (mut server, client) = client_pair();
    let opening = tokio::spawn(async move {
        let refused = client.open(hdr("refused")).await;
        (client, refused)
    });
    server
        .accept()
        .await
        .unwrap()
        .reject(RstStatus::PROTOCOL_ERROR);
    let (client, refused) = within(5, "refusal", opening).await.unwrap();
    assert!(matches!(refused, Err(OpenError::Refused)), "{refused:?}");
    server.go_away();
    // Once the peer said GOAWAY, nothing more is opened.
    within(5, "goaway seen", async {
        loop {
            match client.open(hdr("late")).await {
                Err(OpenError::Closed) => return,
                Ok(_) => {
                    if let Some(s) = server.accept().await {
                        drop(s);
                    }
                }
                Err(OpenError::Refused) => {}
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await;
}

#[tokio::test]
async fn a_client_session_refuses_streams_the_server_opens() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let _client = Session::client(a, SessionConfig::default()).unwrap();
    let peer = Client::new(b);
    // A server's streams are even.
    let mut pushed = peer.open_with_id(2, hdr("push")).await;
    assert_eq!(
        within(5, "refusal", pushed.replied()).await,
        Err(RstStatus::REFUSED_STREAM)
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Garbage never panics or wedges the server: it ends the session, or (if the garbage
    /// happens to parse) the session stays usable; either way it is decided quickly.
    #[test]
    fn garbage_never_wedges(junk in proptest::collection::vec(any::<u8>(), 1..2048)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (session, client) = pair(SessionConfig::default());
            let server = serve_echo(session);
            client.send_raw(&junk).await.unwrap();
            client.close().await;
            // With our side closed, the server must finish on its own.
            let session = within(10, "server to finish", server).await.unwrap();
            within(10, "session closed", session.closed()).await;
        });
    }
}
