//! AFL++ target `spdy_streams`: the body is `tensile_fuzzing::spdy::streams` (docs/security.md).
fn main() {
    afl::fuzz!(|data: &[u8]| tensile_fuzzing::spdy::streams(data));
}
