//! The fuzz targets' bodies: one function per parser of bytes that come from outside (a
//! client of the kubelet API, the API server calling the webhook or the extender, a tenant's
//! annotations and quantities, a lower cluster). Each takes the fuzzer's input, runs it through
//! the product's own code, and panics when a property that must hold does not (a decoded
//! header block larger than its limit, a patch that does not apply to the pod it was made
//! for, a canonical quantity that does not parse back). A panic anywhere is a finding.
//!
//! Two callers, the same functions: the AFL++ binaries of the separate workspace `fuzz/` (one
//! per target, `cargo afl`), and `tests/replay.rs`, which runs every file of
//! `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/` through them in the ordinary test
//! run (docs/security.md, "Fuzzing"). This crate never depends on `afl`.

pub mod admission;
pub mod annotations;
pub mod backend;
pub mod extender;
pub mod quantity;
pub mod router;
pub mod spdy;
pub mod websocket;

/// One fuzz target: its name (the binary in `fuzz/`, the folder of its corpus) and its body.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// Name of the binary and of its corpus folder.
    pub name: &'static str,
    /// Runs one input.
    pub run: fn(&[u8]),
}

/// Every target, in the order docs/security.md lists them.
pub const TARGETS: &[Target] = &[
    Target {
        name: "spdy_frames",
        run: spdy::frames,
    },
    Target {
        name: "spdy_header_block",
        run: spdy::header_block,
    },
    Target {
        name: "spdy_streams",
        run: spdy::streams,
    },
    Target {
        name: "websocket_frames",
        run: websocket::frames,
    },
    Target {
        name: "websocket_streams",
        run: websocket::streams,
    },
    Target {
        name: "resize",
        run: spdy::resize,
    },
    Target {
        name: "kubelet_router",
        run: router::request_head,
    },
    Target {
        name: "admission_review",
        run: admission::review,
    },
    Target {
        name: "extender_args",
        run: extender::calls,
    },
    Target {
        name: "cluster_selector",
        run: annotations::cluster_selector,
    },
    Target {
        name: "annotations",
        run: annotations::others,
    },
    Target {
        name: "quantity",
        run: quantity::quantity,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().copied().find(|t| t.name == name)
}

/// A single-threaded runtime whose clock only moves when every task waits, so the
/// protocol's timeouts (stream creation, close grace, idle) pass at once and an input runs in
/// microseconds; a task that waits on nothing at all shows as a hang.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => unreachable_runtime(&e),
    }
}

#[allow(
    clippy::panic,
    reason = "a fuzz target has no caller to return the error to"
)]
fn unreachable_runtime(e: &std::io::Error) -> ! {
    panic!("a current-thread runtime could not be built: {e}")
}

/// Reports a property that does not hold: a fuzz target says so by panicking.
#[allow(
    clippy::panic,
    reason = "a fuzz target reports a failed property by panicking"
)]
pub(crate) fn fail(what: &str) -> ! {
    panic!("{what}")
}
