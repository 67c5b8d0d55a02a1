//! The WebSocket channel protocols (`channel.k8s.io` v1 to v5, `base64.channel.k8s.io`,
//! port-forward's channels and its SPDY tunnel) as the kubelet reads them from a client.

use std::io::{Cursor, Read, Write};
use std::sync::Arc;

use tensile_kubelet::websocket::{Inbound, inbound, server_config};
use tensile_kubelet::{RemoteCommandVersion, StreamingConfig, WsEncoding};
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket};
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

use crate::backend::{self, Echo};
use crate::spdy::serve_connection;

/// A client connection whose bytes are the input; what the server writes is dropped.
#[derive(Debug)]
struct Wire<'a>(Cursor<&'a [u8]>);

impl Read for Wire<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Wire<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn encoding(bit: bool) -> WsEncoding {
    if bit {
        WsEncoding::Base64
    } else {
        WsEncoding::Binary
    }
}

/// Frames a client sends after the upgrade, read with the kubelet's limits, and what each
/// message means to a channel connection (first byte: the encoding and whether v5's CLOSE is
/// on). No message is larger than the limit; a channel's data is never empty and, in binary
/// messages, is the message less its channel byte.
pub fn frames(data: &[u8]) {
    let Some((&mode, wire)) = data.split_first() else {
        return;
    };
    let encoding = encoding(mode & 1 != 0);
    let v5_close = mode & 2 != 0;
    let config = StreamingConfig::default();
    let mut ws = WebSocket::from_raw_socket(
        Wire(Cursor::new(wire)),
        Role::Server,
        Some(server_config(&config)),
    );
    while let Ok(message) = ws.read() {
        let size = message.len();
        assert!(
            size <= config.websocket_max_message,
            "a message of {size} bytes passed the limit of {}",
            config.websocket_max_message
        );
        let binary = matches!(message, Message::Binary(_));
        let text: Option<Utf8Bytes> = match &message {
            Message::Text(t) => Some(t.clone()),
            _ => None,
        };
        match inbound(message, encoding, v5_close) {
            Inbound::Data(ch, payload) => {
                assert!(!payload.is_empty(), "empty data was delivered");
                assert!(
                    !(v5_close && ch == 255),
                    "v5's CLOSE channel was delivered as data"
                );
                match encoding {
                    WsEncoding::Binary => {
                        assert!(binary, "a text message was read as binary channel data");
                        assert_eq!(payload.len() + 1, size, "binary channel data lost bytes");
                    }
                    WsEncoding::Base64 => {
                        let text = text.unwrap_or_default();
                        assert!(
                            payload.len() <= text.len() * 3 / 4,
                            "base64 decoded to more than it can hold"
                        );
                    }
                }
            }
            Inbound::Close(_) => assert!(v5_close, "a CLOSE was read without v5"),
            Inbound::Ignored => {}
        }
    }
}

fn version(selector: u8) -> RemoteCommandVersion {
    match selector % 5 {
        0 => RemoteCommandVersion::V1,
        1 => RemoteCommandVersion::V2,
        2 => RemoteCommandVersion::V3,
        3 => RemoteCommandVersion::V4,
        _ => RemoteCommandVersion::V5,
    }
}

/// A whole WebSocket connection after the upgrade: the first byte picks exec, attach,
/// port-forward over channels or port-forward's SPDY tunnel, the encoding and the protocol
/// version; the second the streams asked for; the rest is what the client sends. The kubelet's
/// own serve functions run it with a backend that echoes.
pub fn streams(data: &[u8]) {
    let [kind, bits, wire @ ..] = data else {
        return;
    };
    let config = StreamingConfig::default();
    let options = backend::options(*bits);
    let encoding = encoding(kind & 4 != 0);
    let version = version(kind >> 3);
    match kind % 4 {
        0 => serve_connection(wire, |io| async move {
            let _ = tensile_kubelet::serve_exec_websocket(
                io,
                version,
                encoding,
                backend::exec_request(options),
                Arc::new(Echo),
                &config,
            )
            .await;
        }),
        1 => serve_connection(wire, |io| async move {
            let _ = tensile_kubelet::serve_attach_websocket(
                io,
                version,
                encoding,
                backend::attach_request(options),
                Arc::new(Echo),
                &config,
            )
            .await;
        }),
        2 => {
            // One or two ports, as the query named them.
            let ports = if bits & 16 != 0 {
                vec![8080, 9090]
            } else {
                vec![8080]
            };
            serve_connection(wire, |io| async move {
                let _ = tensile_kubelet::serve_portforward_websocket(
                    io,
                    encoding,
                    backend::pod(),
                    ports,
                    Arc::new(Echo),
                    &config,
                )
                .await;
            });
        }
        _ => serve_connection(wire, |io| async move {
            let _ = tensile_kubelet::serve_portforward_tunnel(
                io,
                backend::pod(),
                Arc::new(Echo),
                &config,
            )
            .await;
        }),
    }
}
