//! AFL++ target `kubelet_router`: the body is `tensile_fuzzing::router::request_head` (docs/security.md).
fn main() {
    afl::fuzz!(|data: &[u8]| tensile_fuzzing::router::request_head(data));
}
