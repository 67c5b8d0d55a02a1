//! The kubelet HTTPS API (port 10250) as a library: routing, TLS, authentication and
//! authorization, container logs, exec/attach/port-forward over SPDY/3.1 and the WebSocket
//! channel protocols, stats summary and resource metrics, generic over a backend trait.
//!
//! Built in issue 4; this crate holds its place in the workspace until then.
#![forbid(unsafe_code)]
