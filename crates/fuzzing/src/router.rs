//! The kubelet API's router: a request head (request line and headers, as a client sends them
//! over the TLS connection) through what `tensile_kubelet::server::handle` reads before it
//! serves anything: the bearer token, the authorization attributes, the route, and the
//! route's query string and upgrade headers.

use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use tensile_kubelet::auth::attributes;
use tensile_kubelet::server::{Prepared, Route, Unrouted, request_bearer, route_request};
use tensile_kubelet::{PortForwardMode, Transport};

/// Most headers hyper reads of a request (its default).
const MAX_HEADERS: usize = 100;

/// The request's method, URI and headers as hyper would hand them to the handler, or `None`
/// where hyper answers 400 itself (not a request head, a method, URI or header it refuses).
fn parse(data: &[u8]) -> Option<(Method, Uri, HeaderMap)> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut slots);
    let httparse::Status::Complete(_) = request.parse(data).ok()? else {
        return None;
    };
    let method = Method::from_bytes(request.method?.as_bytes()).ok()?;
    let uri: Uri = request.path?.parse().ok()?;
    let mut headers = HeaderMap::new();
    for h in request.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).ok()?;
        let value = HeaderValue::from_bytes(h.value).ok()?;
        headers.append(name, value);
    }
    Some((method, uri, headers))
}

fn offered(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_owned())
        .collect()
}

/// Checks a 101 the router would send: the upgrade names the transport, a protocol answered is
/// one the client offered, and a WebSocket answer carries its accept key.
fn check_switch(
    response: &http::Response<()>,
    transport: Transport,
    protocol: Option<&str>,
    headers: &HeaderMap,
) {
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    let upgrade = response.headers().get(header::UPGRADE);
    match transport {
        Transport::Spdy => {
            assert_eq!(upgrade, Some(&HeaderValue::from_static("SPDY/3.1")));
            if let Some(p) = protocol {
                assert!(
                    offered(headers, "x-stream-protocol-version")
                        .iter()
                        .any(|o| o == p),
                    "answered {p:?}, which the client did not offer"
                );
            }
        }
        Transport::WebSocket => {
            assert_eq!(upgrade, Some(&HeaderValue::from_static("websocket")));
            assert!(
                response
                    .headers()
                    .contains_key(header::SEC_WEBSOCKET_ACCEPT),
                "a WebSocket 101 without Sec-WebSocket-Accept"
            );
            if let Some(p) = protocol {
                assert!(
                    offered(headers, "sec-websocket-protocol")
                        .iter()
                        .any(|o| o == p),
                    "answered {p:?}, which the client did not offer"
                );
            }
        }
    }
}

/// One request head through the router.
pub fn request_head(data: &[u8]) {
    let Some((method, uri, headers)) = parse(data) else {
        return;
    };
    let path = uri.path();
    let query = uri.query().unwrap_or_default();
    if let Some(token) = request_bearer(&headers) {
        assert!(
            !token.is_empty() && token.trim() == token,
            "bearer token {token:?}"
        );
    }
    let attrs = attributes(&method, path);
    assert!(
        !attrs.subresources.is_empty(),
        "no subresource to authorize"
    );
    let route = match route_request(&method, path) {
        Ok(route) => route,
        Err(Unrouted::MethodNotAllowed(methods)) => {
            assert!(!methods.contains(&method), "{method} refused but allowed");
            return;
        }
        Err(Unrouted::NotFound) => return,
    };
    match route.prepare(query, &headers) {
        Prepared::Plain => assert!(matches!(
            route,
            Route::Healthz
                | Route::Pods
                | Route::RunningPods
                | Route::StatsSummary
                | Route::MetricsResource
        )),
        Prepared::Logs(Ok(_)) => {}
        Prepared::Logs(Err(e)) => assert!(!e.to_string().is_empty()),
        Prepared::RemoteCommand(Ok(plan)) => {
            if matches!(route, Route::Exec(..)) {
                assert!(!plan.command.is_empty(), "an exec without a command");
            }
            assert!(
                plan.options.stdin || plan.options.stdout || plan.options.stderr,
                "no stream asked for"
            );
            assert!(
                !(plan.options.tty && plan.options.stderr),
                "stderr with a terminal"
            );
            let upgrade = &plan.upgrade;
            check_switch(
                &upgrade.response(),
                upgrade.transport(),
                upgrade.protocol(),
                &headers,
            );
        }
        Prepared::PortForward(Ok((ports, upgrade))) => {
            assert!(!ports.contains(&0), "port 0 accepted");
            let transport = match upgrade.mode() {
                PortForwardMode::Spdy => Transport::Spdy,
                PortForwardMode::WebSocketTunnel => Transport::WebSocket,
                PortForwardMode::WebSocketChannels(_) => {
                    assert!(!ports.is_empty(), "channels without ports");
                    Transport::WebSocket
                }
            };
            check_switch(&upgrade.response(), transport, upgrade.protocol(), &headers);
        }
        Prepared::RemoteCommand(Err(e)) | Prepared::PortForward(Err(e)) => {
            let response = e.response();
            assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        }
    }
}
