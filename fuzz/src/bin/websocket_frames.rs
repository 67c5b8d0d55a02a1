//! AFL++ target `websocket_frames`: the body is `tensile_fuzzing::websocket::frames` (docs/security.md).
fn main() {
    afl::fuzz!(|data: &[u8]| tensile_fuzzing::websocket::frames(data));
}
