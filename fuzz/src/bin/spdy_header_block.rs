//! AFL++ target `spdy_header_block`: the body is `tensile_fuzzing::spdy::header_block` (docs/security.md).
fn main() {
    afl::fuzz!(|data: &[u8]| tensile_fuzzing::spdy::header_block(data));
}
