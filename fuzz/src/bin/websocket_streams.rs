//! AFL++ target `websocket_streams`: the body is `tensile_fuzzing::websocket::streams` (docs/security.md).
fn main() {
    afl::fuzz!(|data: &[u8]| tensile_fuzzing::websocket::streams(data));
}
