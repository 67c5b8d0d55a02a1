//! AFL++ target `spdy_frames`: the body is `tensile_fuzzing::spdy::frames` (docs/security.md).
fn main() {
    afl::fuzz!(|data: &[u8]| tensile_fuzzing::spdy::frames(data));
}
