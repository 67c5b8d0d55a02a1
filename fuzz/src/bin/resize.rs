//! AFL++ target `resize`: the body is `tensile_fuzzing::spdy::resize` (docs/security.md).
fn main() {
    afl::fuzz!(|data: &[u8]| tensile_fuzzing::spdy::resize(data));
}
